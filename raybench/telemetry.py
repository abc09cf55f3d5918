"""GPU telemetry during the measured window: an NVML sampler and the figures it yields.

Owns finding the NVML device a rank really uses (CUDA_VISIBLE_DEVICES renumbers devices, so the
match is by UUID), sampling it at about 10 Hz on a background thread while the window runs, and
turning a recorded sample stream into per-trial figures (pure: `aggregate`). Without NVML (no
driver, as on CPU machines) `open_sampler` says so once in the log and returns None; nothing
fails and the columns stay empty.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
INTERVAL_S = 0.1
# NVML's utilisation is the busy fraction over the driver's last sample period (1/6 s to 1 s
# by product), recent GPUs report power as a 1 s average, and the energy counter did not move
# over a 76 ms window on an H100 (docs/results/2026-11-23_h100): shorter windows would give
# 0% busy and 0 J for a GPU that was working. Below this, those figures stay empty.
MIN_WINDOW_S = 1.0

# nvmlClocksThrottleReasons bits that mean the GPU ran slower than it could (idle, application
# clock settings, sync boost and display clocks are not throttling).
THROTTLE_BITS = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
    0x40: "hw_thermal", 0x80: "hw_power_brake",
}
# The software power cap is how a loaded GPU runs by design (an H100 at full tilt holds its
# power limit by lowering clocks): information about the row, shown with the window's power and
# SM clock, not a fault. Thermal and hardware slowdowns are faults of the machine, not of the
# configuration, and make a row untrustworthy.
POWER_CAP = "sw_power_cap"
_warned = False


def open_sampler(device_index: int) -> NvmlSampler | None:
    """A sampler for torch's CUDA device `device_index`, or None (logged once) without NVML."""
    global _warned
    try:
        import pynvml  # NVML and torch: on a GPU rank only
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"  # NVML's spelling
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return NvmlSampler(pynvml, handle, uuid)
    except Exception as e:  # no driver, no library, an old driver without some call
        if not _warned:
            log.info("GPU telemetry off: NVML unavailable (%s: %s)", type(e).__name__, e)
            _warned = True
        return None


class NvmlSampler:
    """Samples one GPU on a daemon thread between start() and stop()."""

    def __init__(self, nvml: Any, handle: Any, uuid: str | None = None,
                 interval_s: float = INTERVAL_S):
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self.uuid = uuid  # ranks sharing a GPU sample the same one: count it once
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.samples.append(self._sample())  # the window's last instant
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            self._stop.wait(self.interval_s)

    def _sample(self) -> dict[str, Any]:
        n, h = self.nvml, self.handle
        out: dict[str, Any] = {"t": time.monotonic()}
        for key, read in (
            ("util_pct", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu),
            ("mem_used_mb", lambda: n.nvmlDeviceGetMemoryInfo(h).used / 2**20),
            ("power_w", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000),
            ("energy_mj", lambda: n.nvmlDeviceGetTotalEnergyConsumption(h)),
            ("temp_c", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            ("sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            ("throttle_mask", lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        ):
            try:
                out[key] = read()
            except Exception:  # a field this GPU or driver does not report
                out[key] = None
        return out


def aggregate(samples: list[dict[str, Any]], samples_processed: int,
              uuid: str | None = None) -> dict[str, Any]:
    """Per-trial figures from one GPU's sample stream (pure).

    Energy: the difference of the GPU's energy counter where it has one, else the power
    readings integrated over time (trapezoids). Throttled: any sample with a slowdown bit
    (thermal, hardware); the power cap is counted apart, as the share of samples at it.
    Utilisation, power and energy need a window of MIN_WINDOW_S; temperature, clock and
    throttling are instantaneous and kept for any window."""
    if len(samples) < 2:
        return {}
    t = np.array([s["t"] for s in samples], dtype=float)
    window_s = float(t[-1] - t[0])
    averaged = window_s >= MIN_WINDOW_S
    util = _series(samples, "util_pct") if averaged else None
    power = _series(samples, "power_w") if averaged else None
    energy_mj = _series(samples, "energy_mj") if averaged else None
    if energy_mj is not None:
        energy_j = (energy_mj[-1] - energy_mj[0]) / 1000
    elif power is not None:
        energy_j = float(np.sum((power[1:] + power[:-1]) / 2 * np.diff(t)))
    else:
        energy_j = None
    masks = [int(s.get("throttle_mask") or 0) for s in samples]
    mask = 0
    for m in masks:
        mask |= m
    reasons = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    cap_bit = next(bit for bit, name in THROTTLE_BITS.items() if name == POWER_CAP)
    temp = _series(samples, "temp_c")
    clock = _series(samples, "sm_clock_mhz")
    return {
        "util_mean_pct": float(util.mean()) if util is not None else None,
        "util_max_pct": float(util.max()) if util is not None else None,
        "power_mean_w": float(power.mean()) if power is not None else None,
        "energy_j": energy_j,
        "energy_per_sample_j": energy_j / samples_processed if energy_j and samples_processed
        else None,
        "temp_max_c": float(temp.max()) if temp is not None else None,
        "sm_clock_mean_mhz": float(clock.mean()) if clock is not None else None,
        "throttled": any(r != POWER_CAP for r in reasons),
        "throttle_reasons": ",".join(reasons),
        "power_capped_pct": 100.0 * sum(bool(m & cap_bit) for m in masks) / len(masks),
        "samples": len(samples),
        "window_s": window_s,
        "uuid": uuid,
    }


def _series(samples: list[dict[str, Any]], key: str) -> np.ndarray | None:
    values = [s.get(key) for s in samples]
    if any(v is None for v in values):
        return None
    return np.asarray(values, dtype=float)

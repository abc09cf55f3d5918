"""The sampler's figures on recorded streams, and the path without NVML (this machine)."""

from __future__ import annotations

import logging

import pytest
import torch

from raybench import telemetry
from raybench.metrics.gpu import gpu_telemetry
from tests.test_metrics import record


def stream(n=11, dt=0.1, power=300.0, energy=True, mask=0, util=80):
    return [{"t": i * dt, "util_pct": util + (i % 2) * 10, "mem_used_mb": 1000.0,
             "power_w": power, "energy_mj": (1_000_000 + i * dt * power * 1000) if energy
             else None, "temp_c": 60 + i, "sm_clock_mhz": 1800, "throttle_mask": mask}
            for i in range(n)]


def test_means_and_energy_from_the_counter():
    g = telemetry.aggregate(stream(), samples_processed=100)
    assert g["util_mean_pct"] == pytest.approx(80 + 50 / 11)
    assert g["util_max_pct"] == 90
    assert g["power_mean_w"] == pytest.approx(300.0)
    assert g["energy_j"] == pytest.approx(300.0)  # 300 W for 1 s
    assert g["energy_per_sample_j"] == pytest.approx(3.0)
    assert g["temp_max_c"] == 70 and g["throttled"] is False


def test_energy_integrated_from_power_without_a_counter():
    samples = stream(energy=False)
    for i, s in enumerate(samples):
        s["power_w"] = 100.0 + 100.0 * i  # linear ramp 100 -> 1100 W over 1 s
    g = telemetry.aggregate(samples, samples_processed=10)
    assert g["energy_j"] == pytest.approx(600.0)  # trapezoids are exact on a ramp


def test_throttle_flags_and_reasons():
    samples = stream()
    samples[3]["throttle_mask"] = 0x4 | 0x1  # power cap (and idle, which is not throttling)
    samples[7]["throttle_mask"] = 0x40
    g = telemetry.aggregate(samples, 10)
    assert g["throttled"] is True and g["throttle_reasons"] == "sw_power_cap,hw_thermal"
    idle_only = stream(mask=0x1)
    assert telemetry.aggregate(idle_only, 10)["throttled"] is False


def test_the_power_cap_is_counted_not_a_slowdown():
    # A loaded H100 holds its power limit by design: 4 of 11 samples at the cap.
    samples = stream()
    for i in (2, 3, 4, 8):
        samples[i]["throttle_mask"] = 0x4
    g = telemetry.aggregate(samples, 10)
    assert g["throttled"] is False and g["throttle_reasons"] == "sw_power_cap"
    assert g["power_capped_pct"] == pytest.approx(100 * 4 / 11)
    assert g["power_mean_w"] == pytest.approx(300.0) and g["sm_clock_mean_mhz"] == 1800
    assert telemetry.aggregate(stream(), 10)["power_capped_pct"] == 0


def test_a_window_shorter_than_nvml_averages_leaves_util_power_energy_empty():
    # Recorded on an H100: a 76 ms window of 50 CUDA-graph forwards, both samples stale.
    short = [{"t": 47.9305, "util_pct": 0, "mem_used_mb": 1960.8, "power_w": 121.2,
              "energy_mj": 4009133, "temp_c": 33, "sm_clock_mhz": 1980, "throttle_mask": 0x4},
             {"t": 48.0065, "util_pct": 0, "mem_used_mb": 1960.8, "power_w": 121.2,
              "energy_mj": 4009133, "temp_c": 33, "sm_clock_mhz": 1980, "throttle_mask": 0}]
    g = telemetry.aggregate(short, samples_processed=50)
    assert g["util_mean_pct"] is None and g["power_mean_w"] is None and g["energy_j"] is None
    assert g["energy_per_sample_j"] is None
    assert g["temp_max_c"] == 33 and g["sm_clock_mean_mhz"] == 1980
    assert g["throttle_reasons"] == "sw_power_cap" and g["window_s"] == pytest.approx(0.076)
    just_long_enough = telemetry.aggregate(stream(n=11, dt=0.1), 100)  # 1.0 s
    assert just_long_enough["util_mean_pct"] is not None


def test_ranks_combined_in_metrics():
    a, b = record(0, 0.1), record(1, 0.1)
    a["gpu"] = telemetry.aggregate(stream(power=300.0), 320)
    b["gpu"] = telemetry.aggregate(stream(power=200.0, mask=0x8), 320)
    m = gpu_telemetry([a, b])
    assert m["gpu/power_mean_w"] == pytest.approx(250.0)
    assert m["gpu/energy_j"] == pytest.approx(500.0)
    assert m["gpu/energy_per_sample_j"] == pytest.approx(500.0 / 640)
    assert m["gpu/throttled"] is True and m["gpu/throttle_reasons"] == "hw_slowdown"
    b["gpu"] = telemetry.aggregate(stream(power=200.0, mask=0x4), 320)
    m = gpu_telemetry([a, b])
    assert m["gpu/throttled"] is False and m["gpu/power_capped_pct"] == 100.0
    assert gpu_telemetry([record(0, 0.1)])["gpu/util_mean_pct"] is None


def test_no_nvml_here_gives_none_and_one_log_line(caplog):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU and NVML")
    telemetry._warned = False
    with caplog.at_level(logging.INFO, logger="raybench.telemetry"):
        assert telemetry.open_sampler(0) is None
        assert telemetry.open_sampler(0) is None
    lines = [r for r in caplog.records if "GPU telemetry off" in r.message]
    assert len(lines) == 1

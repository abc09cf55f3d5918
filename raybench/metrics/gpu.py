"""A trial's GPU telemetry columns (`gpu/*`): every rank's NVML figures combined.

Owns how ranks combine (means of means, maxima, energy summed) and the columns' declarations.
Pure; the sampling itself is telemetry.py's. CPU rows get the same columns, empty.
"""

from __future__ import annotations

import statistics
from typing import Any

from raybench.columns import Metric, declare
from raybench.records import RankRecord

declare(
    Metric("gpu/util_mean_pct", "%", "NVML GPU utilisation over the window, mean of ranks"),
    Metric("gpu/util_max_pct", "%", "highest utilisation sample of any rank"),
    Metric("gpu/power_mean_w", "W", "board power over the window, mean of ranks"),
    Metric("gpu/energy_j", "J", "energy over the window, summed over the GPUs (each once, "
           "however many ranks share it)"),
    Metric("gpu/energy_per_sample_j", "J", "energy per sample trained or served"),
    Metric("gpu/temp_max_c", "C", "hottest GPU temperature seen"),
    Metric("gpu/sm_clock_mean_mhz", "MHz", "SM clock over the window, mean of ranks"),
    Metric("gpu/throttled", "bool", "a thermal or hardware slowdown during the window (the "
           "row is invalid)"),
    Metric("gpu/power_capped_pct", "%", "share of samples at the power cap (a note)"),
    Metric("gpu/throttle_reasons", "text", "NVML's throttle reasons seen, comma-separated"),
)


def gpu_telemetry(records: list[RankRecord] | list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's GPU figures combined: means of means, maxima, energy summed; empty columns
    (None) where no rank had telemetry, so CPU rows keep the same schema."""
    records = [RankRecord.of(r) for r in records]
    gpus = [r.gpu for r in records if r.gpu]

    def pick(key: str, how) -> float | None:
        vals = [g[key] for g in gpus if g.get(key) is not None]
        return float(how(vals)) if vals else None

    # ranks that share a GPU (hardware.ranks_per_gpu) each sampled the whole device: its
    # energy counts once, or two ranks on one GPU would report twice the joules
    one_per_gpu = list({g.get("uuid") or i: g for i, g in enumerate(gpus)}.values())
    energies = [g["energy_j"] for g in one_per_gpu if g.get("energy_j") is not None]
    energy = float(sum(energies)) if energies else None
    samples = sum(r.samples_per_step * len(r.compute_s) for r in records)
    return {
        "gpu/util_mean_pct": pick("util_mean_pct", statistics.mean),
        "gpu/util_max_pct": pick("util_max_pct", max),
        "gpu/power_mean_w": pick("power_mean_w", statistics.mean),
        "gpu/energy_j": energy,
        "gpu/energy_per_sample_j": energy / samples if energy and len(gpus) == len(records)
        else None,
        "gpu/temp_max_c": pick("temp_max_c", max),
        "gpu/sm_clock_mean_mhz": pick("sm_clock_mean_mhz", statistics.mean),
        "gpu/throttled": any(g["throttled"] for g in gpus) if gpus else None,
        "gpu/power_capped_pct": pick("power_capped_pct", max),
        "gpu/throttle_reasons": ",".join(sorted({x for g in gpus for x in
                                                 g["throttle_reasons"].split(",") if x})) or None,
    }


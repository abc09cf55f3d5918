"""Epochs: a workload that trains whole passes over its dataset, evaluated after each.

The timed loop (loop.py) hands an `EpochWorkload` here: every step of every epoch is timed
(but the first epoch's warmup steps), each epoch is one window, and `end_epoch` (evaluation)
runs outside the timing; rank 0 appends each epoch to the trial's `metrics_epoch.jsonl` as it
ends.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from raybench.clock import StepClock
from raybench.context import WorkerContext
from raybench.workloads import EpochWorkload


def run_epochs(workload: EpochWorkload, ctx: WorkerContext, clock: StepClock, warmup: int,
               step: Callable[[], tuple[float, float, Any]]) -> dict[str, Any]:
    """Every epoch of an epoch-based workload: each epoch is one window (the first one without
    its `warmup` steps, which train but are not measured), then `end_epoch` outside the timing.
    `step`: the loop's one step, the device synchronised around its data and its compute."""
    epochs = workload.params.epochs
    steps = workload.epoch_steps()
    if steps <= warmup:
        raise ValueError(f"an epoch has {steps} steps per rank, not more than warmup_steps "
                         f"({warmup}): lower measure.warmup_steps or batch_size, or add data")
    out: dict[str, Any] = {"wait_s": [], "compute_s": [], "windows_s": [], "loss": None,
                           "window_steps": [], "warm": [], "epochs": []}
    for e in range(epochs):
        ctx.barrier()
        start = window_start = time.perf_counter()
        for i in range(steps):
            w, c, out["loss"] = step()
            if e == 0 and i < warmup:
                out["warm"].append((w, c, out["loss"]))
                clock.clear()
                window_start = time.perf_counter()
                continue
            out["wait_s"].append(w)
            out["compute_s"].append(c)
        end = time.perf_counter()
        out["windows_s"].append(end - window_start)
        out["window_steps"].append(steps - (warmup if e == 0 else 0))
        scores = workload.end_epoch(e)
        out["epochs"].append({"epoch": e + 1, "train_s": end - start,
                              "eval_s": time.perf_counter() - end,
                              "loss": float(out["loss"].float().item()), **scores})
        _log_epoch(ctx, out["epochs"][-1], out["window_steps"][-1]
                   * workload.samples_per_step() / out["windows_s"][-1])
    return out


def _log_epoch(ctx: WorkerContext, epoch: dict[str, Any], samples_per_s: float) -> None:
    """Rank 0 appends the epoch to `<trial dir>/metrics_epoch.jsonl` as it ends (the training
    suite's per-run log): a run cut short keeps the epochs it finished."""
    if ctx.rank != 0 or not ctx.artifact_dir:
        return
    path = Path(ctx.artifact_dir) / "metrics_epoch.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"epoch": epoch["epoch"], "time": datetime.now(timezone.utc).isoformat(),
            "world_size": ctx.world_size, "rank0_samples_per_s": samples_per_s,
            **{k: v for k, v in epoch.items() if k != "epoch"}}
    line = {k: None if isinstance(v, float) and not math.isfinite(v) else v  # JSON has no nan
            for k, v in line.items()}
    with path.open("a") as f:
        f.write(json.dumps(line, default=float) + "\n")

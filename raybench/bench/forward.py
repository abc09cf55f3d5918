"""`bench forward-check`: a forward-only trial's forward time against torch.utils.benchmark's.

raybench's timed loop and PyTorch's own Timer (`blocked_autorange`, which synchronises CUDA
itself) on the same model, input, precision and device: a check of the loop's timing, for the
workloads whose step is one forward (`Workload.forward_only`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.benchmark as benchmark

from raybench import workloads
from raybench.context import WorkerContext
from raybench.runners.local import run_local
from raybench.trials import TrialSpec


def forward_check(trial: TrialSpec) -> dict[str, Any]:
    """raybench's forward time for a forward-only trial (`Workload.forward_only`: `vit_tiles`
    in inference) against `torch.utils.benchmark.Timer` on the same model, input, precision
    and device."""
    cls = workloads.get(trial.workload_name)
    if not cls.forward_only(trial.workload):
        raise ValueError(f"forward-check compares forward-only trials; trial {trial.index} "
                         f"({trial.workload_name}) trains")
    out = run_local(trial)
    if not out.ok:
        raise RuntimeError(f"trial failed: {out.error}")
    hw = trial.hardware
    device = torch.device("cuda", 0) if hw.use_gpu else torch.device("cpu")
    ctx = WorkerContext.single(hw, device)
    ctx.set_math_mode()
    workload = cls(trial.workload, ctx)
    workload.setup()
    forward = workload.forward_probe()
    assert forward is not None, f"{trial.workload_name} is forward-only but has no probe"

    for _ in range(trial.measure.warmup_steps):
        forward()
    timer = benchmark.Timer(stmt="forward()", globals={"forward": forward},
                            num_threads=torch.get_num_threads())
    measured = timer.blocked_autorange(min_run_time=2.0)  # Timer synchronises CUDA itself
    ours = out.metrics["train/forward_mean_ms"]
    ours_p50 = out.metrics["train/forward_p50_ms"]
    reference = measured.median * 1e3  # the median of block means: robust to host hiccups
    return {"config": trial.overrides, "raybench_forward_ms": ours,
            "raybench_forward_p50_ms": ours_p50, "timer_forward_ms": reference,
            "ratio": ours / reference, "ratio_p50": ours_p50 / reference,
            "timer_runs": len(measured.times), "device": str(device)}

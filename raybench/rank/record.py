"""A rank's record of a measured trial: the timed loop's figures and the facts beside them.

Owns what a `RankRecord` holds besides the step times the loop measured: where the rank ran
(host, node, device, the network NCCL chose), its memory figures (read before anything
unmeasured runs), the model's size, the host figures of its windows, GPU telemetry, the
profiled steps' trace and the FLOP count for MFU. The loop (loop.py) decides what was measured.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import torch

from raybench import fabric
from raybench.context import WorkerContext
from raybench.memory import peak_rss_mb
from raybench.records import RankRecord
from raybench.telemetry import aggregate
from raybench.trials import TrialSpec
from raybench.workloads import Workload

log = logging.getLogger(__name__)


def rank_record(trial: TrialSpec, ctx: WorkerContext, workload: Workload, run: dict[str, Any],
                stamps: dict[str, float]) -> RankRecord:
    """The record from `run` (what measure_rank gathered: step times, windows, phases, own
    compute, memory, host figures, telemetry, trace)."""
    model = workload.model
    size_b = sum(p.numel() * p.element_size() for p in model.parameters())
    size_b += sum(b.numel() * b.element_size() for b in model.buffers())
    warm, compute_s, loss = run["warm"], run["compute_s"], run["loss"]
    return RankRecord(
        workload=trial.workload_name,
        rank=ctx.rank,
        local_rank=ctx.local_rank,
        node_rank=ctx.node_rank,
        hostname=socket.gethostname(),
        node_id=ctx.node_id or socket.gethostname(),
        node_ip=ctx.node_ip,
        accelerator_ids=ctx.accelerator_ids,
        nccl_net=nccl_network(ctx),
        pid=os.getpid(),
        device=str(ctx.device),
        device_name=torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu",
        steps_per_window=run["window_steps"][0],
        window_steps=run["window_steps"],
        warmup_windows=run.get("warmup_windows", 0),
        epochs=run.get("epochs"),
        samples_per_step=workload.samples_per_step(),
        warmup_s=[w + c for w, c, _ in warm],
        wait_s=run["wait_s"],
        compute_s=compute_s,
        windows_s=run["windows_s"],
        phase_s=run["phase_s"],
        own_s=run["own_s"],
        setup_s=run["setup_s"],
        loss_final=None if loss is None else float(loss.float().item()),
        params=sum(p.numel() for p in model.parameters()),
        model_size_mb=size_b / 2**20,
        **run["memory"],
        describe=workload.describe(),
        precision=trial.hardware.precision,
        ranks_per_gpu=trial.hardware.ranks_per_gpu,
        **run["usage"],
        heap=run["heap"], niceness=os.nice(0),
        telemetry=run["telemetry"],
        trace=run["trace"],
        gpu=aggregate(run["telemetry"], workload.samples_per_step() * len(compute_s),
                      run["uuid"]),
        flops_per_sample=flops(workload) if ctx.rank == 0 else None,
        stamps={**stamps, "record_end": time.time()},
    )


def nccl_network(ctx: WorkerContext) -> str | None:
    """The network NCCL chose, from this rank's NCCL debug file (removed once read)."""
    if not (ctx.is_cuda and ctx.distributed):
        return None
    net = fabric.read_network()
    path = fabric.own_log()
    if path is not None:
        path.unlink(missing_ok=True)
    return net


def flops(workload: Workload) -> float | None:
    """FLOPs per sample for MFU, counted once after the windows; None if it cannot be."""
    try:
        return workload.flops_per_sample()
    except Exception as e:  # an op the counter cannot trace: MFU stays unknown, not wrong
        log.info("FLOP count unavailable (%s: %s)", type(e).__name__, e)
        return None


def memory(ctx: WorkerContext) -> dict[str, float | None]:
    """Peak and current memory of the rank: its process's RSS, and on a GPU what the caching
    allocator holds and held at most."""
    out = {"rss_peak_mb": peak_rss_mb(), "peak_allocated_mb": None, "peak_reserved_mb": None,
           "allocated_mb": None, "reserved_mb": None}
    if ctx.is_cuda:
        out["allocated_mb"] = torch.cuda.memory_allocated(ctx.device) / 2**20
        out["reserved_mb"] = torch.cuda.memory_reserved(ctx.device) / 2**20
        out["peak_allocated_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
        out["peak_reserved_mb"] = torch.cuda.max_memory_reserved(ctx.device) / 2**20
    return out

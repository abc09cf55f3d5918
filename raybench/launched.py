"""A rank started by a launcher that sets torchrun's variables, without Ray: the local runner's
spawned ranks and torchrun's. The process group and the context come from those variables
(`WorkerContext.from_env`), the trial runs through the timed loop (worker.run_worker), and rank
0 writes every rank's records as JSON for the runner that started it. Ray's ranks start in
rank.py, through Ray Train's process group (process_group.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from raybench.context import WorkerContext
from raybench.trials import TrialSpec, artifact_dir, trace_path
from raybench.worker import run_worker


def run_rank(trial: TrialSpec, trace_dir: str | None, result: Path,
             stamps: dict[str, float]) -> None:
    """This rank's part of the trial; rank 0 writes the records to `result`."""
    dist.init_process_group(trial.hardware.backend)  # env:// from the launcher's variables
    try:
        ctx = WorkerContext.from_env(trial.hardware, trace_path=trace_path(trace_dir, trial),
                                     artifact_dir=artifact_dir(trace_dir, trial), stamps=stamps)
        records = run_worker(trial, ctx)
        if ctx.rank == 0:
            result.write_text(json.dumps([r.to_dict() for r in records]))
        # Rank 0 hosts the group's store: a rank that tears its group down after rank 0 has
        # exited aborted ("terminate called without an active exception", seen under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()

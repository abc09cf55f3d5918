"""One trial on Ray Train: a TorchTrainer (DDP over fresh workers), its outcome as row fields.

Owns the Ray Train V2 driver pattern (this runs inside a Tune function trial), the settings that
keep a trial from hanging (no controller retries, a short worker-group start deadline) and the
classification of failures into `oom | error | timeout | infeasible`. Does not own the Tune grid
(sweep.py) or the timed loop (worker.py).
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
from ray.train.torch import TorchConfig, TorchTrainer

from raybench import metrics
from raybench.context import WorkerContext
from raybench.grid import TrialSpec
from raybench.worker import run_worker

log = logging.getLogger(__name__)

# Read by the Train controller, which inherits them from this process (ENV_VARS_TO_PROPAGATE).
# The health-check poll is also how fast the end of a run is noticed: the 2 s default adds
# seconds to every trial. Preemption watching is for spot instances, not benchmark nodes.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}
OOM_MARKERS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory",
               "OutOfMemory", "Cannot allocate memory")


def train_loop(config: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Runs on every Ray Train worker; rank 0's return value carries all ranks' records."""
    trial = TrialSpec.from_dict(config["trial"])
    tctx = ray.train.get_context()
    ctx = WorkerContext(
        rank=tctx.get_world_rank(), local_rank=tctx.get_local_rank(),
        world_size=tctx.get_world_size(), node_rank=tctx.get_node_rank(),
        device=ray.train.torch.get_device(), hardware=trial.hardware,
    )
    return run_worker(trial, ctx)


def run_trial(trial: TrialSpec, storage: Path, start_timeout_s: float) -> dict[str, Any]:
    """Fit one TorchTrainer; returns {status, error, metrics, ranks, records}, never raises."""
    os.environ.update(TRAIN_ENV)
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(start_timeout_s)
    hw = trial.hardware
    res = trial.resources()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"trial": trial.to_dict()},
        torch_config=TorchConfig(backend="nccl" if hw.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=hw.world_size, use_gpu=hw.use_gpu, resources_per_worker=res["per_worker"],
        ),
        run_config=ray.train.RunConfig(
            name=f"trial_{trial.index:04d}_{trial.key}",
            storage_path=str(storage),
            # A worker group that cannot be placed must fail once, not be retried forever
            # (controller_failure_limit defaults to -1 in Ray 2.60).
            failure_config=ray.train.FailureConfig(max_failures=0, controller_failure_limit=0),
        ),
    )
    try:
        result = trainer.fit()
    except Exception as e:  # a failed trial is a row, never a lost sweep
        return failure(e, res)
    records = result.return_value
    if not records:
        return {"status": "error", "error": "rank 0 returned no measurements", "metrics": {}}
    return {
        "status": "ok", "error": None, "metrics": metrics.summarize(records),
        "ranks": metrics.per_rank_table(records), "records": records,
    }


def failure(exc: BaseException, resources: dict[str, Any]) -> dict[str, Any]:
    text = _describe(exc)
    status = classify(exc, text)
    if status == "infeasible":
        text = f"worker group could not be placed (wanted {resources}): {text}"
    log.warning("trial failed (%s): %s", status, text.splitlines()[0] if text else "")
    return {"status": status, "error": text[-4000:], "metrics": {}}


def classify(exc: BaseException, text: str) -> str:
    names = {type(e).__name__ for e in _chain(exc)}
    if any(m in text for m in OOM_MARKERS) or names & {"OutOfMemoryError", "MemoryError"}:
        return "oom"
    if "WorkerGroupStartupTimeoutError" in text or "WorkerGroupStartupTimeoutError" in names:
        return "infeasible"
    if "TimeoutError" in names:
        return "timeout"
    return "error"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    stack = [exc]
    while stack and len(seen) < 20:
        e = stack.pop()
        if e is None or e in seen:
            continue
        seen.append(e)
        stack += [e.__cause__, e.__context__]
        stack += list(getattr(e, "worker_failures", {}).values())
        stack.append(getattr(e, "controller_failure", None))
    return seen


def _describe(exc: BaseException) -> str:
    parts = [f"{type(e).__name__}: {e}" for e in _chain(exc)]
    text = "\n".join(parts)
    return text if text.strip() else "".join(traceback.format_exception(exc))

"""One trial on Ray Train: a TorchTrainer (DDP over fresh workers), its outcome as row fields.

Owns the Ray Train V2 driver pattern (this runs inside a Tune function trial), the settings that
keep a trial from hanging (no controller retries, a short worker-group start deadline, a
wall-clock watchdog in every worker), and the retry of a trial whose worker process died. Ray
Train's own `max_failures` is kept at 0: its policy retries any worker-group error, a Python
exception or an out-of-memory included, and a benchmark must not rerun those. Does not own the
Tune grid (sweep.py) or the timed loop (worker.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from ray.train.torch import TorchConfig, TorchTrainer

from raybench import fabric, metrics, workloads
from raybench.columns import Metric, declare
from raybench.context import WorkerContext, process_start
from raybench.failures import failure
from raybench.grid import TrialSpec, artifact_dir, trace_path
from raybench.metrics import overhead
from raybench.plan import NODE_TOKEN
from raybench.records import RankRecord, TrialOutcome, now
from raybench.sections import ExecutionSpec
from raybench.worker import run_worker

# Read by the Train controller, which inherits them from this process (ENV_VARS_TO_PROPAGATE).
# The health-check poll is also how fast the end of a run is noticed: the 2 s default adds
# seconds to every trial. Preemption watching is for spot instances, not benchmark nodes.
log = logging.getLogger(__name__)

# When this module was first imported in this process: on a Ray Train worker, the end of the
# imports its train function needs (ray.train, torch, raybench), for the fixed-cost breakdown.
IMPORTED_AT = time.time()

declare(
    Metric("trial/retries", "count", "attempts lost to a dead worker and retried"),
    Metric("trial/retry_reasons", "text", "why each lost attempt ended"),
    Metric("cluster/placement_strategy", "text", "the worker group's placement strategy"),
    Metric("cluster/concurrency", "text", "execution.concurrency"),
    Metric("train/checkpoint", "text", "where Ray Train kept rank 0's checkpoint"),
)

TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}


def train_loop(config: dict[str, Any]) -> list[RankRecord] | None:
    """Runs on every Ray Train worker; rank 0's return value carries all ranks' records."""
    entry = time.time()
    trial: TrialSpec = config["trial"]  # validated once, at expansion; pickled, not re-read
    if config.get("cwd") and os.path.isdir(config["cwd"]):
        # relative paths in a sweep (data, chip caches) mean the sweep's directory, not the
        # trial directory Tune may have moved this process tree into
        os.chdir(config["cwd"])
    tctx = ray.train.get_context()
    rt = ray.get_runtime_context()
    logical = config.get("logical_gpus", False)
    ctx = WorkerContext(
        rank=tctx.get_world_rank(), local_rank=tctx.get_local_rank(),
        world_size=tctx.get_world_size(), node_rank=tctx.get_node_rank(),
        device=torch.device("cpu") if logical else ray.train.torch.get_device(),
        hardware=trial.hardware,
        node_id=rt.get_node_id(), node_ip=ray.util.get_node_ip_address(),
        accelerator_ids=[str(g) for g in rt.get_accelerator_ids().get("GPU", [])],
        trace_path=trace_path(config["trace_dir"], trial),
        artifact_dir=artifact_dir(config["trace_dir"], trial),
        stamps={"process_start": process_start(), "imported": IMPORTED_AT, "loop_entry": entry},
    )
    watchdog = _watchdog(config.get("timeout_s"))
    try:
        records = run_worker(trial, ctx)
    finally:
        if watchdog:
            watchdog.cancel()
    if workloads.get(trial.workload_name).saves_checkpoint(trial.workload):
        # Every rank reports exactly once (a rank that skipped it would hang the group), after
        # the timed run; rank 0 hands over the best epoch's weights as a Ray Train checkpoint.
        folder = Path(ctx.artifact_dir or "") / "checkpoint"
        keep = ctx.rank == 0 and ctx.artifact_dir is not None and folder.is_dir()
        ray.train.report({"checkpointed": keep},
                         checkpoint=ray.train.Checkpoint.from_directory(str(folder)) if keep
                         else None)
    if records:  # rank 0: when its part ended, for the teardown that follows
        records[0].stamps["loop_exit"] = time.time()
    return records


def _watchdog(limit_s: float | None) -> threading.Timer | None:
    """End this worker process when the trial's time is up.

    A rank stuck in a collective or a long kernel cannot be interrupted from Python, so the
    process exits; the driver sees the attempt outlive its limit and records a timeout."""
    if not limit_s:
        return None

    def expire() -> None:
        print(f"raybench: trial past execution.trial_timeout_s={limit_s:g} s, ending this "
              "worker", file=sys.stderr, flush=True)
        os._exit(124)  # timeout(1)'s code; nothing else may run, a hung thread included

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def tune_entry(config: dict[str, Any], trials: list[TrialSpec], storage: str,
               trials_dir: str, execution: ExecutionSpec, cwd: str,
               strategies: dict[str, str]) -> None:
    """One Tune function trial: run its TrialSpec and report the outcome to the driver.

    It lives here, beside the trial it runs, not beside the Tune grid (runners/on_ray.py):
    Tune's trial process imports the module of its function, and this one holds only what a
    trial needs (the grid's module brings the results table and the report)."""
    from ray import tune

    entry, start = time.time(), now()
    trial = trials[config["trial"]]
    outcome = run_trial(trial, storage, trials_dir, execution, cwd, strategies[trial.key],
                        trial_start=entry)
    outcome.start_time, outcome.end_time = start, now()
    tune.report({"raybench_outcome": json.dumps(outcome.to_dict())})


def _worker_env(trial: TrialSpec, execution: ExecutionSpec) -> dict[str, str]:
    """The workers' environment: NCCL's debug file where ranks talk over NCCL (to read back
    which network it chose), then the trial's own `hardware.env`, which wins."""
    hw = trial.hardware
    nccl = hw.use_gpu and hw.world_size > 1 and not execution.logical_gpus
    return {**(fabric.debug_env(trial.key) if nccl else {}), **hw.env}


def run_trial(trial: TrialSpec, storage: str, trials_dir: str, execution: ExecutionSpec,
              cwd: str | None = None, strategy: str = "PACK",
              trial_start: float | None = None) -> TrialOutcome:
    """Fit one trial; a worker process that died is retried up to `execution.max_retries` times
    on fresh workers. Returns {status, error, metrics, ...} with `trial/retries`, never raises."""
    lost: list[str] = []
    while True:
        start = time.monotonic()
        out = _attempt(trial, storage, trials_dir, execution, cwd, strategy, len(lost))
        elapsed = time.monotonic() - start
        limit = execution.trial_timeout_s
        if out.status in ("lost", "error") and limit and elapsed >= limit:
            out = TrialOutcome.failed(
                "timeout", f"ran past execution.trial_timeout_s={limit:g} s (stopped after "
                f"{elapsed:.0f} s)\n{out.error}")
        if out.status == "lost" and len(lost) < execution.max_retries:
            # two lines: a controller's error says what failed on its second
            lost.append(" ".join((out.error or "").splitlines()[:2])[:300])
            log.warning("trial %d (%s) lost a worker; retry %d of %d on fresh workers",
                        trial.index, trial.key, len(lost), execution.max_retries)
            continue
        if trial_start is not None:  # a retried trial's fixed cost includes its lost attempts
            out.stamps["trial_start"] = trial_start
        if out.ok:
            out.metrics.update(overhead.fixed_cost(out.records, out.stamps))
        out.metrics["trial/retries"] = len(lost)
        if lost:
            out.metrics["trial/retry_reasons"] = " | ".join(lost)
        return out


def _attempt(trial: TrialSpec, storage: str, trials_dir: str, execution: ExecutionSpec,
              cwd: str | None, strategy: str, attempt: int) -> TrialOutcome:
    """Fit one TorchTrainer; returns {status, error, metrics, ranks, records}, never raises.
    `storage` is Ray Train's storage path (a local folder or a URI), `trials_dir` where rank 0
    writes traces and artefacts (on its own node), `strategy` the placement (plan.strategy)."""
    for key, value in TRAIN_ENV.items():
        os.environ.setdefault(key, value)  # a user's own setting wins
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(execution.start_timeout_s)
    hw = trial.hardware
    res = trial.resources()
    per_worker = dict(res["per_worker"])
    if execution.concurrency == "per_node":
        # the workers of a trial share one node's token between them, so no other trial's
        # workers can join that node (shares rounded down: Ray counts resources in 1e-4 units)
        per_worker[NODE_TOKEN] = int(10_000 / hw.world_size) / 10_000
    fit_start = time.time()
    trainer = TorchTrainer(
        train_loop,
        # traces and artefacts land beside the trial JSONs, on rank 0's node
        train_loop_config={"trial": trial, "trace_dir": trials_dir,
                           "cwd": cwd, "logical_gpus": execution.logical_gpus,
                           "timeout_s": execution.trial_timeout_s},
        torch_config=TorchConfig(
            backend="nccl" if hw.use_gpu and not execution.logical_gpus else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=hw.world_size, use_gpu=hw.use_gpu, resources_per_worker=per_worker,
            placement_strategy=strategy,
        ),
        run_config=ray.train.RunConfig(
            # an attempt never finds an earlier attempt's run state under the same name
            name=f"trial_{trial.index:04d}_{trial.key}" + (f"_retry{attempt}" if attempt else ""),
            storage_path=storage,
            # A worker group that cannot be placed must fail once, not be retried forever
            # (controller_failure_limit defaults to -1 in Ray 2.60).
            failure_config=ray.train.FailureConfig(max_failures=0, controller_failure_limit=0),
            # set as the worker processes start, before CUDA or NCCL read them
            worker_runtime_env={"env_vars": _worker_env(trial, execution)},
        ),
    )
    try:
        result = trainer.fit()
    except Exception as e:  # a failed trial is a row, never a lost sweep
        return failure(e, res)
    fit_end = time.time()
    out = metrics.outcome(result.return_value)
    out.stamps = {"fit_start": fit_start, "fit_end": fit_end}
    if out.ok:
        out.metrics["cluster/placement_strategy"] = strategy
        out.metrics["cluster/concurrency"] = execution.concurrency
        if result.checkpoint is not None:
            out.metrics["train/checkpoint"] = result.checkpoint.path
    return out

"""One Ray Train run of a worker group's trials: how it is built and named.

Owns the settings that keep a run from hanging (the controller's environment, no retries, a
short worker-group start deadline), its scaling and placement (per-worker resources, a node's
token under `per_node` concurrency), the workers' environment (NCCL's debug file, the trial's
`hardware.env`), the rank side it runs (ranks.RayRanks over raybench's torch.distributed
backend, process_group.py: what `TorchTrainer` runs, without torch in this process), the run's
name and where its checkpoint is. Followed by trial.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ray
import ray.train

from raybench import fabric
from raybench.rank.entry import run_trials
from raybench.runners.on_ray import private as ray_private
from raybench.runners.on_ray.mailbox import TrialRef
from raybench.runners.on_ray.plan import NODE_TOKEN
from raybench.runners.on_ray.process_group import ProcessGroupConfig
from raybench.runners.on_ray.ranks import RayRanks
from raybench.sections import ExecutionSpec
from raybench.trials import TrialSpec

# Read by the Train controller, which inherits them from this process (ENV_VARS_TO_PROPAGATE).
# The health-check poll is also how fast the end of a run is noticed: the 2 s default adds
# seconds to every trial. Preemption watching is for spot instances, not benchmark nodes.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}


@dataclass(frozen=True)
class RunSettings:
    """What every Train run of a sweep shares, handed to Tune once (tune.with_parameters).
    `storage` is Ray Train's storage path (a local folder or a URI), `trials_dir` where rank
    0 writes traces and artefacts (on its own node), `strategies` the placement per trial key
    (plan.strategy), `handoff` whether a group's next trial waits for the driver's word on the
    last one's row (worker groups), `last` the group that ends with its last outcome."""

    storage: str
    trials_dir: str
    execution: ExecutionSpec
    cwd: str | None
    strategies: dict[str, str]
    mailbox: Any  # Mailbox
    parcels: Any = None  # Parcels, on any cluster but an embedded one
    handoff: bool = False
    last: int | None = None


def worker_env(trial: TrialRef | TrialSpec, execution: ExecutionSpec) -> dict[str, str]:
    """The workers' environment: NCCL's debug file where ranks talk over NCCL (to read back
    which network it chose), then the trial's own `hardware.env`, which wins."""
    hw = trial.hardware
    nccl = hw.nccl_between_ranks and not execution.logical_gpus
    return {**(fabric.debug_env(trial.key) if nccl else {}), **hw.env}


def run_name(trials: list[TrialRef], attempt: int) -> str:
    """The Train run's name; an attempt never finds an earlier attempt's run state under it."""
    first = trials[0]
    name = f"trial_{first.index:04d}_{first.key}"
    if len(trials) > 1:
        name = f"group_{first.index:04d}_{first.key}_{len(trials)}"
    return name + (f"_retry{attempt}" if attempt else "")


def trainer_for(trials: list[TrialRef], runs: RunSettings, strategy: str, run: str,
             positions: list[int]) -> Any:
    """One Ray Train run named `run` for `trials` (one, or a worker group's: one shape, as
    many ranks as the widest, which runs first), placed by `strategy` (plan.strategy);
    `positions`: the trials' places in the sweep, which the driver's word on rows names."""
    execution = runs.execution
    for key, value in TRAIN_ENV.items():
        os.environ.setdefault(key, value)  # a user's own setting wins
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(execution.start_timeout_s)
    first = trials[0]
    hw = first.hardware
    assert hw.world_size == group_ranks(trials), "a group's widest trial runs first"
    per_worker = dict(first.resources["per_worker"])
    if execution.concurrency == "per_node":
        # the workers of a trial share one node's token between them, so no other trial's
        # workers can join that node (shares rounded down: Ray counts resources in 1e-4 units)
        per_worker[NODE_TOKEN] = int(10_000 / hw.world_size) / 10_000
    # the trials by reference (TrialRef): the Train controller unpickles this config for its
    # run state. Traces and artefacts land beside the trial JSONs, on rank 0's node.
    side = RayRanks(specs=[t.spec for t in trials], mailbox=runs.mailbox, run=run,
                    positions=positions, trace_dir=runs.trials_dir, cwd=runs.cwd,
                    logical_gpus=execution.logical_gpus, timeout_s=execution.trial_timeout_s,
                    parcels=runs.parcels, handoff=runs.handoff)
    return ray_private.data_parallel_trainer()(
        run_trials,  # the rank entry itself, on every worker
        train_loop_config={"side": side},
        backend_config=ProcessGroupConfig(
            backend="gloo" if execution.logical_gpus else hw.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=hw.world_size, use_gpu=hw.use_gpu, resources_per_worker=per_worker,
            placement_strategy=strategy,
        ),
        run_config=ray.train.RunConfig(
            name=run,
            storage_path=runs.storage,
            # A worker group that cannot be placed must fail once, not be retried forever
            # (controller_failure_limit defaults to -1 in Ray 2.60).
            failure_config=ray.train.FailureConfig(max_failures=0, controller_failure_limit=0),
            # set as the worker processes start, before CUDA or NCCL read them
            worker_runtime_env={"env_vars": worker_env(first, execution)},
        ),
    )


def group_ranks(trials: list[TrialRef]) -> int:
    """A worker group's ranks: its widest trial's (plan.worker_groups)."""
    return max(t.hardware.world_size for t in trials)


def checkpoint_uri(checkpoint: Any) -> str:
    """Where a checkpoint is, as a user opens it: a local path, or a URI (Ray's `path` is the
    path inside its filesystem, without the scheme: "bucket/run/...")."""
    kind = checkpoint.filesystem.type_name
    if kind == "local":
        return checkpoint.path
    return f"{ {'gcs': 'gs'}.get(kind, kind)}://{checkpoint.path}"

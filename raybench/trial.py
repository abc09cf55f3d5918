"""A Ray trial's driver side: one Ray Train run per worker group, followed from Tune's trial.

Owns the Ray Train V2 driver pattern (this runs inside a Tune function trial, `tune_entry`),
the settings that keep a trial from hanging (no controller retries, a short worker-group
start deadline, a run whose workers never start made a row; the wall-clock watchdog on every
rank is rank.py's), the sweep's Mailbox through which a run's ranks hand over each trial's
outcome, and the retry of a trial whose worker process died. Ray Train's own `max_failures`
is kept at 0: its policy retries any worker-group error, a Python exception or an
out-of-memory included, and a benchmark must not rerun those. The trainer is Ray Train's
data-parallel trainer running the one rank entry (rank.run_trials, with rank_ray.RayRanks as
its side) over raybench's torch.distributed backend (process_group.py): what `TorchTrainer`
runs, without torch in the Tune trial's and the controller's processes, which is why this
module imports no torch. Does not own the Tune grid (runners/on_ray.py) or the timed loop
(worker.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
import ray.train

from raybench import artifacts, fabric, ray_private
from raybench.columns import Metric, declare
from raybench.failures import failure
from raybench.plan import NODE_TOKEN
from raybench.process_group import ProcessGroupConfig
from raybench.rank import run_trials
from raybench.rank_ray import RayRanks
from raybench.records import TrialOutcome, now
from raybench.sections import ExecutionSpec, HardwareSpec
from raybench.trials import TrialSpec

log = logging.getLogger(__name__)

declare(
    Metric("trial/retries", "count", "attempts lost to a dead worker and retried"),
    Metric("trial/retry_reasons", "text", "why each lost attempt ended"),
    Metric("trial/isolation", "text", "execution.isolation: process (fresh workers per trial) "
           "or worker (a worker group shared by trials of one shape)"),
    Metric("trial/group_position", "count", "trials the worker group ran before this one "
           "(0: this trial started its workers and carries their start-up)"),
    Metric("trial/group_ranks", "count", "ranks the worker group started with: the trial's "
           "own, or more where wider trials ran on the group before it (this one ran on its "
           "first ranks; the others had left)"),
    Metric("cluster/placement_strategy", "text", "the worker group's placement strategy"),
    Metric("cluster/concurrency", "text", "execution.concurrency"),
    Metric("train/checkpoint", "text", "where Ray Train kept rank 0's checkpoint"),
)

# Read by the Train controller, which inherits them from this process (ENV_VARS_TO_PROPAGATE).
# The health-check poll is also how fast the end of a run is noticed: the 2 s default adds
# seconds to every trial. Preemption watching is for spot instances, not benchmark nodes.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}


@dataclass(frozen=True)
class TrialRef:
    """A trial as the Tune trial process and the Train controller hold it: what starting its
    ranks takes, and its TrialSpec by reference, loaded on the ranks. A TrialSpec's workload
    parameters are a class of the workload's own module, which imports torch and its model
    library: 2.7 s of a core wherever one is unpickled, in processes that never run a step."""

    index: int
    key: str
    hardware: HardwareSpec
    resources: dict[str, Any]  # TrialSpec.resources()
    spec: ray.ObjectRef

    @classmethod
    def of(cls, trial: TrialSpec) -> TrialRef:
        return cls(trial.index, trial.key, trial.hardware, trial.resources(), ray.put(trial))


@ray.remote(num_cpus=0)
class Mailbox:
    """Messages by key, for a process elsewhere to take, one actor per sweep: what crosses
    between a Train run's ranks and the Tune trial that started it.

    - a Train run's messages (by run name): "up" as Ray Train calls rank 0's function (every
      worker of the group has started), "start" and "done" (with the outcome) per trial from
      rank 0, "end" as the fit returns. Ray Train bounds the wait for a placement
      (RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S) but not for the worker processes that follow:
      a worker that cannot start (a `hardware.env` that breaks Python, a runtime environment
      that fails on a node) left its controller waiting for ever; no "up" by
      `start_deadline` makes the trial a row instead.
    - the driver's word that a trial's row is on disk (("row", sweep position)): a worker
      group's next trial waits for it, as writing a row (table, trial file, the history)
      takes the driver's CPU, and on a small machine that would land inside the next trial's
      measured window. Under process isolation the next trial's start-up covers it."""

    def __init__(self) -> None:
        self._boxes: dict[Any, asyncio.Queue] = {}

    def _box(self, key: Any) -> asyncio.Queue:
        return self._boxes.setdefault(key, asyncio.Queue())

    async def put(self, key: Any, message: Any) -> None:
        self._box(key).put_nowait(message)

    async def take(self, key: Any, timeout_s: float) -> Any:
        """The next message under `key`, or None after `timeout_s`."""
        try:
            return await asyncio.wait_for(self._box(key).get(), timeout_s)
        except asyncio.TimeoutError:
            return None

    async def close(self, key: Any) -> None:
        self._boxes.pop(key, None)


def start_deadline(execution: ExecutionSpec) -> float:
    """Seconds from a Train run's start to its workers' function: the placement's deadline,
    then as long again for the processes to start (9-14 s for two ranks on a 2-core machine)."""
    return 2 * execution.start_timeout_s


def never_started(execution: ExecutionSpec, hw: HardwareSpec) -> TrialOutcome:
    env = f" with hardware.env {dict(hw.env)}" if hw.env else ""
    return TrialOutcome.failed(
        "error", f"the trial's workers did not start{env} within {start_deadline(execution):g} "
        f"s (execution.start_timeout_s={execution.start_timeout_s:g} s to be placed, as long "
        "again to start): a worker process that cannot start (an environment variable that "
        "breaks Python, a runtime environment that fails, a broken Python on a node); Ray's "
        "logs on that node (raylet.out, worker-*.err) say why")


@ray.remote(num_cpus=0)
class Parcels:
    """Trials' files on their way from rank 0's node to the driver (artifacts.py): rank 0
    puts them, the driver takes them before it writes the trial's row. Created by the Ray
    runner on any cluster but an embedded one; its `token` is the driver's marker."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._files: dict[str, artifacts.Files] = {}

    def get_token(self) -> str:
        return self.token

    def put(self, name: str, files: artifacts.Files) -> None:
        self._files[name] = files

    def take(self, name: str) -> artifacts.Files:
        return self._files.pop(name, [])


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


def tune_entry(config: dict[str, Any], trials: list[TrialRef], groups: list[list[int]],
               runs: RunSettings) -> None:
    """One Tune function trial: run one worker group's trials (plan.worker_groups; one trial
    under process isolation) on a Train run, and report each outcome to the driver as it ends,
    with the trial's position in `trials`; a trial that fails ends the run, and the trials
    after it start a fresh one. Group `runs.last` ends with its last outcome, without waiting
    for its Train run's orderly end: the driver sets it where nothing of the sweep comes after
    that group and its Ray ends with the sweep.

    It lives here, beside the trial it runs, not beside the Tune grid (runners/on_ray.py):
    Tune's trial process imports the module of its function, and this one holds only what a
    trial needs (the grid's module brings the results table and the report)."""
    from ray import tune

    members = groups[config["group"]]
    group = _Group([trials[i] for i in members], members, runs, begin=time.time())
    start = now()
    while group.pending:
        fit = group.fit()
        fit.start()
        for i, outcome in group.outcomes(fit, wait_end=config["group"] != runs.last):
            outcome.start_time, outcome.end_time = start, now()
            start = outcome.end_time  # the next trial's time begins where this one's ends
            tune.report({"raybench_trial": members[i],
                         "raybench_outcome": json.dumps(outcome.to_dict())})


class _Fit(threading.Thread):
    """`trainer.fit()` on a thread of its own, its result or error kept, and "end" to the
    mailbox as it returns: the Tune trial follows the run through its messages meanwhile, and
    leaves a fit behind that never started (or, the sweep's last, needs no orderly end)."""

    def __init__(self, trainer: Any, mailbox: Any, key: str) -> None:
        super().__init__(daemon=True, name=f"raybench-fit-{key}")
        self.trainer, self.mailbox, self.key = trainer, mailbox, key
        self.result: Any = None
        self.error: Exception | None = None
        self.started_at, self.mono = time.time(), time.monotonic()

    def run(self) -> None:
        try:
            self.result = self.trainer.fit()
        except Exception as e:  # handed to the group, which makes it the trial's row
            self.error = e
        finally:
            self.mailbox.put.remote(self.key, ("end", None, None))


class _Group:
    """A Tune trial's trials on one worker group, as its driver side follows them: the trials
    still to run, their lost attempts, where the next trial's time begins. A trial that fails
    ends the group's Train run (its other ranks may be waiting for it in a collective, and a
    process that ran out of memory or raised is not one to measure in again): it becomes a
    row, or is retried on fresh workers when a worker died (`execution.max_retries`)."""

    def __init__(self, trials: list[TrialRef], positions: list[int], runs: RunSettings,
                 begin: float) -> None:
        self.trials, self.positions, self.runs, self.begin = trials, positions, runs, begin
        self.pending = list(range(len(trials)))
        self.lost: dict[int, list[str]] = {}
        self.attempt = 0
        self.strategy = runs.strategies[trials[0].key]

    def fit(self) -> _Fit:
        """A Train run for the trials still to run, not yet started."""
        group = [self.trials[i] for i in self.pending]
        run = run_name(group, self.attempt)
        trainer = _trainer(group, self.runs, self.strategy, run,
                           [self.positions[i] for i in self.pending])
        return _Fit(trainer, self.runs.mailbox, run)

    def outcomes(self, fit: _Fit, wait_end: bool = True) -> Iterator[tuple[int, TrialOutcome]]:
        """(index in the group, outcome) as each of `fit`'s trials ends; the trials it did not
        get to stay pending. A lone trial's row waits for its run's end (its teardown is its
        fixed cost; its checkpoint comes with the result). `wait_end` False: return once the
        last outcome is handed over, the fit left to end with this process (Tune's trial,
        which owns its Train controller and workers): Ray Train's orderly end (noticing rank
        0's return at its next poll, shutting the workers down, releasing the placement
        group) took 1.1-1.4 s of the sweep's end here."""
        started: dict[int, float] = {}
        finished = 0
        for kind, n, payload in self._messages(fit):
            if kind == "start":
                started[n] = time.monotonic()
                continue
            if kind == "never":  # all of one shape and environment: none can start
                for i in self.pending:
                    yield i, self._finish(never_started(self.runs.execution,
                                                        self.trials[i].hardware), i, 0)
                self.pending = []
                return
            if len(self.trials) == 1:
                fit.join()
                _checkpoint(payload, fit.result)
            end = time.time()
            payload.stamps = {"trial_start": self.begin, "fit_end": end}
            if n == 0:  # the run's first trial carries its start-up
                payload.stamps["fit_start"] = fit.started_at
            yield self.pending[n], self._finish(payload, self.pending[n], n)
            self.begin, finished = end, n + 1
            if finished == len(self.pending) and not wait_end:
                break
        else:
            fit.join()
        self.runs.mailbox.close.remote(fit.key)
        if finished < len(self.pending):
            yield from self._ended_early(fit, finished, started)
        else:
            self.pending = []

    def _messages(self, fit: _Fit) -> Iterator[tuple[str, Any, Any]]:
        """The run's messages until its "end", or ("never", ...) once `start_deadline` passes
        with no word from its rank 0 (see Mailbox): that fit is left behind."""
        deadline = time.monotonic() + start_deadline(self.runs.execution)
        up = False
        while True:  # no polling while trials measure: the fit's end is a message too
            wait = 60.0 if up else max(0.1, min(60.0, deadline - time.monotonic()))
            message = ray.get(self.runs.mailbox.take.remote(fit.key, wait))
            if message is None:
                if not up and time.monotonic() >= deadline and fit.is_alive():
                    yield "never", None, None
                    return
                continue
            if message[0] == "end":
                return
            up = True
            if message[0] != "up":
                yield message

    def _ended_early(self, fit: _Fit, finished: int,
                     started: dict[int, float]) -> Iterator[tuple[int, TrialOutcome]]:
        """The run ended with trials to go: the one in flight takes the fit's error."""
        i = self.pending[finished]
        error = fit.error or RuntimeError("the worker group ended before its trials")
        out = failure(error, self.trials[i].resources)
        # the limit counts the run's first trial from the fit's start
        since = fit.mono if finished == 0 else started.get(finished, fit.mono)
        out = _timed_out(out, time.monotonic() - since, self.runs.execution)
        self.attempt += 1
        reasons = self.lost.setdefault(i, [])
        if out.status == "lost" and len(reasons) < self.runs.execution.max_retries:
            reasons.append(_reason(out))
            log.warning("trial %d (%s) lost a worker; retry %d of %d on fresh workers",
                        self.trials[i].index, self.trials[i].key, len(reasons),
                        self.runs.execution.max_retries)
            self.pending = self.pending[finished:]
            return
        yield i, self._finish(out, i, finished)
        self.begin = time.time()
        self.pending = self.pending[finished + 1:]

    def _finish(self, out: TrialOutcome, i: int, position: int) -> TrialOutcome:
        """The row fields every Ray Train trial carries, whatever became of it."""
        execution = self.runs.execution
        if out.ok:
            out.metrics["cluster/placement_strategy"] = self.strategy
            out.metrics["cluster/concurrency"] = execution.concurrency
        lost = self.lost.get(i, [])
        out.metrics["trial/isolation"] = execution.isolation
        out.metrics["trial/group_position"] = position
        out.metrics["trial/group_ranks"] = _ranks(self.trials)
        out.metrics["trial/retries"] = len(lost)
        if lost:
            out.metrics["trial/retry_reasons"] = " | ".join(lost)
        return out


def _checkpoint(out: TrialOutcome, result: Any) -> None:
    if out.ok and result is not None and result.checkpoint is not None:
        out.metrics["train/checkpoint"] = checkpoint_uri(result.checkpoint)


def checkpoint_uri(checkpoint: Any) -> str:
    """Where a checkpoint is, as a user opens it: a local path, or a URI (Ray's `path` is the
    path inside its filesystem, without the scheme: "bucket/run/...")."""
    kind = checkpoint.filesystem.type_name
    if kind == "local":
        return checkpoint.path
    return f"{ {'gcs': 'gs'}.get(kind, kind)}://{checkpoint.path}"


def _timed_out(out: TrialOutcome, elapsed: float, execution: ExecutionSpec) -> TrialOutcome:
    """A worker that ended (its watchdog) or failed after the trial's time limit: timeout."""
    limit = execution.trial_timeout_s
    if out.status in ("lost", "error") and limit and elapsed >= limit:
        return TrialOutcome.failed(
            "timeout", f"ran past execution.trial_timeout_s={limit:g} s (stopped after "
            f"{elapsed:.0f} s)\n{out.error}")
    return out


def _reason(out: TrialOutcome) -> str:
    # two lines: a controller's error says what failed on its second
    return " ".join((out.error or "").splitlines()[:2])[:300]


def _ranks(trials: list[TrialRef]) -> int:
    """A worker group's ranks: its widest trial's (plan.worker_groups)."""
    return max(t.hardware.world_size for t in trials)


def _worker_env(trial: TrialRef | TrialSpec, execution: ExecutionSpec) -> dict[str, str]:
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


def _trainer(trials: list[TrialRef], runs: RunSettings, strategy: str, run: str,
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
    assert hw.world_size == _ranks(trials), "a group's widest trial runs first"
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
            worker_runtime_env={"env_vars": _worker_env(first, execution)},
        ),
    )

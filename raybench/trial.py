"""One trial on Ray Train: DDP over a Ray Train worker group, its outcome as row fields.

Owns the Ray Train V2 driver pattern (this runs inside a Tune function trial), the settings that
keep a trial from hanging (no controller retries, a short worker-group start deadline, a
wall-clock watchdog in every worker, kept by rank.py), and the retry of a trial whose worker
process died. Ray Train's own `max_failures` is kept at 0: its policy retries any worker-group
error, a Python exception or an out-of-memory included, and a benchmark must not rerun those.
The trainer is Ray Train's data-parallel trainer with raybench's torch.distributed backend
(process_group.py): what `TorchTrainer` runs, without torch in the Tune trial's and the
controller's processes. This module imports no torch for that reason; what the ranks run is
rank.py. Does not own the Tune grid (runners/on_ray.py) or the timed loop (worker.py).
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
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from raybench import artifacts, fabric, metrics
from raybench.columns import Metric, declare
from raybench.failures import failure
from raybench.plan import NODE_TOKEN
from raybench.process_group import ProcessGroupConfig
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


def train_loop(config: dict[str, Any]) -> TrialOutcome | None:
    """Ray Train's function on every rank: rank.run_trials, the group's trials in turn.

    Only this stub is what the Tune trial process holds (it pickles the function by reference,
    so it imports the module that defines it): the ranks' module, with torch and the
    workloads, is loaded where it runs."""
    if config.get("starts") is not None and ray.train.get_context().get_world_rank() == 0:
        config["starts"].set.remote(config["run"])  # every rank's process is up by now
    from raybench.rank import run_trials

    return run_trials(config)


@ray.remote(num_cpus=0)
class Events:
    """Things that happened, by key, for a process elsewhere to wait on. One per sweep for
    each of two uses:

    - handoff: the driver's word that a trial's row is on disk (by sweep position). A worker
      group's next trial waits for it: writing a row (table, trial file, the history) takes
      the driver's CPU, and on a small machine that would land inside the next trial's
      measured window. Under process isolation the next trial's start-up covers it.
    - starts: a Train run's workers have come up (by run name): rank 0 says so as Ray Train
      calls its function, after every worker of the group has started. Ray Train bounds the
      wait for a placement (RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S) but not for the worker
      processes that follow: a worker that cannot start (a `hardware.env` that breaks Python,
      a runtime environment that fails on a node) left its controller waiting for ever."""

    def __init__(self) -> None:
        self._events: dict[Any, asyncio.Event] = {}

    def _event(self, key: Any) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    async def set(self, key: Any) -> None:
        self._event(key).set()

    async def wait(self, key: Any) -> bool:
        await self._event(key).wait()
        return True


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


def tune_entry(config: dict[str, Any], trials: list[TrialRef], groups: list[list[int]],
               storage: str, trials_dir: str, execution: ExecutionSpec, cwd: str,
               strategies: dict[str, str], handoff: Any = None, parcels: Any = None,
               last: int | None = None, starts: Any = None) -> None:
    """One Tune function trial: run one worker group's trials (plan.worker_groups; one trial
    under process isolation) and report each outcome to the driver as it ends, with the
    trial's position in `trials`. Group `last` ends with its last outcome, without waiting for
    its Train run's orderly end (run_group's `wait_end`): the driver sets it where nothing of
    the sweep comes after that group and its Ray ends with the sweep.

    It lives here, beside the trial it runs, not beside the Tune grid (runners/on_ray.py):
    Tune's trial process imports the module of its function, and this one holds only what a
    trial needs (the grid's module brings the results table and the report)."""
    from ray import tune

    entry, start = time.time(), now()
    members = groups[config["group"]]
    group = [trials[i] for i in members]
    strategy = strategies[group[0].key]
    if len(group) == 1:
        outcomes = [(0, run_trial(group[0], storage, trials_dir, execution, cwd, strategy,
                                  trial_start=entry, parcels=parcels, starts=starts))]
    else:
        outcomes = run_group(group, storage, trials_dir, execution, cwd, strategy, entry,
                             handoff, members, parcels, wait_end=config["group"] != last)
    for n, outcome in outcomes:
        outcome.start_time, outcome.end_time = start, now()
        start = outcome.end_time  # the next trial's time begins where this one's ends
        tune.report({"raybench_trial": members[n],
                     "raybench_outcome": json.dumps(outcome.to_dict())})


def run_trial(trial: TrialRef, storage: str, trials_dir: str, execution: ExecutionSpec,
              cwd: str | None = None, strategy: str = "PACK",
              trial_start: float | None = None, parcels: Any = None,
              starts: Any = None) -> TrialOutcome:
    """Fit one trial; a worker process that died is retried up to `execution.max_retries` times
    on fresh workers. Returns {status, error, metrics, ...} with `trial/retries`, never raises.
    `starts` (an Events actor): the trial is an error row when its workers have not started by
    `start_deadline`, its fit left to end with this process (Tune's trial: its Train
    controller, and the controller's workers and placement, are owned by it)."""
    lost: list[str] = []
    while True:
        start = time.monotonic()
        fit_start = time.time()
        trainer = _trainer([trial], None, storage, trials_dir, execution, cwd, strategy,
                           len(lost), parcels=parcels, starts=starts)
        try:
            result = _fit_watched(trainer, starts, run_name([trial], len(lost)), execution)
        except _NeverStarted:
            return _finish(never_started(execution, trial.hardware), lost, strategy,
                           execution, 0, trial.hardware.world_size)
        except Exception as e:  # a failed trial is a row, never a lost sweep
            out = failure(e, trial.resources)
        else:
            out = result.return_value or metrics.outcome(None)  # rank 0's, from every rank
            out.stamps = {"fit_start": fit_start, "fit_end": time.time()}
            if out.ok and result.checkpoint is not None:
                out.metrics["train/checkpoint"] = checkpoint_uri(result.checkpoint)
        out = _timed_out(out, time.monotonic() - start, execution)
        if out.status == "lost" and len(lost) < execution.max_retries:
            lost.append(_reason(out))
            log.warning("trial %d (%s) lost a worker; retry %d of %d on fresh workers",
                        trial.index, trial.key, len(lost), execution.max_retries)
            continue
        if trial_start is not None:  # a retried trial's fixed cost includes its lost attempts
            out.stamps["trial_start"] = trial_start
        return _finish(out, lost, strategy, execution, 0, trial.hardware.world_size)


def run_group(trials: list[TrialRef], storage: str, trials_dir: str, execution: ExecutionSpec,
              cwd: str | None, strategy: str, trial_start: float, handoff: Any,
              positions: list[int], parcels: Any = None,
              wait_end: bool = True) -> Iterator[tuple[int, TrialOutcome]]:
    """Fit one worker group for `trials` (one shape, widest first: plan.worker_groups) and
    yield (position, outcome) as each trial ends. A trial that fails ends its group (its other ranks
    may be waiting for it in a collective, and a process that ran out of memory or raised is
    not one to measure in again): it becomes a row, or is retried on fresh workers when a
    worker died (`execution.max_retries`), and the trials after it start a fresh group.
    `wait_end` False: return once the last trial's outcome is handed over, leaving the fit to
    end with this process (Tune's trial; its Train controller and workers are owned by it):
    Ray Train's orderly end (noticing rank 0's return at its next poll, shutting the workers
    down, releasing the placement group) took 1.1-1.4 s of the sweep's end here."""
    from ray.util.queue import Empty, Queue

    pending = list(range(len(trials)))
    lost: dict[int, list[str]] = {}
    begin = trial_start  # the start of the next trial's time: the last outcome's hand-over
    attempt = 0
    while pending:
        # the ranks' messages come through a 0-CPU queue actor while the fit runs
        queue = Queue(actor_options={"num_cpus": 0})
        box: dict[str, Any] = {}
        fit_start, mono = time.time(), time.monotonic()
        group = [trials[i] for i in pending]
        ranks = _ranks(group)
        trainer = _trainer(group, queue, storage, trials_dir, execution, cwd, strategy, attempt,
                           # sweep positions, for the driver's word on rows
                           handoff=handoff, positions=[positions[i] for i in pending],
                           parcels=parcels)
        thread = threading.Thread(target=_fit_into, args=(trainer, box, queue), daemon=True)
        thread.start()
        started: dict[int, float] = {}
        finished = 0
        deadline = time.monotonic() + start_deadline(execution)
        while True:
            up = started or finished
            try:  # no polling while trials measure: the fit's end is a message too
                kind, n, payload = queue.get(
                    timeout=60 if up else max(0.1, min(60.0, deadline - time.monotonic())))
            except Empty:
                if not up and thread.is_alive() and time.monotonic() >= deadline:
                    # none of the group's workers came up (see Events): none of its trials,
                    # all of one shape and environment, can start; the fit is left behind
                    for i in pending:
                        yield i, _finish(never_started(execution, trials[i].hardware),
                                         lost.get(i, []), strategy, execution, 0, ranks)
                    return
                if thread.is_alive():
                    continue
                break
            if kind == "end":
                break
            if kind == "start":
                started[n] = time.monotonic()
                continue
            end = time.time()
            out = payload
            out.stamps = {"trial_start": begin, "fit_end": end}
            if n == 0:  # the group's first trial carries its start-up
                out.stamps["fit_start"] = fit_start
            yield pending[n], _finish(out, lost.get(pending[n], []), strategy, execution, n,
                                      ranks)
            begin, finished = end, n + 1
            if finished == len(pending) and not wait_end:
                return
        thread.join()
        queue.shutdown()
        if finished == len(pending):
            break
        # the group ended with trials to go: the one in flight takes the fit's error
        i = pending[finished]
        error = box.get("error") or RuntimeError("the worker group ended before its trials")
        out = failure(error, trials[i].resources)
        # the limit counts a group's first trial from the fit's start, as run_trial does
        since = mono if finished == 0 else started.get(finished, mono)
        out = _timed_out(out, time.monotonic() - since, execution)
        attempt += 1
        reasons = lost.setdefault(i, [])
        if out.status == "lost" and len(reasons) < execution.max_retries:
            reasons.append(_reason(out))
            log.warning("trial %d (%s) lost a worker; retry %d of %d on a fresh worker group",
                        trials[i].index, trials[i].key, len(reasons), execution.max_retries)
            pending = pending[finished:]
            continue
        yield i, _finish(out, reasons, strategy, execution, finished, ranks)
        begin = time.time()
        pending = pending[finished + 1:]


class _NeverStarted(Exception):
    pass


def _fit_watched(trainer: DataParallelTrainer, starts: Any, run: str,
                 execution: ExecutionSpec) -> Any:
    """`trainer.fit()`, or _NeverStarted once `start_deadline` passes with no word from its
    rank 0 (see Events); then the fit thread is left behind, waiting in Ray Train."""
    if starts is None:
        return trainer.fit()
    box: dict[str, Any] = {}

    def fit() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=fit, daemon=True, name="raybench-fit")
    thread.start()
    up = starts.wait.remote(run)
    deadline = time.monotonic() + start_deadline(execution)
    while thread.is_alive() and time.monotonic() < deadline:
        ready, _ = ray.wait([up], timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        if ready:
            thread.join()  # up: the trial's own time limit (rank.py's watchdog) governs now
            break
    if thread.is_alive():
        raise _NeverStarted()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _fit_into(trainer: DataParallelTrainer, box: dict[str, Any], queue: Any) -> None:
    try:
        trainer.fit()  # a group's outcomes came through the queue; only its error is kept
    except Exception as e:  # handed to the group's loop, which makes it the trial's row
        box["error"] = e
    finally:
        queue.put(("end", None, None))


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


def _finish(out: TrialOutcome, lost: list[str], strategy: str, execution: ExecutionSpec,
            position: int, ranks: int) -> TrialOutcome:
    """The row fields every Ray Train trial carries, whatever became of it."""
    if out.ok:
        out.metrics["cluster/placement_strategy"] = strategy
        out.metrics["cluster/concurrency"] = execution.concurrency
    out.metrics["trial/isolation"] = execution.isolation
    out.metrics["trial/group_position"] = position
    out.metrics["trial/group_ranks"] = ranks
    out.metrics["trial/retries"] = len(lost)
    if lost:
        out.metrics["trial/retry_reasons"] = " | ".join(lost)
    return out


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


def _trainer(trials: list[TrialRef], queue: Any, storage: str, trials_dir: str,
             execution: ExecutionSpec, cwd: str | None, strategy: str,
             attempt: int, starts: Any = None, **config: Any) -> DataParallelTrainer:
    """One Ray Train run for `trials` (one, or a worker group's: one shape, as many ranks as
    the widest, which runs first). `storage`
    is Ray Train's storage path (a local folder or a URI), `trials_dir` where rank 0 writes
    traces and artefacts (on its own node), `strategy` the placement (plan.strategy), `queue`
    where rank 0 hands a group's outcomes over (None: one trial, through its return value)."""
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
    name = run_name(trials, attempt)
    return DataParallelTrainer(
        train_loop,
        # the trials by reference (TrialRef): the Train controller unpickles this config for
        # its run state. Traces and artefacts land beside the trial JSONs, on rank 0's node.
        train_loop_config={"trials": [t.spec for t in trials], "queue": queue,
                           "trace_dir": trials_dir,
                           "cwd": cwd, "logical_gpus": execution.logical_gpus,
                           "timeout_s": execution.trial_timeout_s,
                           "starts": starts, "run": name, **config},
        backend_config=ProcessGroupConfig(
            backend="gloo" if execution.logical_gpus else hw.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=hw.world_size, use_gpu=hw.use_gpu, resources_per_worker=per_worker,
            placement_strategy=strategy,
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage,
            # A worker group that cannot be placed must fail once, not be retried forever
            # (controller_failure_limit defaults to -1 in Ray 2.60).
            failure_config=ray.train.FailureConfig(max_failures=0, controller_failure_limit=0),
            # set as the worker processes start, before CUDA or NCCL read them
            worker_runtime_env={"env_vars": _worker_env(first, execution)},
        ),
    )

"""A Ray trial's driver side: one worker group's trials on Ray Train, followed from Tune's trial.

Owns the Ray Train V2 driver pattern (this runs inside a Tune function trial, `tune_entry`): a
Train run's fit on a thread of its own, its ranks followed through the sweep's Mailbox (each
trial's start and outcome; a run whose workers never start made a row), and the retry of a
trial whose worker process died. Ray Train's own `max_failures` is kept at 0: its policy retries
any worker-group error, a Python exception or an out-of-memory included, and a benchmark must
not rerun those. How a run is built is train.py's; the actors it talks through mailbox.py's.
Imports no torch: Tune's trial process and the Train controller load it, and never run a step.
Does not own the Tune grid (runner.py) or the timed loop (rank/loop.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import ray

from raybench.columns import Metric, declare
from raybench.failures import failure
from raybench.records import TrialOutcome, now
from raybench.runners.on_ray.mailbox import TrialRef, never_started, start_deadline
from raybench.runners.on_ray.train import (
    RunSettings,
    checkpoint_uri,
    group_ranks,
    run_name,
    trainer_for,
)
from raybench.sections import ExecutionSpec

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

def tune_entry(config: dict[str, Any], trials: list[TrialRef], groups: list[list[int]],
               runs: RunSettings) -> None:
    """One Tune function trial: run one worker group's trials (plan.worker_groups; one trial
    under process isolation) on a Train run, and report each outcome to the driver as it ends,
    with the trial's position in `trials`; a trial that fails ends the run, and the trials
    after it start a fresh one. Group `runs.last` ends with its last outcome, without waiting
    for its Train run's orderly end: the driver sets it where nothing of the sweep comes after
    that group and its Ray ends with the sweep.

    It lives here, beside the trial it runs, not beside the Tune grid (runner.py):
    Tune's trial process imports the module of its function, and this one holds only what a
    trial needs (the grid's module brings the results table and the report)."""
    from ray import tune  # Ray Tune: in Tune's trial process, where it is loaded already

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
        trainer = trainer_for(group, self.runs, self.strategy, run,
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
        out.metrics["trial/group_ranks"] = group_ranks(self.trials)
        out.metrics["trial/retries"] = len(lost)
        if lost:
            out.metrics["trial/retry_reasons"] = " | ".join(lost)
        return out


def _checkpoint(out: TrialOutcome, result: Any) -> None:
    if out.ok and result is not None and result.checkpoint is not None:
        out.metrics["train/checkpoint"] = checkpoint_uri(result.checkpoint)


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

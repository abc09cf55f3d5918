"""The driver side of a Ray trial (trial._Group: the Tune trial following its Train run through
the sweep's mailbox), without Ray: the fit is a stand-in that sends the ranks' messages as Ray
Train's ranks do (ranks.RayRanks) and then ends as the test says, the mailbox a queue in
this process. Covers every way a run ends: its trials handed over, the end of its Train run
awaited or not, a worker lost mid-group and retried on fresh workers, a run whose workers
never start, a lone trial's error."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict

import pytest

from raybench.records import TrialOutcome
from raybench.runners.on_ray import mailbox, train, trial
from raybench.sections import ExecutionSpec, HardwareSpec


class _Call:
    def __init__(self, f):
        self.remote = f


class _Mailbox:
    """mailbox.Mailbox's calls, in this process (`.remote` does the call; ray.get passes it)."""

    def __init__(self):
        self.boxes = defaultdict(queue.Queue)
        self.put = _Call(lambda key, message: self.boxes[key].put(message))
        self.take = _Call(self._take)
        self.close = _Call(lambda key: None)

    def _take(self, key, timeout_s):
        try:
            return self.boxes[key].get(timeout=timeout_s)
        except queue.Empty:
            return None


class ActorDiedError(Exception):
    """A lost worker as failures.classify names it."""


class _Fit:
    """A Train run's ranks: "up", then per trial "start" and "done" (or, for trial `fail_at`,
    the error `fail_with` as the fit's own); the fit returns once `released` is set."""

    def __init__(self, mailbox, run, n, released, fail_at=None, fail_with=None, up=True):
        self.mailbox, self.run, self.n, self.released = mailbox, run, n, released
        self.fail_at, self.fail_with, self.up = fail_at, fail_with, up

    def fit(self):
        if not self.up:
            assert self.released.wait(30)
            return None
        self.mailbox.put.remote(self.run, ("up", None, None))
        for i in range(self.n):
            self.mailbox.put.remote(self.run, ("start", i, 0.0))
            if i == self.fail_at:
                raise self.fail_with
            self.mailbox.put.remote(self.run, ("done", i, TrialOutcome(status="ok")))
        assert self.released.wait(30)
        return None


@pytest.fixture
def run(monkeypatch):
    """run(n trials, **fit options per attempt) -> (outcomes so far, done event, released)."""
    released = threading.Event()
    monkeypatch.setattr(trial.ray, "get", lambda ref: ref)
    fits: list[dict] = []

    def make(trials, runs, strategy, name, positions):
        options = fits.pop(0) if fits else {}
        return _Fit(runs.mailbox, name, len(trials), released, **options)

    monkeypatch.setattr(trial, "trainer_for", make)

    def start(n, *attempts, wait_end=True, **execution):
        fits.extend(attempts)
        refs = [mailbox.TrialRef(i, f"k{i}", HardwareSpec(), {}, None) for i in range(n)]
        runs = train.RunSettings("", "", ExecutionSpec(isolation="worker", **execution), None,
                                 {"k0": "PACK"}, _Mailbox())
        group = trial._Group(refs, list(range(n)), runs, begin=0.0)
        got, done = [], threading.Event()

        def body():
            while group.pending:
                fit = group.fit()
                fit.start()
                for pos, out in group.outcomes(fit, wait_end=wait_end):
                    got.append((pos, out))
            done.set()

        threading.Thread(target=body, daemon=True).start()
        return got, done

    yield start, released
    released.set()


def test_the_last_group_returns_with_its_last_outcome(run):
    start, released = run
    got, done = start(2, wait_end=False)
    assert done.wait(10), got  # the fit has not ended: nothing waits for it
    assert [(p, o.status) for p, o in got] == [(0, "ok"), (1, "ok")]
    assert [o.metrics["trial/group_position"] for _, o in got] == [0, 1]
    assert "fit_start" in got[0][1].stamps and "fit_start" not in got[1][1].stamps


def test_a_group_waits_for_its_train_run_to_end(run):
    start, released = run
    got, done = start(2, wait_end=True)
    assert not done.wait(1.0) and len(got) == 2  # outcomes out, fit running
    released.set()
    assert done.wait(10)


def test_a_lone_trials_row_waits_for_its_run_to_end(run):
    """Its teardown is its fixed cost (fit_end after the fit returned), as process isolation's
    rows always had it."""
    start, released = run
    got, done = start(1)
    assert not done.wait(1.0) and got == []
    released.set()
    assert done.wait(10) and [o.status for _, o in got] == ["ok"]


def test_a_worker_lost_mid_group_is_retried_on_a_fresh_group_and_counted(run):
    start, released = run
    released.set()
    got, done = start(3, {"fail_at": 1, "fail_with": ActorDiedError("worker died")})
    assert done.wait(10)
    assert [(p, o.status) for p, o in got] == [(0, "ok"), (1, "ok"), (2, "ok")]
    retried = got[1][1].metrics
    assert retried["trial/retries"] == 1 and "worker died" in retried["trial/retry_reasons"]
    assert retried["trial/group_position"] == 0  # first on the fresh group, which it started
    assert got[2][1].metrics["trial/retries"] == 0


def test_an_error_ends_the_group_and_the_trials_after_it_start_fresh(run):
    start, released = run
    released.set()
    got, done = start(3, {"fail_at": 1, "fail_with": ValueError("bad batch")})
    assert done.wait(10)
    assert [(p, o.status) for p, o in got] == [(0, "ok"), (1, "error"), (2, "ok")]
    assert "bad batch" in got[1][1].error and got[1][1].metrics["trial/retries"] == 0


def test_a_run_whose_workers_never_start_is_an_error_row_per_trial(run):
    start, released = run
    got, done = start(2, {"up": False}, start_timeout_s=0.2)
    assert done.wait(10), got  # the fit is left behind, still waiting
    assert [(p, o.status) for p, o in got] == [(0, "error"), (1, "error")]
    assert "did not start" in got[0][1].error


def test_the_driver_writes_each_trials_row_once_and_rows_for_a_failed_tune_trial():
    """runners.on_ray._Rows: Tune asks its stop condition again about a trial's last result;
    a Tune trial that raised before reporting its trials leaves them as error rows."""
    import json
    from types import SimpleNamespace

    from raybench.runners.on_ray.runner import _Rows

    written = []
    runs = SimpleNamespace(parcels=None, handoff=False, trials_dir="")
    rows = _Rows(["t0", "t1", "t2"], [[0, 1], [2]], runs,
                 lambda trial, out: written.append((trial, out.status)))
    result = {"raybench_trial": 0,
              "raybench_outcome": json.dumps(TrialOutcome(status="ok").to_dict())}
    assert rows("id", result) is False and rows("id", result) is False
    assert rows("id", {"done": True}) is False  # a result of Tune's own
    assert written == [("t0", "ok")]
    rows.failed([SimpleNamespace(error=RuntimeError("tune_entry raised"), config={"group": 0}),
                 SimpleNamespace(error=None, config={"group": 1})])
    assert written == [("t0", "ok"), ("t1", "error")]

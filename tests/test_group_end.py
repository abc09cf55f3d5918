"""A shared worker group's Tune trial and the end of its Train run (trial.run_group), without Ray:
the fit is a stand-in that hands over its trials' outcomes and then takes its time to end, as
Ray Train's orderly end does (the controller's next poll, the workers' shutdown, the placement
group's release)."""

from __future__ import annotations

import queue
import threading

import pytest

from raybench import trial
from raybench.records import TrialOutcome
from raybench.sections import ExecutionSpec, HardwareSpec


class _Queue(queue.Queue):
    """ray.util.queue.Queue's calls that run_group makes, in this process."""

    def __init__(self, actor_options=None):
        super().__init__()

    def get(self, block=True, timeout=None):
        return super().get(block, timeout)

    def shutdown(self):
        pass


class _Fit:
    """Hands over `n` outcomes, then ends only when `released` is set."""

    def __init__(self, q, n, released):
        self.q, self.n, self.released = q, n, released

    def fit(self):
        for i in range(self.n):
            self.q.put(("start", i, 0.0))
            self.q.put(("done", i, TrialOutcome(status="ok")))
        assert self.released.wait(30)


@pytest.fixture
def group(monkeypatch):
    import ray.util.queue

    released = threading.Event()
    monkeypatch.setattr(ray.util.queue, "Queue", _Queue)
    monkeypatch.setattr(trial, "_trainer",
                        lambda trials, q, *a, **k: _Fit(q, len(trials), released))
    refs = [trial.TrialRef(i, f"k{i}", HardwareSpec(), {}, None) for i in range(2)]
    yield refs, released
    released.set()


def _run(refs, wait_end):
    got = []
    done = threading.Event()

    def body():
        for pos, out in trial.run_group(refs, "", "", ExecutionSpec(isolation="worker"), None,
                                        "PACK", 0.0, None, [0, 1], wait_end=wait_end):
            got.append((pos, out.status))
        done.set()

    threading.Thread(target=body, daemon=True).start()
    return got, done


def test_the_last_group_returns_with_its_last_outcome(group):
    refs, released = group
    got, done = _run(refs, wait_end=False)
    assert done.wait(10), got  # the fit has not ended: nothing waits for it
    assert got == [(0, "ok"), (1, "ok")]


def test_a_group_waits_for_its_train_run_to_end(group):
    refs, released = group
    got, done = _run(refs, wait_end=True)
    assert not done.wait(1.0) and got == [(0, "ok"), (1, "ok")]  # outcomes out, fit running
    released.set()
    assert done.wait(10)

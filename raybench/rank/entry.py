"""The one rank entry: a list of trials, one after another, on this rank, whatever started it.

A runner starts ranks its own way and hands each a `RankSide`: where the rank's trials come
from, how its context is built, how each trial's outcome goes back (Ray Train's worker group:
runners/on_ray/ranks.py; a launcher that sets torchrun's variables: launched.py). The rest is
the same for every runner and lives here: a group narrowed to a trial of fewer ranks, a
wall-clock watchdog per trial, the timed loop (loop.py) with every rank's records gathered on
rank 0, and the release of one trial's leftovers before the next.

Imports neither Ray nor, at import, torch: `run_trials` is the function Ray Train runs on its
workers, so Tune's trial process and the Train controller load this module by reference, and
they never run a tensor. Does not own the timed loop (loop.py) or any runner's transport.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from raybench.context import WorkerContext
    from raybench.records import RankRecord
    from raybench.trials import TrialSpec


class RankSide(Protocol):
    """What the rank entry asks of the runner that started the rank."""

    timeout_s: float | None  # execution.trial_timeout_s, per trial from its start; None: none

    def trials(self) -> list[TrialSpec]:
        """The trials this rank runs, in order (a worker group's, widest first)."""

    def context(self, trial: TrialSpec, stamps: dict[str, float]) -> WorkerContext:
        """This rank's context for `trial` (WorkerContext.from_env with the runner's device)."""

    def narrow(self, size: int) -> bool:
        """Before a trial of `size` ranks, fewer than so far: whether this rank is among them."""

    def started(self, n: int, ctx: WorkerContext, at: float) -> None:
        """Trial `n` has started on this rank at `at` (its time limit counts from here)."""

    def finished(self, n: int, trial: TrialSpec, ctx: WorkerContext,
                 records: list[RankRecord] | None) -> None:
        """Trial `n` ended on this rank; `records` are every rank's, on rank 0 only. Returns
        when the next trial may start."""


def run_trials(config: dict[str, Any]) -> None:
    """Every rank's entry: `config["side"]`'s trials in turn. A trial of fewer ranks than the
    rank ran so far runs on the first ranks; the others return (the group runs its widest
    trials first). Each trial builds everything afresh: a fresh workload, caches released."""
    entry = time.time()
    side: RankSide = config["side"]
    trials = side.trials()
    from raybench.context import process_start  # torch, here only: see the module's note
    from raybench.rank.loop import measure_rank

    stamps: dict[str, float] = {"process_start": process_start(), "imported": time.time(),
                                "loop_entry": entry}
    size = None
    between: dict[str, float] = {}  # the last trial's end, for the next one's fixed cost
    for n, trial in enumerate(trials):
        if size is not None and trial.hardware.world_size < size and not side.narrow(
                trial.hardware.world_size):  # part of the trial's rank_prep
            return
        size = trial.hardware.world_size
        if n:
            stamps = {**between, "loop_entry": time.time()}
        ctx = side.context(trial, stamps)
        side.started(n, ctx, stamps["loop_entry"])
        watchdog = _watchdog(side.timeout_s)  # per trial, from its start
        try:
            records = ctx.gather(measure_rank(trial, ctx))  # loop.run_worker's two steps
        finally:
            if watchdog:
                watchdog.cancel()
        if records:  # rank 0: when its part ended, for the teardown that follows
            records[0].stamps["loop_exit"] = time.time()
        side.finished(n, trial, ctx, records)  # in a group: returns on the driver's word
        if n + 1 < len(trials):
            between = {"handed_over": time.time()}
            if records:
                between["last_exit"] = records[0].stamps["loop_exit"]
            _release(ctx)


def _release(ctx: WorkerContext) -> None:
    """Between two trials in one process: nothing of the last one may stay behind. Its
    workload was local to the timed loop; collect what cycles kept, give cached CUDA blocks
    back (the next trial resets its peaks on an empty cache), drop compiled graphs."""
    import torch  # torch: never at this module's import (see its note)

    gc.collect()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()


def _watchdog(limit_s: float | None) -> threading.Timer | None:
    """End this rank's process when the trial's time is up.

    A rank stuck in a collective or a long kernel cannot be interrupted from Python, so the
    process exits; the runner sees the attempt outlive its limit and records a timeout."""
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

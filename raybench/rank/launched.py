"""A rank started by a launcher that sets torchrun's variables, without Ray: the local runner's
spawned ranks and torchrun's. The process group and the context come from those variables
(`WorkerContext.from_env`), the trial runs through the rank entry (entry.run_trials) like a
Ray rank's, rank 0 writes every rank's records as JSON for the runner that started it, and the
rank's process ends without the interpreter's teardown (leave_rank).
Ray's ranks have their side in runners/on_ray/ranks.py.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

from raybench.context import WorkerContext
from raybench.rank.entry import run_trials
from raybench.records import RankRecord
from raybench.trials import TrialSpec, artifact_dir, trace_path


@dataclass
class Launched:
    """A launched rank's side of the rank entry (rank.RankSide): one trial per launch, the
    launcher's own stamps (its rank's entry comes before the process group), the records to
    a file."""

    trial: TrialSpec
    trace_dir: str | None
    result: Path
    stamps: dict[str, float]
    timeout_s: float | None = None  # the launcher's driver keeps the trial's time

    def trials(self) -> list[TrialSpec]:
        return [self.trial]

    def context(self, trial: TrialSpec, stamps: dict[str, float]) -> WorkerContext:
        return WorkerContext.from_env(trial.hardware, trace_path=trace_path(self.trace_dir, trial),
                                      artifact_dir=artifact_dir(self.trace_dir, trial),
                                      stamps={**stamps, **self.stamps})

    def narrow(self, size: int) -> bool:
        raise AssertionError("a launch runs one trial: nothing to narrow")

    def started(self, n: int, ctx: WorkerContext, at: float) -> None:
        pass

    def finished(self, n: int, trial: TrialSpec, ctx: WorkerContext,
                 records: list[RankRecord] | None) -> None:
        if records:  # rank 0
            self.result.write_text(json.dumps([r.to_dict() for r in records]))


def run_rank(trial: TrialSpec, trace_dir: str | None, result: Path,
             stamps: dict[str, float]) -> NoReturn:
    """This rank's part of the trial; rank 0 writes the records to `result`. Done, the
    process ends here (leave_rank), whichever launcher started it; a failure raises."""
    dist.init_process_group(trial.hardware.backend)  # env:// from the launcher's variables
    try:
        run_trials({"side": Launched(trial, trace_dir, result, stamps)})
        # Rank 0 hosts the group's store: a rank that tears its group down after rank 0 has
        # exited aborted ("terminate called without an active exception", seen under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave_rank()


def leave_rank() -> NoReturn:
    """End a launched rank's process once its work is done and written, skipping the
    interpreter's teardown: there, gloo's threads sometimes aborted the process ("terminate
    called without an active exception"), which turned a finished trial into an error. Seen
    on the local runner's spawned ranks (2 of 8 runs of a two-rank test on an idle 2-core
    machine, 0 of 12 after) and on torchrun's (rank 0 of a two-rank ResNet trial in a clean
    clone's make test, 2026-12-06: torchrun then ends the other rank and reports the abort).
    Never called on an exception, which the launcher must see."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

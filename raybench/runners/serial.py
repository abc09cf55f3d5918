"""Runners that start a sweep's trials on this machine, one after another, without Ray.

Owns what the local and torchrun runners share: the serial run loop (each trial's outcome
stamped with its start and end and handed back as it ends), which trials this machine can never
run (more GPUs than it has), and Linux's parent-death signal by which the processes they start
end with the driver, however it ends. How a trial's ranks start is each runner's `run_one`.
"""

from __future__ import annotations

import time
from abc import abstractmethod

import torch

from raybench.records import TrialOutcome, now
from raybench.runners import Done, Runner
from raybench.trials import TrialSpec

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class SerialRunner(Runner):
    """Trials one at a time, on this machine."""

    def unplaceable(self, trials: list[TrialSpec]) -> dict[str, str]:
        return {t.key: why for t in trials if (why := gpus_missing(t))}

    def run(self, trials: list[TrialSpec], done: Done, name: str = "trials",
            last: bool = False) -> None:
        for trial in trials:
            start, t0 = now(), time.time()
            outcome = self.run_one(trial)
            outcome.start_time, outcome.end_time = start, now()
            outcome.stamps = {"trial_start": t0, "fit_start": t0, "fit_end": time.time()}
            done(trial, outcome)

    @abstractmethod
    def run_one(self, trial: TrialSpec) -> TrialOutcome:
        """One trial's outcome, a failed one as a row's status (never an exception)."""


def gpus_missing(trial: TrialSpec) -> str | None:
    """Why this machine can never run the trial (its ranks or replicas want more GPUs): for
    every runner that starts ranks on this machine."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = trial.resources()["total"].get("GPU", 0)
    return f"needs {need:g} GPUs but this machine has {have}" if need > have else None

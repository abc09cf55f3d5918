"""Runners: what executes a sweep's trials. The sweep loop (sweep/loop.py) is written once against
`Runner`; a runner only starts its machinery, says which trials it can never place, and runs
trials, handing each outcome back as it ends.

Three exist: `ray` (runners/on_ray/: a Tune grid of Ray Train DDP runs on an embedded Ray or
a cluster, inference replicas as actors), `local` (runners/local.py: this process, ranks
spawned over torch.distributed, no Ray needed) and `torchrun` (runners/torchrun.py: each
trial's ranks started by PyTorch's own launcher, as hand-written torchrun scripts are).
Implementations are imported on demand so the local and torchrun runners work where Ray is not
installed.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from raybench.records import TrialOutcome
from raybench.spec import SweepSpec
from raybench.trials import TrialSpec

Done = Callable[[TrialSpec, TrialOutcome], None]

RUNNERS = {"ray": "raybench.runners.on_ray.runner:RayRunner",
           "local": "raybench.runners.local:LocalRunner",
           "torchrun": "raybench.runners.torchrun:TorchrunRunner"}


class Runner(ABC):
    """Executes trials for one sweep run; a context manager around its start and stop."""

    name: ClassVar[str]
    # this runner's errors that are input to fix (exit 2, one paragraph), not a failed run:
    # the Ray runner's cluster that does not answer
    input_errors: ClassVar[tuple[type[Exception], ...]] = ()

    def __init__(self, spec: SweepSpec, out: Path, address: str | None = None,
                 started: bool = False):
        # started: its machinery was brought up before it was made, for it to own and stop
        # (sweep.main starts an embedded Ray beside the workload's import)
        self.spec, self.out, self.address, self.started = spec, out, address, started

    def __enter__(self) -> Runner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Bring the machinery up (connect to Ray, ...)."""
        return None

    def check(self, trials: list[TrialSpec]) -> None:
        """Raise SpecError if this runner can never serve these trials at all (exit 2,
        nothing run), e.g. GPU trials on a cluster without GPUs."""
        return None

    def stop(self) -> None:
        """Release what start() took; only what this runner started itself."""
        return None

    @abstractmethod
    def system(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None]:
        """Facts for system_info.json: the runner's description and per-node facts (or None)."""

    def unplaceable(self, trials: list[TrialSpec]) -> dict[str, str]:
        """Trial key -> why it can never run here; such trials become `infeasible` rows."""
        return {}

    @abstractmethod
    def run(self, trials: list[TrialSpec], done: Done, name: str = "trials",
            last: bool = False) -> None:
        """Run every trial (side by side where the runner can) and call `done(trial, outcome)`
        on the caller's thread as each one ends. A failed trial is an outcome, never an
        exception; a trial the runner lost gets no call (the loop writes its row). `last`:
        the runner stops after this call, so it may leave to `stop` what `stop` ends anyway."""


def runner_class(name: str) -> type[Runner]:
    """The runner called `name` (RUNNERS), its module imported now."""
    module, _, cls = RUNNERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make(name: str, spec: SweepSpec, out: Path, address: str | None = None,
         started: bool = False) -> Runner:
    return runner_class(name)(spec, out, address, started)

"""What crosses between a sweep's driver, its Tune trials and their Ray Train ranks.

Owns the references and actors the three sides share: `TrialRef` (a trial as the Tune trial and
the Train controller hold it, its spec by reference), the sweep's `Mailbox` (a Train run's
messages, the driver's word that a row is on disk), the deadline for a run's workers to start
and the row of a run whose workers never did, and `Parcels` (trials' files from rank 0's node to
the driver). Imports no torch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import ray

from raybench.records import TrialOutcome
from raybench.runners.on_ray import artifacts
from raybench.sections import ExecutionSpec, HardwareSpec
from raybench.trials import TrialSpec


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

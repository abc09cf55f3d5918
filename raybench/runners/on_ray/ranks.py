"""A rank in Ray Train's worker group: its side of the rank entry (rank.RankSide).

Owns what only Ray's ranks do: trials loaded by reference (mailbox.TrialRef), the context from
Ray Train's ranks and the GPU Ray gave the worker, a group narrowed to a trial of fewer ranks
(process_group.narrow), outcomes handed to the Tune trial through the sweep's mailbox
(mailbox.Mailbox) as each trial ends, the trial's files to the driver (mailbox.Parcels), Ray
Train's checkpoint, and the wait for the driver's word that a row is written before the next
trial of a group. Pickled into Ray Train's config by the Tune trial, so it imports no torch at
import (it runs only on the ranks).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import ray.train

from raybench import metrics, workloads
from raybench.runners.on_ray import artifacts, process_group
from raybench.trials import artifact_dir, trace_path

if TYPE_CHECKING:
    # torch: on the rank, never in the Train controller that unpickles this side
    from raybench.context import WorkerContext
    from raybench.records import RankRecord
    from raybench.trials import TrialSpec

log = logging.getLogger(__name__)

ROW_WAIT_S = 120.0  # past this the driver is stuck elsewhere; the group goes on regardless


@dataclass(frozen=True)
class RayRanks:
    """One Train run's ranks: its trials (by reference), where messages go (`mailbox`, under
    the run's name `run`), and the sweep positions the driver's word on rows is keyed by."""

    specs: list[ray.ObjectRef]
    mailbox: Any  # mailbox.Mailbox
    run: str
    positions: list[int]
    trace_dir: str
    cwd: str | None = None
    logical_gpus: bool = False
    timeout_s: float | None = None
    parcels: Any = None  # mailbox.Parcels, where nodes may share no disk
    handoff: bool = False  # a group's next trial waits for the driver's word on the last row

    def trials(self) -> list[TrialSpec]:
        if ray.train.get_context().get_world_rank() == 0:
            # every rank's process is up: a trial whose workers never start is a row, not a
            # hang (mailbox.start_deadline)
            self.mailbox.put.remote(self.run, ("up", None, None))
        if self.cwd and os.path.isdir(self.cwd):
            # relative paths in a sweep (data, chip caches) mean the sweep's directory, not the
            # trial directory Tune may have moved this process tree into
            os.chdir(self.cwd)
        # validated once, at expansion: loading them imports their workloads
        return ray.get(self.specs)

    def context(self, trial: TrialSpec, stamps: dict[str, float]) -> WorkerContext:
        # torch: on the rank, never in the Train controller that unpickles this side
        import ray.train.torch
        import torch

        # torch: on the rank, never in the Train controller that unpickles this side
        from raybench.context import WorkerContext

        rt = ray.get_runtime_context()
        # the rank's variables as process_group.py set them (narrowed to the trial's ranks
        # where a worker group runs a trial of fewer); the GPU is the one Ray gave
        return WorkerContext.from_env(
            trial.hardware,
            device=torch.device("cpu") if self.logical_gpus else ray.train.torch.get_device(),
            node_id=rt.get_node_id(), node_ip=ray.util.get_node_ip_address(),
            accelerator_ids=[str(g) for g in rt.get_accelerator_ids().get("GPU", [])],
            trace_path=trace_path(self.trace_dir, trial),
            artifact_dir=artifact_dir(self.trace_dir, trial), stamps=stamps)

    def narrow(self, size: int) -> bool:
        return process_group.narrow(size)

    def started(self, n: int, ctx: WorkerContext, at: float) -> None:
        if ctx.rank == 0:
            self.mailbox.put.remote(self.run, ("start", n, at))

    def finished(self, n: int, trial: TrialSpec, ctx: WorkerContext,
                 records: list[RankRecord] | None) -> None:
        if workloads.get(trial.workload_name).saves_checkpoint(trial.workload):
            # (such a trial always runs alone: plan.worker_groups) Every rank reports exactly
            # once (a rank that skipped it would hang the group), after the timed run; rank 0
            # hands over the best epoch's weights as a Ray Train checkpoint.
            folder = Path(ctx.artifact_dir or "") / "checkpoint"
            keep = ctx.rank == 0 and ctx.artifact_dir is not None and folder.is_dir()
            ray.train.report({"checkpointed": keep},
                             checkpoint=ray.train.Checkpoint.from_directory(str(folder))
                             if keep else None)
        if not records:
            return
        if self.parcels is not None:
            self._send_files(trial)
        # rank 0's outcome (metrics.outcome: the workload's own figures need its class,
        # loaded here already); ray.get: in the mailbox before the driver's word is awaited
        ray.get(self.mailbox.put.remote(self.run, ("done", n, metrics.outcome(records))))
        if self.handoff and n + 1 < len(self.specs):
            word = ray.get(self.mailbox.take.remote(("row", self.positions[n]), ROW_WAIT_S))
            if word is None:
                log.warning("no word from the driver %g s after trial %d ended; going on",
                            ROW_WAIT_S, self.positions[n])

    def _send_files(self, trial: TrialSpec) -> None:
        """Rank 0, after a trial: its files to the driver, unless the driver's folder is here."""
        token = ray.get(self.parcels.get_token.remote())
        if artifacts.shared(self.trace_dir, token):
            return
        files = artifacts.collect(self.trace_dir, trial)
        if files:
            ray.get(self.parcels.put.remote(Path(artifact_dir(self.trace_dir, trial)).name,
                                            files))

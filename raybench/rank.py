"""What every Ray Train rank runs: the trials of its worker group, one after another.

Owns the rank's side of a trial on Ray: its WorkerContext from Ray Train's ranks and device, a
wall-clock watchdog per trial, the hand-over of each trial's records to the Tune trial (queue)
and of its files to the driver (Parcels), the wait for the driver's word that a row is written
(trial.Events) and the release of one trial's leftovers before the next. Loaded on the ranks only,
through trial.train_loop: it imports torch and the workloads, which the Tune trial process and
the Train controller never need. Does not own the timed loop (worker.py) or the trainer
(trial.py).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch

from raybench import artifacts, metrics, process_group, workloads
from raybench.context import WorkerContext, process_start
from raybench.records import TrialOutcome
from raybench.trials import TrialSpec, artifact_dir, trace_path
from raybench.worker import run_worker

log = logging.getLogger(__name__)

# When this module was first imported in this process: on a Ray Train worker, the end of the
# imports its trials need (torch, the workloads, raybench's timed loop).
IMPORTED_AT = time.time()


def run_trials(config: dict[str, Any]) -> TrialOutcome | None:
    """Runs on every Ray Train worker: the trials of its worker group one after another (one
    trial under process isolation). Rank 0 turns every rank's records into the trial's
    outcome (metrics.outcome: the workload's own figures need its class, loaded here
    already). With one trial, rank 0's return value is that outcome; with several, rank 0
    hands each to the Tune trial through `config["queue"]` as the trial ends (a "start"
    message before it), and the next trial builds everything afresh in the same
    processes. A trial of fewer ranks than the group runs on its first ranks
    (process_group.narrow; the group runs its widest trials first): the others return."""
    # validated once, at expansion; pickled, and put by reference (trial.TrialRef): loading
    # them imports their workloads, as unpickling the function's config did before its entry
    trials: list[TrialSpec] = ray.get(config["trials"])
    entry = time.time()
    queue = config.get("queue")
    if config.get("cwd") and os.path.isdir(config["cwd"]):
        # relative paths in a sweep (data, chip caches) mean the sweep's directory, not the
        # trial directory Tune may have moved this process tree into
        os.chdir(config["cwd"])
    outcome = None
    size = ray.train.get_context().get_world_size()
    for n, trial in enumerate(trials):
        start = entry if n == 0 else time.time()
        if trial.hardware.world_size < size:
            size = trial.hardware.world_size
            if not process_group.narrow(size):  # part of the trial's rank_prep
                return None  # the trials left run on the group's first ranks
        stamps = ({"process_start": process_start(), "imported": IMPORTED_AT,
                   "loop_entry": entry} if n == 0 else {"loop_entry": start})
        ctx = _context(trial, config, stamps)
        if queue is not None and ctx.rank == 0:
            queue.put(("start", n, start))
        watchdog = _watchdog(config.get("timeout_s"))  # per trial, from its start
        try:
            records = run_worker(trial, ctx)
        finally:
            if watchdog:
                watchdog.cancel()
        if workloads.get(trial.workload_name).saves_checkpoint(trial.workload):
            # (such a trial always runs alone: plan.worker_groups) Every rank reports exactly
            # once (a rank that skipped it would hang the group), after the timed run; rank 0
            # hands over the best epoch's weights as a Ray Train checkpoint.
            folder = Path(ctx.artifact_dir or "") / "checkpoint"
            keep = ctx.rank == 0 and ctx.artifact_dir is not None and folder.is_dir()
            ray.train.report({"checkpointed": keep},
                             checkpoint=ray.train.Checkpoint.from_directory(str(folder))
                             if keep else None)
        if records and config.get("parcels") is not None:  # nodes may share no disk
            _send_files(config["parcels"], trial, config["trace_dir"])
        if records:  # rank 0: when its part ended, for the teardown that follows
            records[0].stamps["loop_exit"] = time.time()
            outcome = metrics.outcome(records)
        if queue is not None:
            if outcome:
                queue.put(("done", n, outcome))
                if n + 1 < len(trials):
                    _wait_for_row(config["handoff"], config["positions"][n])
            outcome = None
            _release(ctx)
    return outcome


def _send_files(parcels: Any, trial: TrialSpec, trials_dir: str) -> None:
    """Rank 0, after a trial: its files to the driver, unless the driver's folder is here."""
    token = ray.get(parcels.get_token.remote())
    if artifacts.shared(trials_dir, token):
        return
    files = artifacts.collect(trials_dir, trial)
    if files:
        ray.get(parcels.put.remote(Path(artifact_dir(trials_dir, trial)).name, files))


ROW_WAIT_S = 120.0  # past this the driver is stuck elsewhere; the group goes on regardless


def _wait_for_row(handoff: Any, position: int) -> None:
    try:
        ray.get(handoff.wait.remote(position), timeout=ROW_WAIT_S)
    except ray.exceptions.GetTimeoutError:
        log.warning("no word from the driver %g s after trial %d ended; going on",
                    ROW_WAIT_S, position)


def _context(trial: TrialSpec, config: dict[str, Any], stamps: dict[str, float]
             ) -> WorkerContext:
    rt = ray.get_runtime_context()
    logical = config.get("logical_gpus", False)
    # the rank's variables as process_group.py set them (narrowed to the trial's ranks where a
    # worker group runs a trial of fewer: process_group.narrow); the GPU is the one Ray gave
    return WorkerContext.from_env(
        trial.hardware, device=torch.device("cpu") if logical else ray.train.torch.get_device(),
        node_id=rt.get_node_id(), node_ip=ray.util.get_node_ip_address(),
        accelerator_ids=[str(g) for g in rt.get_accelerator_ids().get("GPU", [])],
        trace_path=trace_path(config["trace_dir"], trial),
        artifact_dir=artifact_dir(config["trace_dir"], trial),
        stamps=stamps,
    )


def _release(ctx: WorkerContext) -> None:
    """Between two trials in one process: nothing of the last one may stay behind. Its
    workload was local to the timed loop; collect what cycles kept, give cached CUDA blocks
    back (the next trial resets its peaks on an empty cache), drop compiled graphs."""
    gc.collect()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()


def _watchdog(limit_s: float | None) -> threading.Timer | None:
    """End this worker process when the trial's time is up.

    A rank stuck in a collective or a long kernel cannot be interrupted from Python, so the
    process exits; the driver sees the attempt outlive its limit and records a timeout."""
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

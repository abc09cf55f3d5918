"""The local runner: trials in this process, without Ray (a lent GPU box, a quick check).

Same workload code, timed loop, metrics and results as the Ray path; one rank runs here, more
ranks are spawned as local processes over torch.distributed (gloo on CPU, nccl on GPU), one
trial after another. Imports no Ray, so it works where Ray is not installed.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from raybench import fabric, metrics
from raybench.context import WorkerContext, process_start
from raybench.failures import failure
from raybench.rank.launched import run_rank
from raybench.rank.loop import run_worker
from raybench.records import TrialOutcome
from raybench.runners.serial import PR_SET_PDEATHSIG, SerialRunner, gpus_missing
from raybench.scenarios.run import run_trial as run_scenario
from raybench.trials import TrialSpec, artifact_dir, trace_path


class LocalRunner(SerialRunner):
    name = "local"

    def system(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None]:
        return {"mode": "in-process, no Ray"}, None

    def run_one(self, trial: TrialSpec) -> TrialOutcome:
        return run_local(trial, str(self.out / "trials"))


def run_local(trial: TrialSpec, trace_dir: str | None = None) -> TrialOutcome:
    """One trial in this process (or spawned ranks); returns the same fields as a Ray trial."""
    why = gpus_missing(trial)
    if why:
        return TrialOutcome.failed("infeasible", why)
    if trial.inference is not None:
        return run_scenario(trial, "local", artifacts=artifact_dir(trace_dir, trial))
    hw = trial.hardware
    try:
        if hw.world_size == 1 and not hw.env:  # hardware.env: a fresh process, set at start
            device = torch.device("cuda", 0) if hw.use_gpu else torch.device("cpu")
            ctx = WorkerContext.single(hw, device, trace_path=trace_path(trace_dir, trial),
                                       artifact_dir=artifact_dir(trace_dir, trial),
                                       stamps={"loop_entry": time.time()})
            return metrics.outcome(run_worker(trial, ctx))
        return metrics.outcome(_spawn(trial, trace_dir))
    except Exception as e:  # a failed trial is a row here too
        return failure(e, trial.resources())


def _spawn(trial: TrialSpec, trace_dir: str | None) -> list[dict[str, Any]]:
    """Ranks as local processes over torch.distributed (hardware.backend: gloo on CPU
    and on shared GPUs, nccl between GPUs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "records.json"
        mp.spawn(_rank_main, args=(trial, port, str(result), trace_dir, os.getpid()),
                 nprocs=trial.hardware.world_size, join=True)
        return json.loads(result.read_text())


def _rank_main(rank: int, trial: TrialSpec, port: int, result: str,
               trace_dir: str | None, driver: int) -> None:
    entry = time.time()
    end_with(driver)
    hw = trial.hardware
    if hw.nccl_between_ranks:  # to read back which network NCCL chose
        os.environ.update(fabric.debug_env(trial.key))
    os.environ.update(hw.env)  # before the process group and CUDA start; the trial's win
    # what torchrun gives a rank on one node: the process group and the context read it
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(hw.world_size),
                      LOCAL_WORLD_SIZE=str(hw.world_size), GROUP_RANK="0")
    run_rank(trial, trace_dir, Path(result),
             {"process_start": process_start(), "loop_entry": entry})


def end_with(driver: int) -> None:
    """This rank ends when the driver that spawned it does, however it ends: a SIGKILLed
    driver's ranks otherwise ran on with parent 1 for the rest of their trial, taking the cores
    a `--resume` then measures on. Linux's parent-death signal (prctl), set before any work;
    elsewhere a thread that watches the parent."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux
        threading.Thread(target=_watch, args=(driver,), daemon=True, name="raybench-parent"
                         ).start()
    if os.getppid() != driver:  # the driver died before the signal was set
        os._exit(1)


def _watch(driver: int) -> None:
    while os.getppid() == driver:
        time.sleep(1.0)
    os._exit(1)

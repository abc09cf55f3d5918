"""The torchrun runner: each trial's ranks started by PyTorch's own launcher on this machine.

`--runner torchrun` runs a trial as a user of hand-written torchrun scripts would: `python -m
torch.distributed.run --standalone --nproc-per-node N` starts the ranks, each builds its
context from the variables torchrun sets (`WorkerContext.from_env`) and runs the same rank
entry as every runner's ranks (`rank.entry.run_trials`, through `rank.launched.run_rank`);
rank 0 writes every rank's records for this process, which turns them into the trial's
outcome. No Ray. A
rank that fails writes its failure first, so the row says why (out of memory, an error) rather
than only that the launcher exited. Inference trials run their replicas in this process, as
the local runner does.

This file is the runner entire: the driver side (`TorchrunRunner`) and, run as `python -m
raybench.runners.torchrun`, the rank side.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from raybench import fabric, metrics
from raybench.failures import failure
from raybench.records import TrialOutcome
from raybench.runners.serial import PR_SET_PDEATHSIG, SerialRunner
from raybench.scenarios.run import run_trial as run_scenario
from raybench.trials import TrialSpec, artifact_dir

LAUNCHER = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
TAIL = 3000  # characters of the launcher's output an error row keeps


class TorchrunRunner(SerialRunner):
    name = "torchrun"

    def start(self) -> None:
        clear_stale_work()

    def system(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None]:
        return {"mode": "torchrun (torch.distributed.run), this machine, no Ray"}, None

    def run_one(self, trial: TrialSpec) -> TrialOutcome:
        return run_torchrun(trial, str(self.out / "trials"), self.spec.execution.trial_timeout_s)


def run_torchrun(trial: TrialSpec, trace_dir: str, timeout_s: float | None) -> TrialOutcome:
    """One trial's ranks under torchrun; its outcome, a failed one as a row's status."""
    if trial.inference is not None:  # replicas, not ranks: in this process
        return run_scenario(trial, "local", artifacts=artifact_dir(trace_dir, trial))
    hw = trial.hardware
    env = {**os.environ, **hw.env}
    if hw.nccl_between_ranks:  # to read back which network NCCL chose
        env.update(fabric.debug_env(trial.key))
    with tempfile.TemporaryDirectory(prefix=f"{WORK_PREFIX}{os.getpid()}-") as tmp:
        work = Path(tmp)
        (work / "trial.pkl").write_bytes(pickle.dumps(trial))
        cmd = [*LAUNCHER, f"--nproc-per-node={hw.world_size}", "-m", __name__, str(work),
               trace_dir]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=timeout_s, preexec_fn=_end_with_this_process)
        except subprocess.TimeoutExpired:
            return TrialOutcome.failed("timeout", f"the trial ran past {timeout_s:g} s "
                                       "(execution.trial_timeout_s)")
        records = work / "records.json"
        if proc.returncode == 0 and records.exists():
            return metrics.outcome(json.loads(records.read_text()))
        failed = sorted(work.glob("failed_*.json"))  # the lowest rank's reason
        if failed:
            return TrialOutcome.from_dict(json.loads(failed[0].read_text()))
        output = (proc.stdout + proc.stderr)[-TAIL:]
        return TrialOutcome.failed("error", f"torchrun exited with {proc.returncode}: {output}")


WORK_PREFIX = "raybench-torchrun-"  # + the driver's pid: whose work folder it is


def clear_stale_work(tmp: str | None = None) -> list[Path]:
    """Remove the work folders of torchrun drivers that are gone: a driver killed by SIGKILL
    never ran its folder's clean-up, and each such folder kept a pickled trial and any records
    (seen after a killed sweep). A folder whose driver still runs (a sweep beside this one) is
    left alone. Returns what was removed."""
    removed = []
    for folder in Path(tmp or tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        pid = folder.name[len(WORK_PREFIX):].partition("-")[0]
        if not (folder.is_dir() and pid.isdigit()) or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        pass
    return True


def _end_with_this_process() -> None:
    """In the launcher's process, before it starts: it gets SIGTERM when the driver ends,
    however the driver ends (a SIGKILLed driver's ranks would otherwise run on, taking the
    cores a `--resume` then measures on), and ends its ranks in turn."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the launcher outlives a killed driver
        pass


def _rank(work: Path, trace_dir: str) -> None:
    """One rank, as torchrun started it; a failure is written down for the driver first."""
    entry = time.time()
    # after the entry stamp: a rank's imports are part of its measured start
    from raybench.context import process_start
    from raybench.rank.launched import run_rank

    trial: TrialSpec = pickle.loads((work / "trial.pkl").read_bytes())
    try:
        run_rank(trial, trace_dir, work / "records.json",
                 {"process_start": process_start(), "loop_entry": entry})
    except BaseException as e:
        out = failure(e, trial.resources())
        rank = int(os.environ["RANK"])
        (work / f"failed_{rank:04d}.json").write_text(json.dumps(out.to_dict(), default=str))
        raise


if __name__ == "__main__":
    _rank(Path(sys.argv[1]), sys.argv[2])

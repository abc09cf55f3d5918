"""What the processes that never run a tensor import.

Tune's trial process and the Train controller load no torch: on the 2-core machine importing
torch and a workload's model library cost each of them 2.7 s of a core at every worker group's
start (docs/journal/2026-11.md). They get a trial as `mailbox.TrialRef` (its spec by reference), the
rank entry `rank.entry.run_trials` with its Ray side `ranks.RayRanks`, and the backend
`process_group.ProcessGroupConfig`, all unpickled by reference to their modules. The sweep's driver validates the workload's parameters, so it
imports the workload module and torch, but not the model library (torchvision: 1.4 s), nor
MLflow for Tune's count of its callbacks (0.7 s).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from raybench.grid import expand
from raybench.rank.entry import run_trials
from raybench.runners.on_ray.mailbox import TrialRef
from raybench.runners.on_ray.process_group import ProcessGroupConfig
from raybench.runners.on_ray.ranks import RayRanks
from raybench.runners.on_ray.trial import tune_entry
from raybench.spec import load_sweep
from tests.conftest import ROOT

# Unpickles each of the pickles on stdin in turn, printing after each what is loaded so far
LOAD = ("import pickle, sys\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    pickle.load(sys.stdin.buffer)\n"
        "    print(sorted(m for m in sys.modules if m == 'torch' or "
        "m.startswith('raybench.workloads.')))")


def _loaded_by(*objects: object) -> list[str]:
    """What one fresh interpreter has loaded after unpickling each of `objects`, in turn."""
    blob = b"".join(pickle.dumps(o) for o in objects)
    proc = subprocess.run([sys.executable, "-c", LOAD, str(len(objects))], input=blob, cwd=ROOT,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout.decode().strip().splitlines()


def test_a_trial_ref_the_backend_and_the_train_function_load_no_torch(write_sweep):
    (trial,) = expand(load_sweep(write_sweep(), ["grid={}", "hardware.cpu_workers=2"]))
    # the spec's place holds a ray.ObjectRef in a run; any picklable stands in here
    ref = TrialRef(trial.index, trial.key, trial.hardware, trial.resources(), spec=None)
    side = RayRanks(specs=[], mailbox=None, run="r", positions=[0], trace_dir="/tmp")
    light, full = _loaded_by((ref, ProcessGroupConfig(backend="gloo"), run_trials, side,
                              tune_entry),
                             # the TrialSpec itself would: its workload parameters are its
                             # workload module's class
                             trial)
    assert light == "[]"
    assert "torch" in full


# Each sweep (a file and its overrides, split at "--") validated in turn in one interpreter,
# printing after each whether torchvision is loaded yet: the sweeps expected not to load it come
# first, so each answer is that sweep's own (one interpreter rather than three: 14 s less here)
VALIDATE = ("import sys; from raybench import cli\n"
            "for sweep in ' '.join(sys.argv[1:]).split(' -- '):\n"
            "    path, *overrides = sweep.split()\n"
            "    assert cli.load(path, overrides)\n"
            "    print('torchvision' in sys.modules)")


def _printed(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    """What `code` prints, run in a fresh interpreter with `args`."""
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_validating_an_image_sweep_imports_no_model_library():
    loaded = _printed(VALIDATE, "sweeps/local_cpu.yaml", "--",
                      "sweeps/efficientnet_cpu.yaml", "workload.image_size=64", "--",
                      # an EfficientNet left at its native resolution reads it from
                      # torchvision's weights
                      "sweeps/efficientnet_cpu.yaml")
    assert loaded.split() == ["False", "False", "True"]


def test_the_sweep_driver_starts_without_torch():
    """The driver imports the workload's module (torch, 1.2-1.5 s here) on a thread beside
    Ray's start (sweep/command.py); a module the driver imports at its top that imports torch puts
    that time back in front of every sweep, as `sysinfo` did when it named the code."""
    assert _printed("import sys, raybench.sweep.command; print('torch' in sys.modules)") == "False"


def test_the_sweep_driver_starts_without_scipy_stats():
    """scipy.stats (0.6-1.3 s to import here) only where something is judged or certified:
    imported at the top of scenarios/mlperf.py, which the report imports, it doubled the
    sweep driver's imports (1.38 against 0.65 s), in every sweep and every test's sweep."""
    code = "import sys, raybench.sweep.command; print('scipy.stats' in sys.modules)"
    assert _printed(code) == "False"


class _Context:
    def get_world_rank(self): return 1
    def get_world_size(self): return 2
    def get_local_rank(self): return 1
    def get_local_world_size(self): return 2
    def get_node_rank(self): return 0


def test_a_rank_joins_with_torchruns_variables_and_nccl_fails_rather_than_hangs(monkeypatch):
    """The GPU path's settings, checked on CPU: the call is recorded, not made."""
    import ray.train
    import torch.distributed as dist

    from raybench.runners.on_ray import process_group

    calls = []
    monkeypatch.setattr(ray.train, "get_context", _Context)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT"):
        monkeypatch.delenv(name, raising=False)
    process_group._join("nccl", "tcp://10.0.0.1:29500", 60.0)
    (kw,) = calls
    assert kw["backend"] == "nccl" and kw["init_method"] == "tcp://10.0.0.1:29500"
    assert (kw["rank"], kw["world_size"]) == (1, 2) and kw["timeout"].total_seconds() == 60
    assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                    "NODE_RANK")] == ["1", "2", "1", "2", "0"]
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")  # the user's setting wins
    process_group._join("nccl", "tcp://10.0.0.1:29500", 60.0)
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    process_group._join("gloo", "tcp://10.0.0.1:29500", 60.0)  # gloo: nothing of NCCL's
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ


def test_the_backend_config_is_recorded_as_torch():
    config = ProcessGroupConfig(backend="nccl")
    assert config.to_dict() == {"backend": "nccl", "timeout_s": 1800.0}
    assert config.framework.value == "torch"  # what Ray's run state and dashboard show


CENSUS = ("import sys; from ray import tune; from ray.air._internal import usage; "
          "from ray.tune.stopper import FunctionStopper; "
          "from raybench.runners.on_ray.runner import _Rows; rows = _Rows([], [], None, None); "
          "assert FunctionStopper.is_valid_function(rows); "
          "config = tune.RunConfig(stop=rows); usage.tag_callbacks(config.callbacks); "
          "print('mlflow' in sys.modules); "
          # then, in the same interpreter, what a tune.Callback would have cost
          "usage.tag_callbacks([tune.Callback()]); print('mlflow' in sys.modules)")


def test_the_sweep_driver_takes_its_rows_from_tune_without_the_callback_census():
    """Tune counts the callbacks it is given for Ray's usage statistics, and counting imports
    Ray's MLflow integration, which imports MLflow wherever it is installed (1.7 s of every
    sweep's start): raybench's rows come through Tune's `stop` callable instead, which Tune
    takes as a function stopper and does not count."""
    pytest.importorskip("mlflow")  # the dev extra's: the census would import it
    assert _printed(CENSUS).split() == ["False", "True"]


def test_a_ranks_context_comes_from_torchruns_variables(monkeypatch):
    """Every launched rank builds its context from RANK, LOCAL_RANK, WORLD_SIZE and the node's
    rank; a single in-process rank ignores them (raybench may run inside a torchrun job)."""
    import torch

    from raybench.context import WorkerContext
    from raybench.sections import HardwareSpec

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="RANK, LOCAL_RANK, WORLD_SIZE"):
        WorkerContext.from_env(HardwareSpec())
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("GROUP_RANK", "2")
    ctx = WorkerContext.from_env(HardwareSpec(num_gpus=4), stamps={"loop_entry": 1.0})
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.node_rank) == (5, 1, 8, 2)
    assert ctx.device == torch.device("cuda", 1) and ctx.stamps == {"loop_entry": 1.0}
    shared = WorkerContext.from_env(HardwareSpec(num_gpus=2, ranks_per_gpu=2))
    assert shared.device == torch.device("cuda", 0)  # local ranks 0 and 1 share GPU 0
    assert WorkerContext.from_env(HardwareSpec(cpu_workers=8)).device == torch.device("cpu")
    given = WorkerContext.from_env(HardwareSpec(num_gpus=4), device=torch.device("cuda", 3))
    assert given.device == torch.device("cuda", 3)  # Ray's choice wins
    one = WorkerContext.single(HardwareSpec(), torch.device("cpu"))
    assert (one.rank, one.local_rank, one.world_size, one.node_rank) == (0, 0, 1, 0)


def test_a_workload_in_a_folder_of_its_own_loads_alone():
    """A rank looks its workload up by name and imports that file or folder alone: llama, a
    folder, had made `workloads.get` import every sibling (the detector's, rasterio's)."""
    code = ("import sys; from raybench import workloads; workloads.get('llama'); "
            "print(sorted(m.split('.')[2] for m in sys.modules "
            "if m.startswith('raybench.workloads.') and not m.startswith('raybench.workloads.llama')))")
    assert _printed(code) == "[]"

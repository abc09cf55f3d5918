"""Every use raybench makes of Ray beyond its public API (raybench/runners/on_ray/private.py), checked
against the installed Ray: `make test` runs these on the locked release, `make test-ray-oldest`
on the oldest supported one. A failure names the function to mend; each says what a Ray release
that changed it breaks. No other raybench module reaches into Ray's private modules."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from raybench.runners.on_ray import private as ray_private

RAYBENCH = Path(__file__).resolve().parents[1] / "raybench"


def _private(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "ray" and any(p.startswith("_") or p == "v2" for p in parts[1:])


def test_only_ray_private_imports_rays_internals():
    """`ray._private`, any `_internal`, Train V2's unexported `ray.train.v2...`: here only."""
    found = []
    for path in RAYBENCH.rglob("*.py"):
        if path.relative_to(RAYBENCH).as_posix() == "runners/on_ray/private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(RAYBENCH)}: {n}" for n in names if _private(n)]
    assert found == []


def test_the_check_finds_a_private_import():
    assert _private("ray._private.worker") and _private("ray.train.v2.api.x")
    assert _private("ray.air._internal") and not _private("ray.train")
    assert not _private("ray.util.queue")


def test_visible_gpus_reads_rays_own_count():
    """Changed: None, and an embedded Ray counts its GPUs itself (the sweep still runs)."""
    gpus = ray_private.visible_gpus()
    assert isinstance(gpus, int) and gpus >= 0


def test_the_autoscaler_monitors_are_found_where_ray_keeps_its_processes():
    """Outside a Ray: none. Inside an embedded one, the monitor is found and killed at once
    (tests/integration/test_placement_ray.py, test_blocked_worker_group_gives_up_quickly,
    asserts its SIGKILL). Changed: none found, and every sweep's end takes a second longer."""
    assert ray_private.autoscaler_monitors() == []
    from ray._private import ray_constants, worker

    assert ray_constants.PROCESS_TYPE_MONITOR == "monitor" and hasattr(worker, "_global_node")


def test_the_data_parallel_trainer_takes_what_raybench_gives_it():
    """Changed: every trial on Ray fails, naming ray_private.data_parallel_trainer."""
    trainer = ray_private.data_parallel_trainer()
    params = inspect.signature(trainer).parameters
    for name in ("train_loop_per_worker", "train_loop_config", "backend_config",
                 "scaling_config", "run_config"):
        assert name in params, name
    assert callable(trainer.fit)


def test_the_torch_framework_is_rays_enum_for_torch():
    """Changed: None; Ray's run-state export may then refuse the backend's framework."""
    assert ray_private.torch_framework().value == "torch"


def test_the_autoscaling_coordinator_can_be_asked_for():
    """Changed: nothing is started beforehand, and the first trial waits for it again (its
    function is looked up here rather than called: calling it needs a running Ray)."""
    module = importlib.import_module(
        "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator")
    assert callable(module.get_or_create_autoscaling_coordinator)


@pytest.mark.parametrize("fn", ["visible_gpus", "autoscaler_monitors", "torch_framework",
                                "start_autoscaling_coordinator"])
def test_a_use_that_ray_moved_falls_back(fn, monkeypatch):
    """A use raybench can do without gives its fallback when its Ray module is gone."""
    import builtins

    real = builtins.__import__

    def gone(name, *args, **kwargs):
        if _private(name):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", gone)
    assert getattr(ray_private, fn)() in (None, [])


def test_a_missing_trainer_says_what_to_do(monkeypatch):
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
        (_ for _ in ()).throw(ImportError(name)) if name.startswith("ray.train.v2")
        else real(name, *a, **k)))
    with pytest.raises(ImportError, match="raybench supports"):
        ray_private.data_parallel_trainer()

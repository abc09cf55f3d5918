"""Placement on a real Ray: plans of every sweep file against clusters shaped like their systems,
and a worker group that cannot be placed ending quickly instead of hanging."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group

from raybench import cluster
from raybench.grid import expand
from raybench.plan import placement
from raybench.spec import load_sweep
from tests.conftest import ROOT

pytestmark = pytest.mark.ray
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


def test_sweep_files_exist():
    assert {p.name for p in SWEEPS} >= {"local_cpu.yaml", "dgx_a100.yaml", "gb200.yaml",
                                        "laptop_rtx3080ti.yaml", "h100.yaml"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_sweep_plans_on_a_cluster_shaped_like_its_system(path: Path):
    spec = load_sweep(path)
    trials = expand(spec)
    assert trials or spec.preprocess is not None
    sysspec = spec.system
    c = Cluster()
    try:
        for _ in range(sysspec.nodes):
            c.add_node(num_cpus=sysspec.cpus_per_node or 4, num_gpus=sysspec.gpus_per_node)
        ray.init(address=c.address)
        nodes = cluster.nodes()
        assert len(nodes) == sysspec.nodes
        assert [placement(t, nodes) for t in trials] == [None] * len(trials)
    finally:
        ray.shutdown()
        c.shutdown()


def test_blocked_worker_group_gives_up_quickly(tmp_path, write_sweep):
    """Resources exist but are held: Ray Train's start deadline must end the trial, once."""
    from raybench.spec import ExecutionSpec
    from raybench.trial import run_trial

    (trial,) = expand(load_sweep(write_sweep(), ["grid={}"]))
    ray.init(num_cpus=2)
    try:
        hog = placement_group([{"CPU": 2}])
        ray.get(hog.ready(), timeout=30)
        t0 = time.monotonic()
        out = run_trial(trial, str(tmp_path / "ray"), str(tmp_path / "trials"),
                        ExecutionSpec(start_timeout_s=5))
        elapsed = time.monotonic() - t0
        remove_placement_group(hog)
    finally:
        ray.shutdown()
    assert out["status"] == "infeasible", out
    assert "could not be placed" in out["error"] and "'CPU': 1.0" in out["error"]
    assert elapsed < 45

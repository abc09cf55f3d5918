"""Placement strategy and concurrency limits against cluster shapes, and copying a run to
shared storage."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from raybench.grid import expand
from raybench.results.rundir import publish
from raybench.runners.on_ray.plan import NODE_TOKEN, concurrency_limit, strategy
from raybench.spec import load_sweep

SWEEP = """
name: p
system: {label: s}
workload: {name: resnet, depth: 18, image_size: 32, batch_size: 4}
hardware: {num_gpus: 1, cpus_per_worker: 4}
grid: {num_gpus: %s}
"""
DGX = {"CPU": 256.0, "GPU": 8.0, NODE_TOKEN: 1.0}


def trials(write_sweep, gpus):
    return expand(load_sweep(write_sweep(SWEEP % gpus)))


def test_a_trial_is_packed_when_one_node_holds_it_and_spread_otherwise(write_sweep):
    t1, t8, t16 = trials(write_sweep, "[1, 8, 16]")
    two = [DGX, DGX]
    assert strategy(t8, two, "auto", "exclusive") == "PACK"
    assert strategy(t16, two, "auto", "exclusive") == "SPREAD"
    assert strategy(t1, two, "spread", "exclusive") == "SPREAD"
    assert strategy(t16, two, "auto", "per_node") == "STRICT_PACK"


def test_concurrency_limits(write_sweep):
    one_gpu = trials(write_sweep, "[1]")
    assert concurrency_limit(one_gpu, [DGX, DGX], "exclusive")[0] == 1
    assert concurrency_limit(one_gpu, [DGX, DGX], "pack")[0] == 16  # every GPU busy
    assert concurrency_limit(one_gpu, [DGX, DGX], "per_node")[0] == 2  # one trial per node
    # the largest trial of the grid bounds the limit: 4-GPU trials fit twice per DGX
    mixed = trials(write_sweep, "[1, 4]")
    limit, why = concurrency_limit(mixed, [DGX, DGX], "pack")
    assert limit == 4 and "pack: 4 trials" in why
    # CPUs bind before GPUs: 3 CPUs hold two 1-CPU workers plus two Tune trials' 0.01 CPU...
    small = [{"CPU": 3.0, "GPU": 4.0}]
    cpu1 = expand(load_sweep(write_sweep((SWEEP % "[1]").replace("cpus_per_worker: 4",
                                                                   "cpus_per_worker: 1"))))
    assert concurrency_limit(cpu1, small, "pack")[0] == 2
    # ...and nodes without the per-node token hold no per_node trial
    assert concurrency_limit(one_gpu, [{"CPU": 256.0, "GPU": 8.0}], "per_node")[0] == 1


def test_publish_copies_the_run_directory(tmp_path):
    out = tmp_path / "results" / "sweep" / "run1"
    (out / "trials").mkdir(parents=True)
    pd.DataFrame({"a": [1]}).to_parquet(out / "results.parquet")
    (out / "trials" / "0000_k.json").write_text("{}")
    (out / "ray").mkdir()
    (out / "ray" / "local-only").write_text("x")
    dest = publish(out, f"file://{tmp_path}/shared", "sweep")
    assert dest == f"file://{tmp_path}/shared/sweep/run1"
    copied = tmp_path / "shared" / "sweep" / "run1"
    assert pd.read_parquet(copied / "results.parquet")["a"].tolist() == [1]
    assert (copied / "trials" / "0000_k.json").read_text() == "{}"
    assert not (copied / "ray").exists()
    assert publish(out, str(tmp_path / "plain"), "sweep").endswith("plain/sweep/run1")
    assert (tmp_path / "plain" / "sweep" / "run1" / "results.parquet").is_file()


def test_worker_groups_share_workers_by_shape_only(write_sweep):
    from raybench.runners.on_ray.plan import worker_groups

    spec = load_sweep(write_sweep("""
        name: g
        system: {label: s}
        workload: {name: resnet, depth: 18, image_size: 32, batch_size: 4}
        hardware: {num_gpus: 0, cpu_workers: 1}
        grid: {cpu_workers: [1, 2], batch_size: [4, 8, 16]}
        """))
    ts = expand(spec)
    ranks = {i: t.hardware.cpu_workers for i, t in enumerate(ts)}
    strategies = {t.key: "PACK" for t in ts}
    # process isolation: every trial starts its own workers
    assert worker_groups(ts, strategies, "process", 1) == [[i] for i in range(len(ts))]
    # worker, one trial at a time, packed: one group of every rank count, the two-rank trials
    # first (grid order among them), so that its second rank can leave for the one-rank ones
    assert worker_groups(ts, strategies, "worker", 1) == [[3, 4, 5, 0, 1, 2]]
    # room for two trials at once: a group per rank count, each dealt over two groups
    groups = worker_groups(ts, strategies, "worker", 2)
    assert sorted(map(len, groups)) == [1, 1, 2, 2]
    for g in groups:
        assert g == sorted(g) and len({ranks[i] for i in g}) == 1
    # spread: a spread group's first ranks are not a spread placement of fewer
    spread = worker_groups(ts, {t.key: "SPREAD" for t in ts}, "worker", 1)
    assert spread == [[0, 1, 2], [3, 4, 5]]
    # a different placement or environment is a different worker group
    strategies[ts[0].key] = "SPREAD"
    assert [0] in worker_groups(ts, strategies, "worker", 1)
    env = expand(load_sweep(spec.source, ["grid={env.X: [a, b]}"]))
    assert len(worker_groups(env, {t.key: "PACK" for t in env}, "worker", 1)) == 2


def test_a_trial_that_keeps_a_checkpoint_runs_alone(write_sweep):
    from raybench.runners.on_ray.plan import worker_groups
    from tests.conftest import ROOT

    ts = expand(load_sweep(ROOT / "sweeps" / "xview3_cpu.yaml",
                           ["workload.save_checkpoints=true", "grid={batch_size: [2, 4]}"]))
    assert worker_groups(ts, {t.key: "PACK" for t in ts}, "worker", 1) == [[0], [1]]
    ts = expand(load_sweep(ROOT / "sweeps" / "xview3_cpu.yaml", ["grid={batch_size: [2, 4]}"]))
    assert worker_groups(ts, {t.key: "PACK" for t in ts}, "worker", 1) == [[0, 1]]


def test_an_embedded_ray_counts_the_gpus_ray_finds_within_cuda_visible_devices(monkeypatch):
    # the driver starts its Ray while torch is still being imported: the count is Ray's own
    from ray._private.accelerators import nvidia_gpu

    from raybench.runners.on_ray import cluster

    manager = nvidia_gpu.NvidiaGPUAcceleratorManager
    monkeypatch.setattr(manager, "get_current_node_num_accelerators", staticmethod(lambda: 4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cluster.local_shape()["GPU"] == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert cluster.local_shape()["GPU"] == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cluster.local_shape()["GPU"] == 0


def test_tune_is_quiet_wherever_raybench_takes_its_ray_unless_verbose(monkeypatch):
    # `bench overhead` never passes through the sweep's --verbose switch, and Tune's experiment
    # box landed on its stdout, in front of its JSON line
    import ray

    from raybench.runners.on_ray import cluster

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # joins nothing, starts nothing
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)
    assert cluster.connect(None) is False
    assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0"
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT")
    monkeypatch.setattr(cluster, "_verbose", True)
    cluster.connect(None)
    assert "RAY_AIR_NEW_OUTPUT" not in os.environ


def test_a_trial_pinned_to_a_node_asks_for_that_node_alone(write_sweep):
    """hardware.node: the workers ask for Ray's own resource of that node (validate pins each
    per-node probe so); a cluster without that node cannot place it, and an inference trial
    may not pin (its replicas are placed by Ray)."""
    from raybench.runners.on_ray.plan import placement
    from raybench.spec import SpecError
    from raybench.validate.command import node_ips

    nodes = [{"CPU": 2.0, "node:127.0.0.2": 1.0, "node:__internal_head__": 1.0,
              NODE_TOKEN: 1.0}, {"CPU": 2.0, "node:127.0.0.3": 1.0, NODE_TOKEN: 1.0}]
    assert node_ips(nodes) == ["127.0.0.2", "127.0.0.3"]
    path = write_sweep()
    a, b = expand(load_sweep(path, ["grid={}", f"grid.node={node_ips(nodes)}"]))
    assert (a.hardware.node, b.hardware.node) == ("127.0.0.2", "127.0.0.3")
    assert a.resources()["per_worker"] == {"CPU": 1.0, "node:127.0.0.2": 0.0001}
    assert placement(a, nodes) is None and placement(b, nodes) is None
    assert "node:127.0.0.3" in placement(b, nodes[:1])  # that node is not in this cluster
    # pinned each to its own node, side by side under per_node as before
    assert concurrency_limit([a, b], nodes, "per_node")[0] == 2
    assert a.key != b.key and "node" not in expand(load_sweep(path, ["grid={}"]))[0].resources()[
        "per_worker"]
    with pytest.raises(SpecError, match="hardware.node"):
        expand(load_sweep(path, ["grid={}", "hardware.node=127.0.0.2", "inference.samples=8"]))

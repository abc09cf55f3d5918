"""Two Ray nodes on one machine (loopback addresses 127.0.0.2 and .3, two logical GPUs each):
a 4-GPU trial is spread over both nodes and records both; with `concurrency: pack` two 1-GPU
trials run at the same time on different GPUs. Workers compute on CPU (`logical_gpus`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import LocalCluster

pytestmark = pytest.mark.ray

SWEEP = """
name: multinode
system: {label: two-nodes, nodes: 2, gpus_per_node: 2}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 4,
           synthetic_samples: 512}
hardware: {num_gpus: 1, cpus_per_worker: 1, dataloader_workers: 0}
execution: {logical_gpus: true, concurrency: pack, start_timeout_s: 60}
measure: {warmup_steps: 2, measure_steps: %(steps)d}
grid: %(grid)s
"""


@pytest.fixture(scope="module")
def two_nodes():
    cluster = LocalCluster(head_ip="127.0.0.2")
    token = '--resources={"raybench_node": 1}'
    try:
        cluster.start_head("--num-cpus=3", "--num-gpus=2", token)
        cluster.add_node("127.0.0.3", "--num-cpus=3", "--num-gpus=2", token)
        cluster.wait_for_nodes(2)
        yield cluster
    finally:
        cluster.stop()


def run(cluster, tmp_path, grid: str, steps: int) -> pd.DataFrame:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP % {"grid": grid, "steps": steps})
    cmd = [sys.executable, "-m", "raybench.sweep", str(sweep), "--address", cluster.address,
           "--output", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["raybench"]["ok"] >= 1
    return pd.read_parquet(tmp_path / "run" / "results.parquet"), proc.stderr


def test_a_trial_larger_than_a_node_is_spread_and_records_both(two_nodes, tmp_path):
    df, _ = run(two_nodes, tmp_path, "{num_gpus: [4]}", steps=3)
    row = df.iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["cluster/placement_strategy"] == "SPREAD"
    assert row["cluster/nodes_used"] == 2
    assert sorted(set(row["cluster/rank_nodes"].split(","))) == ["127.0.0.2", "127.0.0.3"]
    ranks = json.loads(next((tmp_path / "run" / "trials").glob("*.json")).read_text())["ranks"]
    assert {r["node_ip"] for r in ranks} == {"127.0.0.2", "127.0.0.3"}
    assert sorted(r["node_rank"] for r in ranks) == [0, 0, 1, 1]
    # system facts from each node, not only the driver's
    nodes = json.loads((tmp_path / "run" / "system_info.json").read_text())["nodes"]
    assert sorted(nodes) == ["127.0.0.2", "127.0.0.3"]
    assert all("error" not in f and f["versions"]["torch"] for f in nodes.values())


def test_pack_runs_one_gpu_trials_side_by_side_on_different_gpus(two_nodes, tmp_path):
    df, log = run(two_nodes, tmp_path, "{batch_size: [4, 8]}", steps=40)
    assert (df["status"] == "ok").all() and len(df) == 2
    assert "concurrency pack: 4 trials" in log
    assert (df["cluster/placement_strategy"] == "PACK").all()
    a, b = (df.iloc[i] for i in range(2))
    start = [pd.Timestamp(x) for x in (a["start_time"], b["start_time"])]
    end = [pd.Timestamp(x) for x in (a["end_time"], b["end_time"])]
    assert max(start) < min(end), "the two trials did not overlap in time"
    gpus = {(r["cluster/rank_nodes"], r["cluster/rank_gpus"]) for _, r in df.iterrows()}
    assert len(gpus) == 2, f"two trials on one GPU: {gpus}"
    assert all(g[1] != "-" for g in gpus)


def test_per_node_keeps_each_trial_alone_on_its_node(two_nodes, tmp_path):
    sweep = SWEEP.replace("concurrency: pack", "concurrency: per_node")
    path = tmp_path / "per_node.yaml"
    path.write_text(sweep % {"grid": "{batch_size: [4, 8]}", "steps": 40})
    cmd = [sys.executable, "-m", "raybench.sweep", str(path), "--address", two_nodes.address,
           "--output", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, env=two_nodes.env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "concurrency per_node: 2 of 2 nodes" in proc.stderr
    df = pd.read_parquet(tmp_path / "run" / "results.parquet")
    assert (df["cluster/placement_strategy"] == "STRICT_PACK").all()
    start = [pd.Timestamp(x) for x in df["start_time"]]
    end = [pd.Timestamp(x) for x in df["end_time"]]
    assert max(start) < min(end), "the two trials did not overlap in time"
    assert sorted(df["cluster/rank_nodes"]) == ["127.0.0.2", "127.0.0.3"]


INFERENCE = """
name: multinode_inference
system: {label: two-nodes, nodes: 2, gpus_per_node: 2}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8}
hardware: {num_gpus: 1, cpus_per_worker: 3}
execution: {logical_gpus: true, start_timeout_s: 60}
inference: {replicas: 2, samples: 256, project_samples: 13368, accuracy_target: 0.99,
            accuracy_samples: 32, latency_bound_ms: 1000, probe_seconds: 1, min_queries: 40,
            rate_tolerance_pct: 25}
grid: {scenario: [offline, server]}
"""


def test_inference_replicas_on_both_nodes_offline_and_server(two_nodes, tmp_path):
    """Two replicas of one GPU and 3 CPUs on two nodes of 3 CPUs: one lands on each node and
    holds all its CPUs (the pipeline must still move: its inputs take no CPU reservation), the
    Offline row breaks its throughput down per node, the Server search finds a rate, and both
    pass the accuracy gate."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(INFERENCE)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(sweep), "--address",
                           two_nodes.address, "--output", str(out)], cwd=ROOT,
                          env=two_nodes.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    df = pd.read_parquet(out / "results.parquet")
    off, srv = df.iloc[0], df.iloc[1]
    assert list(df["status"]) == ["ok", "ok"], list(df["error"])
    per_node = json.loads(off["infer/node_samples_per_s"])
    assert set(per_node) == {"127.0.0.2", "127.0.0.3"}
    assert sum(per_node.values()) == pytest.approx(off["infer/samples_per_s"])
    assert off["infer/replicas_used"] == 2 and off["infer/samples"] == 256
    assert off["infer/accuracy"] == 1.0 and srv["infer/accuracy_ok"]
    detail = json.loads(next((out / "trials").glob("0000_*.json")).read_text())
    assert sorted(collections_count(r["node"] for r in detail["ranks"]).values()) == [1, 1]
    print(df[["start_time", "end_time", "infer/samples_per_s", "server/rate_qps", "server/probes"]])
    # A generous bound: two 3-thread replicas on two cores have p99 tails of hundreds of ms,
    # and this test is about the Ray path, not this machine (a 200 ms bound failed once in CI).
    assert srv["server/rate_qps"] > 0 and srv["server/p99_ms"] <= 1000
    server_detail = json.loads(next((out / "trials").glob("0001_*.json")).read_text())
    assert {r["node"] for r in server_detail["ranks"]} == {"127.0.0.2", "127.0.0.3"}


def collections_count(items):
    from collections import Counter

    return Counter(items)

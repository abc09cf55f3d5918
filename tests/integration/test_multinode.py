"""Two Ray nodes on one machine (loopback addresses 127.0.0.2 and .3, two logical GPUs each):
a trial larger than a node is spread over both and records both (the FSDP2 trial below); with
`concurrency: pack` two 1-GPU trials run at the same time on different GPUs. Workers compute
on CPU (`logical_gpus`).

Each node runs in a mount namespace of its own with a private tmpfs at one path (where this
machine allows it): the xView3 sweep then runs as on nodes that share no disk (KubeRay pods,
cloud nodes), its data in an S3-compatible server on 127.0.0.1 (the `s3_env` fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import LocalCluster, private_mounts_work

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
def two_nodes(s3_env):
    private = Path("/tmp") / f"rbpriv-{uuid.uuid4().hex[:8]}"  # the same name on every node
    private.mkdir()
    cluster = LocalCluster(head_ip="127.0.0.2",
                           private=str(private) if private_mounts_work(private) else None)
    cluster.env.update(s3_env)
    token = '--resources={"raybench_node": 1}'
    try:
        cluster.start_head("--num-cpus=3", "--num-gpus=2", token)
        cluster.add_node("127.0.0.3", "--num-cpus=3", "--num-gpus=2", token)
        cluster.wait_for_nodes(2)
        yield cluster
    finally:
        cluster.stop()
        private.rmdir()


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


# `concurrency: per_node` (each trial alone on its node, side by side): checked by the validate
# suite's per-node trials on two nodes (tests/integration/test_validate.py), which run it anyway


# 260 samples, 32 batches and a short one of 4 for the two replicas: with 64 (8 batches) and a
# busy process on each core, one replica took every batch before the other's first, and the row
# named one node
INFERENCE = """
name: multinode_inference
system: {label: two-nodes, nodes: 2, gpus_per_node: 2}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8}
hardware: {num_gpus: 1, cpus_per_worker: 3}
execution: {logical_gpus: true, start_timeout_s: 60}
inference: {replicas: 2, samples: 260, project_samples: 13368, accuracy_target: 0.99,
            accuracy_samples: 32, latency_bound_ms: 3000, probe_seconds: 1, min_queries: 40,
            rate_tolerance_pct: 25, early_stopping: false, confirm_runs: 0}
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
    # every sample served, the short last batch's too (each call serves one batch number)
    assert off["infer/replicas_used"] == 2 and off["infer/samples"] == 260
    assert off["infer/accuracy"] == 1.0 and srv["infer/accuracy_ok"]
    detail = json.loads(next((out / "trials").glob("0000_*.json")).read_text())
    assert sorted(collections_count(r["node"] for r in detail["ranks"]).values()) == [1, 1]
    print(df[["start_time", "end_time", "infer/samples_per_s", "server/rate_qps", "server/probes"]])
    # A generous bound: two 3-thread replicas on two cores have p99 tails of hundreds of ms,
    # and this test is about the Ray path, not this machine (a 200 ms bound failed once in CI;
    # 1,000 ms passed at 11.7 and 16.6 queries/s on a quiet machine, p99 804 and 313 ms, and
    # failed at every rate down to 4.4 queries/s with a busy process on each core)
    assert srv["server/rate_qps"] > 0 and srv["server/p99_ms"] <= 3000
    server_detail = json.loads(next((out / "trials").glob("0001_*.json")).read_text())
    assert {r["node"] for r in server_detail["ranks"]} == {"127.0.0.2", "127.0.0.3"}


NO_SHARED_DISK = """
name: no_shared_disk
system: {label: private-disks, nodes: 2, gpus_per_node: 2}
preprocess:
  scenes: %(s3)s/synth/train
  labels: %(s3)s/synth/labels/train.csv
  out: %(s3)s/chips
  chip_size: 128
  generate: &generate {scenes: 3, size: 512x512, seed: 1, density: 30}
workload:
  name: xview3_frcnn
  scenes: %(s3)s/synth/train
  labels: %(s3)s/synth/labels/train.csv
  generate: *generate
  val_scenes: %(s3)s/synth/validation
  val_labels: %(s3)s/synth/labels/validation.csv
  shoreline: %(s3)s/synth/shoreline/validation
  chips_cache: %(private)s/chips
  backbone: resnet18_fpn
  chip_size: 128
  batch_size: 2
  epochs: 1
  save_checkpoints: true
  rpn_proposals_train: 100
  rpn_proposals_test: 100
  roi_samples: 32
  box_head_dim: 64
hardware: {num_gpus: 2, cpus_per_worker: 1, dataloader_workers: 0}
execution: {logical_gpus: true, placement: spread, start_timeout_s: 90}
measure: {warmup_steps: 1}
output: {storage: %(s3)s/results}
"""


def test_xview3_sweep_runs_where_nodes_share_no_disk(two_nodes, tmp_path):
    """No path shared between the nodes and the driver but the S3 bucket: synthetic scenes are
    generated into it, Ray Data tasks on both nodes cut chips from it and write them back, the
    two ranks (one per node) train on them and cut their validation chips into their own
    node's private folder, and rank 0's files reach the driver's run directory, which only the
    driver (in a namespace of its own) sees. Ray Train keeps the best epoch's checkpoint in
    the bucket (output.storage), and the finished run is published there."""
    if not two_nodes.private:
        pytest.skip("no private mounts here (unshare --mount and a tmpfs need CAP_SYS_ADMIN)")
    private = Path(two_nodes.private)
    sweep = tmp_path / "sweep.yaml"  # read by the driver alone
    sweep.write_text(NO_SHARED_DISK % {"s3": f"s3://raybench/{private.name}",
                                       "private": private})
    copied = tmp_path / "copied"  # the driver's run directory, copied out of its namespace
    cmd = two_nodes.private_cmd(
        [sys.executable, "-m", "raybench.sweep", str(sweep), "--address", two_nodes.address,
         "--output", f"{private}/run"], then=f'cp -r "{private}/run" "{copied}"')
    proc = subprocess.run(cmd, cwd=ROOT, env=two_nodes.env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    df = pd.read_parquet(copied / "results.parquet")
    stage = df[df["stage"] == "preprocess"].iloc[0]
    trial = df[df["stage"] != "preprocess"].iloc[0]
    assert stage["status"] == "ok" and trial["status"] == "ok", trial["error"]
    assert stage["preprocess/chips"] > 0 and stage["preprocess/nodes"] == 2  # cut on both nodes
    # the ranks read the stage's chips from the store, one rank per node
    assert trial["workload.chips"].startswith(f"s3://raybench/{private.name}/chips/")
    assert trial["cluster/nodes_used"] == 2 and trial["train/world_size"] == 2
    assert sorted(trial["cluster/rank_nodes"].split(",")) == ["127.0.0.2", "127.0.0.3"]
    assert pd.notna(trial["xview3/aggregate"])
    # rank 0 wrote its files on its own node; they reached the driver's run directory
    folder = next(p for p in (copied / "trials").iterdir() if p.is_dir())
    preds = pd.read_csv(folder / "predictions.csv")
    assert "detect_scene_row" in preds.columns
    epochs = [json.loads(x) for x in (folder / "metrics_epoch.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1]
    assert "files of trial" in proc.stderr  # the driver wrote them from rank 0's parcel
    assert (folder / "best_model.pt").is_file()
    from raybench import store

    with pytest.MonkeyPatch.context() as mp:  # this process reads the bucket too
        for key, value in two_nodes.env.items():
            if key.startswith("AWS_"):
                mp.setenv(key, value)
        ckpt = trial["train/checkpoint"]
        assert ckpt.startswith(f"s3://raybench/{private.name}/results/")
        assert store.is_file(store.join(ckpt, "model.pt"))
        summary = json.loads(proc.stdout.strip().splitlines()[-1])["raybench"]
        assert store.is_file(store.join(summary["storage"], "results.parquet"))


def collections_count(items):
    from collections import Counter

    return Counter(items)


LLAMA = """
name: llama_two_nodes
system: {label: two-nodes, nodes: 2, gpus_per_node: 2}
workload: {name: llama, preset: tiny, seq_len: 64, batch_size: 2, lr: 0.003,
           parallel: {dp_shard: 2}}
hardware: {num_gpus: 1, ranks_per_gpu: 2, cpus_per_worker: 2, dataloader_workers: 0}
execution: {logical_gpus: true, start_timeout_s: 60}
measure: {warmup_steps: 1, measure_steps: 3}
"""


def test_an_fsdp2_trial_spans_both_nodes_and_trains_as_one_process(two_nodes, tmp_path):
    """Two ranks of two CPUs each sharing one GPU (`ranks_per_gpu: 2`, half a GPU each): four
    CPUs, more than a node has, so Ray spreads them, a rank on each node, and the row and the
    trial's record name both nodes. FSDP2 shards the model over them: the same losses step
    by step as one process training the same global batch (issue 64), and the figures of a
    training row. (FSDP2 x TP2 over four ranks and HSDP gave one process's losses too, run by
    hand: docs/journal/2026-11.md.) One trial for both questions: each trial here costs a
    Ray Train start on two shared cores (a 4-rank ResNet trial of its own took 59-100 s)."""
    from raybench.records import present
    from tests.test_llama import train, trial

    sweep = tmp_path / "llama.yaml"
    sweep.write_text(LLAMA)
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(sweep), "--address",
                           two_nodes.address, "--output", str(run_dir)], cwd=ROOT,
                          env=two_nodes.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = pd.read_parquet(run_dir / "results.parquet").iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["train/world_size"] == 2 and row["hardware.ranks_per_gpu"] == 2
    assert row["cluster/placement_strategy"] == "SPREAD" and row["cluster/nodes_used"] == 2
    assert sorted(row["cluster/rank_nodes"].split(",")) == ["127.0.0.2", "127.0.0.3"]
    ranks = json.loads(next((run_dir / "trials").glob("*.json")).read_text())["ranks"]
    assert {r["node_ip"] for r in ranks} == {"127.0.0.2", "127.0.0.3"}
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    # system facts from each node, not only the driver's
    nodes = json.loads((run_dir / "system_info.json").read_text())["nodes"]
    assert sorted(nodes) == ["127.0.0.2", "127.0.0.3"]
    assert all("error" not in f and f["versions"]["torch"] for f in nodes.values())
    assert row["llm/layout"] == "fsdp2" and row["train/global_batch_size"] == 4
    assert row["llm/tokens_per_s"] == pytest.approx(row["train/samples_per_s"] * 64)
    assert row["llm/params_per_rank_m"] == pytest.approx(row["llm/params_m"] / 2, rel=0.02)
    one, _ = train(trial(tmp_path, 1, ["workload.batch_size=4"]), steps=4)
    assert list(row["llm/loss_curve"]) == pytest.approx(one, rel=1e-4)

    # the same layout under torchrun (two CPU ranks on this machine): the same figures filled
    cpu = tmp_path / "llama_cpu.yaml"
    cpu.write_text(LLAMA.replace("num_gpus: 1, ranks_per_gpu: 2, cpus_per_worker: 2",
                                 "cpu_workers: 2"))
    launched = subprocess.run([sys.executable, "-m", "raybench.sweep", str(cpu), "--runner",
                               "torchrun", "--output", str(tmp_path / "torchrun")], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    other = pd.read_parquet(tmp_path / "torchrun" / "results.parquet").iloc[0]
    assert other["status"] == "ok", other["error"]
    filled = {c for c, v in row.items() if present(v)}
    filled_there = {c for c, v in other.items() if present(v)}
    assert filled_there <= filled, sorted(filled_there - filled)
    assert filled - filled_there <= RAY_ONLY, sorted(filled - filled_there - RAY_ONLY)
    assert list(other["llm/loss_curve"]) == pytest.approx(one, rel=1e-4)


# what only a trial through Ray Tune and Train fills: its placement, group and retries
RAY_ONLY = {"cluster/concurrency", "cluster/placement_strategy", "overhead/report_s",
            "trial/group_position", "trial/group_ranks", "trial/isolation", "trial/retries"}

"""Nodes that share no disk, as KubeRay pods and cloud nodes are: the xView3 sweep still runs.

Two Ray nodes on this machine (127.0.0.2 and .3, one logical GPU each) and the driver each run
in a mount namespace of their own with a private tmpfs at the same path: a file one of them
writes there, none of the others sees. The data lives in an S3-compatible server (moto, bound to
127.0.0.1, started and stopped by the `s3_env` fixture): synthetic scenes are generated into it, Ray Data tasks on
both nodes cut chips from it and write them back, the two ranks (one per node) train on them and
cut their validation chips into their own node's private folder. Rank 0's files (predictions,
epoch metrics) must reach the driver's run directory, which only the driver can see."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import LocalCluster

pytestmark = pytest.mark.ray

SWEEP = """
name: no_shared_disk
system: {label: private-disks, nodes: 2, gpus_per_node: 1}
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
  rpn_proposals_train: 100
  rpn_proposals_test: 100
  roi_samples: 32
  box_head_dim: 64
hardware: {num_gpus: 2, cpus_per_worker: 1, dataloader_workers: 0}
execution: {logical_gpus: true, start_timeout_s: 90}
measure: {warmup_steps: 1}
"""


def _private_disks_work(path: Path) -> bool:
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f'mount -t tmpfs tmpfs "{path}"']
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_xview3_sweep_runs_where_nodes_share_no_disk(s3_env, tmp_path):
    private = Path("/tmp") / f"rbpriv-{uuid.uuid4().hex[:8]}"  # the same name on every node
    private.mkdir()
    if not _private_disks_work(private):
        private.rmdir()
        pytest.skip("no private mounts here (unshare --mount and a tmpfs need CAP_SYS_ADMIN)")
    cluster = LocalCluster(head_ip="127.0.0.2", private=str(private))
    cluster.env.update(s3_env)
    try:
        cluster.start_head("--num-cpus=2", "--num-gpus=1")
        cluster.add_node("127.0.0.3", "--num-cpus=2", "--num-gpus=1")
        cluster.wait_for_nodes(2)
        sweep = tmp_path / "sweep.yaml"  # read by the driver alone
        sweep.write_text(SWEEP % {"s3": f"s3://raybench/{private.name}", "private": private})
        copied = tmp_path / "copied"  # the driver's run directory, copied out of its namespace
        cmd = cluster.private_cmd(
            [sys.executable, "-m", "raybench.sweep", str(sweep), "--address", cluster.address,
             "--output", f"{private}/run"], then=f'cp -r "{private}/run" "{copied}"')
        proc = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True,
                              timeout=600)
    finally:
        cluster.stop()
        private.rmdir()
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

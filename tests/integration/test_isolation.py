"""`execution.isolation: worker` on a real Ray: trials of one shape share a worker group, each
still builds everything afresh and measures as on fresh processes; a failed trial ends its
group and the next trial starts fresh workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import LocalCluster

pytestmark = pytest.mark.ray

SWEEP = """
name: isolation
system: {label: local-cpu}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8,
           synthetic_samples: 512, data_path: %(empty)s}
hardware: {num_gpus: 0, cpu_workers: 1, cpus_per_worker: 1, dataloader_workers: 0}
measure: {warmup_steps: 3, measure_steps: 30}
execution: {isolation: %(isolation)s}
grid: %(grid)s
"""


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster()
    try:
        c.start_head("--num-cpus=2")
        c.wait_for_nodes(1)
        yield c
    finally:
        c.stop()


def sweep(cluster, tmp_path: Path, isolation: str, grid: str) -> tuple[pd.DataFrame, list]:
    (tmp_path / "empty").mkdir(exist_ok=True)
    path = tmp_path / f"{isolation}.yaml"
    path.write_text(SWEEP % {"isolation": isolation, "grid": grid,
                             "empty": tmp_path / "empty"})
    out = tmp_path / isolation
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(path), "--address",
                           cluster.address, "--output", str(out)], cwd=ROOT, env=cluster.env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    df = pd.read_parquet(out / "results.parquet").set_index(["workload.data", "workload.seed"])
    pids = {}
    for f in sorted((out / "trials").glob("*.json")):
        detail = json.loads(f.read_text())
        cfg = detail["trial"]
        pids[(cfg["workload"]["data"], cfg["workload"]["seed"])] = [
            r["pid"] for r in detail.get("records") or []]
    return df, pids


def test_a_worker_group_runs_trials_of_one_shape_and_measures_as_fresh_processes(
        cluster, tmp_path):
    df, pids = sweep(cluster, tmp_path, "worker",
                     "{data: [synthetic, imagefolder], seed: [1, 2]}")
    assert (df["trial/isolation"] == "worker").all()
    first, second = df.loc[("synthetic", 1)], df.loc[("synthetic", 2)]
    assert first["status"] == second["status"] == "ok", df["error"]
    # one group: the second trial ran in the first one's process and paid no start-up
    assert (first["trial/group_position"], second["trial/group_position"]) == (0, 1)
    assert pids[("synthetic", 1)] == pids[("synthetic", 2)] and pids[("synthetic", 1)][0] > 0
    assert first["overhead/train_start_s"] > 0 and second["overhead/train_start_s"] != \
        second["overhead/train_start_s"]  # NaN: no workers started for it
    assert second["overhead/fixed_s"] < first["overhead/fixed_s"] / 2
    # a trial that raises is a row and ends its group; the next starts fresh workers
    failed, after = df.loc[("imagefolder", 1)], df.loc[("imagefolder", 2)]
    assert failed["status"] == after["status"] == "error"
    assert "FileNotFoundError" in failed["error"]
    assert failed["trial/group_position"] == 2 and after["trial/group_position"] == 0

    # the same trial under process isolation: its memory peak and step times match
    alone, alone_pids = sweep(cluster, tmp_path, "process", "{seed: [2]}")
    alone = alone.loc[("synthetic", 2)]
    assert alone["status"] == "ok" and alone["trial/isolation"] == "process"
    assert alone_pids[("synthetic", 2)] != pids[("synthetic", 2)]
    print({k: (second[k], alone[k]) for k in ("host/rss_peak_mb", "train/step_time_p50_ms",
                                              "train/samples_per_s", "overhead/fixed_s")})
    assert second["host/rss_peak_mb"] == pytest.approx(alone["host/rss_peak_mb"], rel=0.1)
    assert second["train/step_time_p50_ms"] == pytest.approx(
        alone["train/step_time_p50_ms"], rel=0.25)

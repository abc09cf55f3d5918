"""`ray start --head` + `ray job submit --working-dir .` of the local sweep, with Ray 2.60's token
authentication, as the README's cluster section shows; the cluster is stopped afterwards."""

from __future__ import annotations

import subprocess

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import BIN, LocalCluster

pytestmark = pytest.mark.ray


def test_job_submit_runs_the_local_sweep(tmp_path):
    cluster = LocalCluster()
    try:
        cluster.start_head("--num-cpus=3")
        cluster.wait_for_nodes(1)
        out = tmp_path / "jobrun"
        cmd = [str(BIN / "ray"), "job", "submit", "--address", cluster.dashboard,
               "--working-dir", ".", "--", "python", "-m", "raybench.sweep",
               "sweeps/local_cpu.yaml", "--output", str(out),
               "--set", "measure.measure_steps=4", "--set", "measure.warmup_steps=1",
               # 1 of its 4 trials: the job path is the test
               "--set", "grid={batch_size: [8], cpu_workers: [1]}"]
        proc = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "succeeded" in proc.stdout
        df = pd.read_parquet(out / "results.parquet")
        assert len(df) == 1 and (df["status"] == "ok").all()
        assert (df["train/samples_per_s"] > 0).all()
        # a client without the token is turned away
        env = {k: v for k, v in cluster.env.items() if k != "RAY_AUTH_TOKEN"}
        env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "no-token")
        denied = subprocess.run([str(BIN / "ray"), "job", "list", "--address",
                                 cluster.dashboard], env=env, capture_output=True, text=True,
                                timeout=120)
        assert denied.returncode != 0
    finally:
        cluster.stop()

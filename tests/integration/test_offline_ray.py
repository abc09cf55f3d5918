"""The Offline pass on Ray Data with the calibration replica (fixed_service): every sample
served once, from inputs made before the pass (the short last batch included), the accuracy
check on the pool's first use, and each replica's rate while busy what its service time says."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.ray

# 15 batches of 64 and a short one of 40; a pool of 8 batches, cycled
OFFLINE = """
name: offline_ray
system: {label: vm}
workload: {name: fixed_service, batch_size: 64, service_ms: 20}
hardware: {num_gpus: 0, cpus_per_worker: 1}
inference: {scenario: offline, replicas: 1, samples: 1000, accuracy_target: 0.99,
            accuracy_samples: 100}
"""


def test_offline_on_ray_data_serves_every_sample_from_the_pool(tmp_path):
    sweep = tmp_path / "offline.yaml"
    sweep.write_text(OFFLINE)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(sweep), "--output",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = pd.read_parquet(out / "results.parquet").iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["infer/samples"] == 1000 and row["infer/replicas_used"] == 1
    # the reference covers samples 0-99, in pool batches 0 and 1, compared on first use only
    assert row["infer/accuracy"] == 1.0 and row["infer/accuracy_compared"] == 100
    # 64 samples per 20 ms call: 3,200 samples/s while busy (sleeps overshoot under load)
    assert row["infer/replica_samples_per_s_mean"] == pytest.approx(3200, rel=0.2)
    assert "offline pass of trial" in proc.stderr  # Ray Data's account, in the driver's log

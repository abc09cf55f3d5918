"""The largest-batch search on the Ray path: probes are fresh Tune/Train trials, the answer a row."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from raybench.results import history
from tests.conftest import ROOT

pytestmark = pytest.mark.ray


def test_search_on_ray_records_probes_and_answer(tmp_path):
    path = tmp_path / "s.yaml"
    # A 1 MB budget no process can meet: batch 1 is probed once and the search ends with 0.
    path.write_text(
        "name: s\nsystem: {label: test-cpu}\n"
        "workload: {name: vit_tiles, size: tiny, tile: 64, mode: train}\n"
        "hardware: {cpus_per_worker: 1, memory_budget_mb: 1}\n"
        "measure: {warmup_steps: 1, measure_steps: 2}\n"
        "search: {largest_batch: {max_batch: 8}}\n")
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(path), "--output",
                           str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["raybench"]
    assert summary["largest_batch"][0]["largest_batch"] == 0
    assert summary["largest_batch"][0]["probes"] == {"1": False}
    df = pd.read_parquet(tmp_path / "run" / "results.parquet")
    assert list(df["stage"]) == ["benchmark", "search"]
    assert df["status"][0] == "ok" and df["host/rss_peak_mb"][0] > 1  # ran, but over budget
    assert df["status"][1] == "error" and "not even batch size 1" in df["error"][1]
    assert history.files(tmp_path)

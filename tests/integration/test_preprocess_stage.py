"""The preprocess stage inside a sweep: measured rows, swept over Ray CPUs, cached across runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.ray


def sweep_file(tmp_path, fresh: bool, grid: str) -> str:
    data = tmp_path / "x3"
    path = tmp_path / "pre.yaml"
    path.write_text(textwrap.dedent(f"""
        name: pre
        system: {{label: test-cpu}}
        preprocess:
          scenes: {data}/train
          labels: {data}/labels/train.csv
          out: {tmp_path}/cache
          chip_size: 256
          select: all
          fresh: {str(fresh).lower()}
          generate: {{scenes: 3, size: 600x700, seed: 1}}
        grid: {grid}
        """))
    return str(path)


def run(path: str, out) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", path, "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    return proc.returncode, json.loads(last).get("raybench", {}) | {"_err": proc.stderr[-2000:]}


def test_stage_swept_over_cpus_gives_measured_rows(tmp_path):
    code, summary = run(sweep_file(tmp_path, True, "{preprocess.cpus: [1, 2]}"), tmp_path / "r")
    assert code == 0, summary["_err"]
    df = pd.read_parquet(tmp_path / "r" / "results.parquet")
    assert list(df["stage"]) == ["preprocess", "preprocess"]
    assert list(df["preprocess.cpus"]) == [1, 2]
    assert (df["status"] == "ok").all()
    assert (df["preprocess/chips"] == 18).all()  # 2 train scenes x 3 x 3 chips of 256 px
    assert (df["preprocess/chips_per_s"] > 0).all() and (df["preprocess/mb_per_s"] > 0).all()
    assert (df["preprocess/peak_rss_mb_worker"] > 0).all()
    assert [s["cached"] for s in summary["preprocess"]] == [False, False]


def test_stage_cache_is_reused_by_the_next_sweep(tmp_path):
    path = sweep_file(tmp_path, False, "{}")
    code1, first = run(path, tmp_path / "r1")
    code2, second = run(path, tmp_path / "r2")
    assert code1 == 0 and code2 == 0, second["_err"]
    assert first["preprocess"][0]["cached"] is False
    assert second["preprocess"][0]["cached"] is True
    assert first["preprocess"][0]["output"] == second["preprocess"][0]["output"]
    row = pd.read_parquet(tmp_path / "r2" / "results.parquet").iloc[0]
    assert row["preprocess/chips"] == 0 and row["preprocess/chips_total"] == 18

"""`python -m raybench.bench chips` runs end to end on tiny scenes (the figures are in docs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.ray


def test_chips_benchmark_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "raybench.bench", "chips", "--data", str(tmp_path / "d"),
         "--scenes", "2", "--size", "900x1000", "--chip-size", "300", "--cpus", "2",
         "--settle", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])["raybench_chips_bench"]
    # one train scene of 900 x 1000 px: 3 x 4 chips of 300 px on both sides
    assert result["baseline"]["chips"] == result["raybench"]["chips"] == 12
    assert result["copy_limit"]["chips"] == 12
    # the copy and the stage each run twice, the second time at once on the pages just freed
    assert result["copy_limit"]["warm_pages"]["chips"] == 12
    assert result["raybench"]["warm_pages"]["chips"] == 12
    assert result["speedup_chips_per_s"] > 0 and result["fraction_of_copy_limit"] > 0
    assert result["fraction_of_copy_limit_warm_pages"] > 0
    # Ray's start, Ray Data's start and the workers' start are timed apart from the stage
    assert all(result["raybench"][k] > 0
               for k in ("ray_start_s", "ray_data_start_s", "workers_start_s"))
    # raybench's task time by phase: every phase was timed, and the shares add up to the whole
    shares = result["raybench_time_shares"]
    assert set(shares) == {"read", "resample", "normalize", "encode", "write", "other"}
    assert all(shares[p] > 0 for p in ("read", "resample", "normalize", "encode", "write"))
    assert sum(shares.values()) == pytest.approx(1.0)
    assert result["baseline"]["peak_rss_mb"] > 0 and result["raybench_peak_rss_mb"] > 0
    assert not (tmp_path / "d" / "bench_raybench").exists()  # outputs are cleaned up

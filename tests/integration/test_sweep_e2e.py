"""The README's main job on a real embedded Ray: rows per trial as they finish, files, exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import ray

from tests.conftest import ROOT

pytestmark = pytest.mark.ray

# The local sweep, shortened: fewer steps, and only batch 8 of its batch axis (2 trials: 2 and
# then 1 rank, on one worker group).
QUICK = ["--set", "measure.measure_steps=4", "--set", "measure.warmup_steps=1", "--set",
         "measure.repeats=1"]
TWO = ["--set", "grid.batch_size=[8]"]


def start_sweep(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "raybench.sweep", "sweeps/local_cpu.yaml", "--output", str(out),
           *QUICK, *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def rows(out: Path) -> int:
    try:
        return len(pd.read_parquet(out / "results.parquet"))
    except (FileNotFoundError, OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """Run the local sweep once, watching the table grow while the driver is still running."""
    out = tmp_path_factory.mktemp("local") / "run"
    # hardware.env reaches Ray Train's worker processes (each rank checks it, or the trial fails)
    proc = start_sweep(out, *TWO, "--set", "hardware.env.RB_E2E_MARK=on-ray")
    seen_while_running = set()
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen_while_running.add(rows(out))
        time.sleep(0.5)
    stdout, _ = proc.communicate(timeout=60)
    return out, proc.returncode, stdout, seen_while_running


def test_every_trial_is_an_ok_row_with_throughput(local_sweep):
    out, code, stdout, _ = local_sweep
    assert code == 0, stdout[-3000:]
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2
    assert (df["status"] == "ok").all()
    assert (df["train/samples_per_s"] > 0).all()
    assert sorted(df["hardware.cpu_workers"]) == [1, 2]
    assert (df["hardware.env.RB_E2E_MARK"] == "on-ray").all()
    assert (df["host/niceness"] == 0).all()  # not Ray's 15: ranks do not yield to the machine
    # not a terminal: a plain progress line per trial, the last one complete (times over a
    # minute read "1 min 02 s": a clean clone's first trial took that long beside the parallel
    # part, on the embedded Ray's 33 s start)
    took = r"(?:\d+ min )?\d+ s"
    assert re.search(rf"progress: trials 1/2 \(50%\), {took}, about {took} left; trial \d "
                     r"[0-9a-f]{12}: ok, [0-9.]+ samples/s", stdout), stdout[-2000:]
    assert "progress: trials 2/2 (100%)" in stdout
    # and only raybench's lines: one per finished trial, none of Ray's own console output
    # (Tune's experiment box, Train's controller lines), which --verbose shows (issue 41, 17)
    for key in df["trial_key"]:
        assert len([line for line in stdout.splitlines() if key in line]) == 1, stdout[-3000:]
    for ray_text in ("Configuration for experiment", "Number of trials", "TrainController",
                     "View detailed results", "world_rank", "Token authentication"):
        assert ray_text not in stdout, (ray_text, stdout[-3000:])
    # where each trial's time outside its window went: every phase stamped and none negative;
    # one rank's phases follow each other, so together they fit in the fixed cost (with more
    # ranks each phase is the slowest rank's, and those may overlap)
    phases = ["trial_start", "train_start", "rank_prep", "setup", "warmup", "record",
              "teardown"]
    for _, row in df.iterrows():
        # a group's later trials start no workers: no trial_start or train_start of their own
        names = phases if row["trial/group_position"] == 0 else phases[2:]
        parts = [row[f"overhead/{p}_s"] for p in names]
        assert all(x >= 0 for x in parts), dict(zip(names, parts, strict=True))
        assert row["overhead/report_s"] >= 0
        if row["train/world_size"] == 1:
            assert sum(parts) <= row["overhead/fixed_s"] + 0.1
    assert set(df["train/world_size"]) == {1, 2}
    # one worker group of two ranks for both (isolation: worker, trials one at a time): the
    # two-rank trial first, then the one-rank trial on its first rank; one start-up
    by_ranks = df.set_index("train/world_size")
    assert list(by_ranks.loc[[2, 1], "trial/group_position"]) == [0, 1]
    assert (df["trial/group_ranks"] == 2).all()
    assert df["overhead/train_start_s"].notna().sum() == 1
    assert df["trial_key"].is_unique
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(df.columns)


def test_rows_are_appended_after_each_trial(local_sweep):
    _, _, _, seen = local_sweep
    # The table existed with the first trial's row while the sweep was still running.
    assert 1 in seen


def test_run_files(local_sweep):
    out, _, stdout, _ = local_sweep
    info = json.loads((out / "system_info.json").read_text())
    assert info["versions"]["ray"] == ray.__version__  # the lock's, or make test-ray-oldest's
    assert info["cluster"]["resources"]["CPU"] >= 3
    (node,) = info["nodes"].values()  # the one node's own facts (read in the driver that
    # started this embedded Ray; other nodes by a task there: test_multinode)
    assert node["cpu"]["logical"] >= 1 and node["versions"]["ray"] == ray.__version__
    assert (out / "sweep.yaml").exists()
    trials = sorted((out / "trials").glob("*.json"))
    assert len(trials) == 2
    detail = json.loads(trials[1].read_text())
    assert len(detail["records"]) == detail["row"]["train/world_size"]
    assert len(detail["records"][0]["compute_s"]) == 4
    summary = json.loads(stdout.strip().splitlines()[-1])["raybench"]
    assert summary["trials"] == 2 and summary["ok"] == 2 and summary["failed"] == 0
    assert summary["report"] == str(out / "report.html")
    assert "Plotly.newPlot" in (out / "report.html").read_text()
    assert (out / "benchmark_report.md").exists() and (out / "benchmark_report.json").exists()


def test_unsatisfiable_trial_fails_fast_as_a_row(tmp_path):
    """The row comes without waiting on placement: a sweep that waited would take at least
    the placement deadline, set here far above what the whole run takes on a busy machine
    (Ray's start, the row, the report: 19-23 s beside two busy cores, 62 s once beside make
    test's parallel part), so the bound tells waiting from not waiting on any machine."""
    out = tmp_path / "run"
    deadline = 900  # execution.start_timeout_s: the placement wait this trial must not take
    t0 = time.monotonic()
    proc = start_sweep(out, "--set", "hardware.cpus_per_worker=64",
                       "--set", "grid={batch_size: [8]}",
                       "--set", f"execution.start_timeout_s={deadline}")
    try:
        stdout, _ = proc.communicate(timeout=deadline / 3)
    finally:
        proc.kill()
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, stdout[-3000:]
    assert elapsed < deadline / 3
    df = pd.read_parquet(out / "results.parquet")
    assert list(df["status"]) == ["infeasible"]
    assert re.search(r"needs .*CPU=64 in all .*cluster has .*CPU=", df["error"][0])

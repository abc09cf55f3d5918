"""Results and history tables: atomic appends, stable columns, the long-lived history."""

from __future__ import annotations

import re

import pandas as pd

from raybench.grid import expand
from raybench.results import History, ResultsTable, RowWriter
from raybench.spec import load_sweep


def outcome(thr: float) -> dict:
    return {"status": "ok", "error": None, "metrics": {"train/samples_per_s": thr}}


def test_rows_and_history_across_runs(write_sweep, tmp_path):
    spec = load_sweep(write_sweep())
    trials = expand(spec)
    history = History(tmp_path)
    for run_id, thr in (("week1", 100.0), ("week2", 90.0)):
        out = tmp_path / run_id
        out.mkdir()
        writer = RowWriter(spec, run_id, ResultsTable(out), history)
        for t in trials:
            writer.write(t, outcome(thr))
        table = pd.read_parquet(out / "results.parquet")
        assert len(table) == len(trials)
        assert list(table.columns[:4]) == ["sweep", "run_id", "stage", "trial_index"]
    hist = pd.read_parquet(tmp_path / "history.parquet")
    assert len(hist) == 2 * len(trials)
    assert list(hist["run_id"]) == ["week1", "week1", "week2", "week2"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|raybench-.*", hist["code_version"][0])
    assert hist["recorded_at"].is_monotonic_increasing
    # the same configuration can be followed over time by its key
    key = trials[0].key
    assert list(hist[hist.trial_key == key]["train/samples_per_s"]) == [100.0, 90.0]
    assert len(pd.read_csv(tmp_path / "history.csv")) == 4


def test_results_table_reloads_existing_rows(write_sweep, tmp_path):
    spec = load_sweep(write_sweep())
    t = expand(spec)[0]
    RowWriter(spec, "r", ResultsTable(tmp_path)).write(t, outcome(1.0))
    RowWriter(spec, "r", ResultsTable(tmp_path)).write(t, outcome(2.0))
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == 2
    assert not list(tmp_path.glob(".results*"))  # no temporary files left behind

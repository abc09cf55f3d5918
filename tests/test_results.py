"""Results and history tables: atomic appends, stable columns, the long-lived history."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from raybench.grid import expand
from raybench.records import TrialOutcome
from raybench.results import history as history_store
from raybench.results.history import History
from raybench.results.table import ResultsTable
from raybench.results.writer import RowWriter
from raybench.spec import load_sweep
from raybench.sweep.loop import summarize
from raybench.version import code_version


def test_code_version_without_git_or_an_installed_package(monkeypatch, tmp_path):
    """`ray job submit --working-dir .` on the lent H200 (2026-11-26): the job's copy of the
    sources has no .git and the cluster's Python no raybench package; the sweep died in
    code_version before its first trial. Now the sources' digest names the code."""
    import subprocess

    from raybench import sysinfo, version

    def no_git(*a, **k):
        raise subprocess.CalledProcessError(128, a[0])

    def not_installed(name):
        raise version.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.subprocess, "run", no_git)
    monkeypatch.setattr(version.metadata, "version", not_installed)
    v = code_version()
    assert re.fullmatch(r"raybench-src\+[0-9a-f]{12}", v), v
    assert code_version() == v  # the same sources, the same name
    # the rows' system/raybench read the package's version: empty on the H200's runs (2026-11-26)
    assert sysinfo.machine()["versions"]["raybench"] == v
    monkeypatch.setattr(version.metadata, "version", lambda name: "0.3.0")
    assert code_version() == v.replace("src", "0.3.0")


def outcome(thr: float) -> TrialOutcome:
    return TrialOutcome(status="ok", metrics={"train/samples_per_s": thr})


def test_rows_and_history_across_runs(write_sweep, tmp_path):
    spec = load_sweep(write_sweep())
    trials = expand(spec)
    history = History(tmp_path, code_version())
    for run_id, thr in (("week1", 100.0), ("week2", 90.0)):
        out = tmp_path / run_id
        out.mkdir()
        writer = RowWriter(spec, run_id, ResultsTable(out), history)
        for t in trials:
            writer.write(t, outcome(thr))
        table = pd.read_parquet(out / "results.parquet")
        assert len(table) == len(trials)
        assert list(table.columns[:4]) == ["sweep", "run_id", "stage", "trial_index"]
    hist = history_store.read(tmp_path)
    assert len(hist) == 2 * len(trials)
    assert list(hist["run_id"]) == ["week1", "week1", "week2", "week2"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|raybench-.*", hist["code_version"][0])
    assert hist["recorded_at"].is_monotonic_increasing
    # the same configuration can be followed over time by its key
    key = trials[0].key
    assert list(hist[hist.trial_key == key]["train/samples_per_s"]) == [100.0, 90.0]


def test_an_axis_of_mixed_types_is_written_and_read_beside_runs_of_one_type(tmp_path):
    """`save_checkpoints: [false, every_epoch]` is a legal axis: its rows are written (as text)
    to the run's table and the history, and the history still reads beside a run whose column
    was a bool (issue 41, item 6)."""
    from tests.conftest import ROOT

    history = History(tmp_path, "test")
    for run_id, axis in (("bools", "[false]"), ("mixed", "[false, every_epoch]")):
        spec = load_sweep(ROOT / "sweeps" / "xview3_cpu.yaml",
                          [f"grid={{save_checkpoints: {axis}}}"])
        out = tmp_path / run_id
        out.mkdir()
        writer = RowWriter(spec, run_id, ResultsTable(out), history)
        for t in expand(spec):
            writer.write(t, outcome(1.0))
        history = History(tmp_path, "test")  # the next run: a process of its own
    table = pd.read_parquet(tmp_path / "mixed" / "results.parquet")
    assert list(table["workload.save_checkpoints"]) == ["false", "every_epoch"]
    assert len(pd.read_csv(tmp_path / "mixed" / "results.csv")) == 2
    assert len(ResultsTable(tmp_path / "mixed").rows) == 2  # as --resume reads it
    hist = history_store.read(tmp_path)
    assert list(hist["workload.save_checkpoints"]) == ["false", "false", "every_epoch"]


def test_results_table_reloads_existing_rows(write_sweep, tmp_path):
    spec = load_sweep(write_sweep())
    t = expand(spec)[0]
    RowWriter(spec, "r", ResultsTable(tmp_path)).write(t, outcome(1.0))
    RowWriter(spec, "r", ResultsTable(tmp_path)).write(t, outcome(2.0))
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == 2
    assert not list(tmp_path.glob(".results*"))  # no temporary files left behind


def test_summary_best_is_the_fastest_valid_trial(write_sweep, tmp_path):
    # the JSON line a pipeline reads must not name a trial the report calls invalid
    spec = load_sweep(write_sweep(), ["grid={batch_size: [4, 8, 16]}"])
    slow, fast, server = expand(spec)
    writer = RowWriter(spec, "r", ResultsTable(tmp_path))
    writer.write(slow, outcome(100.0))
    diverged = outcome(500.0)
    diverged.metrics["train/loss_finite"] = False
    writer.write(fast, diverged)
    summary = summarize(writer, tmp_path, 1.0)
    assert summary["best"] == {"trial_key": slow.key, "samples_per_s": 100.0}
    assert summary["ok"] == 2 and summary["invalid"] == 1
    # a Server search that met no rate has no headline and is invalid in the report: so here
    import raybench.scenarios.run  # noqa: F401 (declares the server/ columns, as a sweep does)

    writer.write(server, TrialOutcome(
        status="ok", metrics={"server/met_bound": False, "server/latency_percentile": 99.0,
                              "server/latency_bound_ms": 50.0}))
    summary = summarize(writer, tmp_path, 1.0)
    assert summary["ok"] == 3 and summary["invalid"] == 2
    assert summary["best"] == {"trial_key": slow.key, "samples_per_s": 100.0}


def test_new_run_refuses_a_directory_with_rows_and_resume_checks_the_sweep(write_sweep, tmp_path):
    from raybench.results.rundir import run_directory
    from raybench.spec import SpecError, load_sweep

    spec = load_sweep(write_sweep(), [f"output.root={tmp_path / 'res'}"])
    out = run_directory(spec, None)
    (out / "sweep.yaml").write_text(yaml_dump(spec))
    (out / "results.parquet").write_bytes(b"")
    with pytest.raises(SpecError, match="already holds a run.*--resume"):
        run_directory(spec, str(out))
    assert run_directory(spec, str(out), resume=True) == out
    assert run_directory(spec, None, resume=True) == out  # the newest run of this sweep
    import yaml  # a run written before a field existed resumes: the field is at its default

    older = spec.to_yaml_dict()
    del older["execution"]["max_trials"]
    (out / "sweep.yaml").write_text(yaml.safe_dump(older, sort_keys=False))
    assert run_directory(spec, str(out), resume=True) == out
    other = load_sweep(write_sweep(), [f"output.root={tmp_path / 'res'}",
                                       "measure.measure_steps=7"])
    with pytest.raises(SpecError, match="measure.*differs from the run"):
        run_directory(other, str(out), resume=True)
    with pytest.raises(SpecError, match="no earlier run"):
        run_directory(load_sweep(write_sweep(), [f"output.root={tmp_path / 'none'}"]), None,
                      resume=True)
    (out / "sweep.yaml").write_text("a: [" * 1200)  # was a RecursionError (issue 63)
    with pytest.raises(SpecError, match="cannot be read"):
        run_directory(spec, str(out), resume=True)


def yaml_dump(spec):
    import yaml

    return yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False)


def test_jsonl_prints_each_trial_as_it_is_written(write_sweep, tmp_path, capsys):
    spec = load_sweep(write_sweep())
    first, second = expand(spec)[:2]
    writer = RowWriter(spec, "r", ResultsTable(tmp_path), jsonl=True)
    writer.write(first, TrialOutcome(status="ok", metrics={
        "train/samples_per_s": 100.0, "train/measured_steps": 10, "train/global_batch_size": 8,
        "train/loss_final": float("nan")}, start_time="2026-11-23T10:00:00+00:00",
        end_time="2026-11-23T10:00:12.5+00:00"))
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1  # printed when the row is written, not at the end
    writer.write(second, TrialOutcome.failed("oom", "CUDA out of memory"))
    printed += capsys.readouterr().out.splitlines()
    lines = [json.loads(x)["raybench_trial"] for x in printed]
    assert lines[0]["samples_per_s"] == 100.0 and lines[0]["total_samples"] == 80
    assert lines[0]["elapsed_seconds"] == 12.5 and lines[0]["row"]["train/loss_final"] is None
    assert lines[0]["config"] == {k: v for k, v in first.config().items()}
    assert lines[1]["status"] == "oom" and lines[1]["samples_per_s"] is None


def test_sweeps_started_in_the_same_second_get_their_own_run_directories(write_sweep, tmp_path,
                                                                          monkeypatch):
    """Issue 41, item 4: run directories are created exclusively, so two sweeps of one name
    started together never share one (the clock is frozen here to make them collide)."""
    from datetime import datetime, timezone

    from raybench.results import rundir
    from raybench.spec import load_sweep

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 25, 17, 0, 0, tzinfo=timezone.utc)

    monkeypatch.setattr(rundir, "datetime", Frozen)
    spec = load_sweep(write_sweep(), [f"output.root={tmp_path / 'res'}"])
    runs = [rundir.run_directory(spec, None) for _ in range(3)]
    assert [r.name for r in runs] == ["20261125T170000Z", "20261125T170000Z-002",
                                      "20261125T170000Z-003"]
    for r in runs:
        (r / "sweep.yaml").write_text(yaml_dump(spec))
    assert rundir.run_directory(spec, None, resume=True) == runs[-1]  # the newest sorts last


def test_resume_brings_the_csv_and_the_history_up_to_the_table(write_sweep, tmp_path):
    """A driver killed after results.parquet got a row and before the CSV or the history did
    (issue 41, item 1): opening the run again (--resume) writes both up to the table, once."""
    spec = load_sweep(write_sweep())
    trials = expand(spec)
    out = tmp_path / "run"
    out.mkdir()
    writer = RowWriter(spec, "run", ResultsTable(out), History(tmp_path, "test"))
    for t in trials:
        writer.write(t, outcome(1.0))
    csv = (out / "results.csv").read_text().splitlines()
    (out / "results.csv").write_text("\n".join(csv[:-1]) + "\n")  # the last row's CSV write lost
    first = history_store.read(tmp_path).iloc[:1]
    for f in history_store.files(tmp_path):  # the last row's history write lost
        Path(f).unlink()
    History(tmp_path, "test").append(first.drop(columns=["recorded_at", "code_version"])
                                     .to_dict("records")[0])
    for _ in range(2):  # resumed twice: nothing added the second time
        RowWriter(spec, "run", ResultsTable(out), History(tmp_path, "test"))
        assert len(pd.read_csv(out / "results.csv")) == len(trials)
        hist = history_store.read(tmp_path)
        assert sorted(hist["trial_key"]) == sorted(t.key for t in trials)


def test_a_damaged_table_is_named_and_rebuilt_from_the_trial_files(write_sweep, tmp_path):
    from raybench.results import rebuild
    from raybench.store import UnreadableTable

    spec = load_sweep(write_sweep())
    trials = expand(spec)
    writer = RowWriter(spec, "run", ResultsTable(tmp_path))
    for t in trials:
        writer.write(t, outcome(1.0))
    table = tmp_path / "results.parquet"
    table.write_bytes(table.read_bytes()[:400])  # a truncated copy
    with pytest.raises(UnreadableTable, match=f"{table} cannot be read.*2 trial rows.*"
                       f"python -m raybench.rebuild {tmp_path}"):
        ResultsTable(tmp_path)
    assert rebuild.main([str(tmp_path)]) == 0
    rows = ResultsTable(tmp_path).rows
    assert [r["trial_key"] for r in rows] == [t.key for t in trials]
    assert len(list(tmp_path.glob("results.parquet.damaged-*"))) == 1
    assert rebuild.main([str(tmp_path / "nothing")]) == 2


def test_a_list_column_keeps_its_type_when_a_resumed_run_adds_a_row(write_sweep, tmp_path):
    """Rows read back from Parquet hold numpy arrays and a new row lists: the table kept the
    column as text after a resume's next trial ("[70.88]"), which compare could not read
    (issue 63, item 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raybench import compare

    spec = load_sweep(write_sweep(), ["grid={batch_size: [4, 8]}"])
    first, second = expand(spec)
    history = History(tmp_path / "root", code_version())
    windows = {"train/window_samples_per_s": [70.88, 71.0, 70.5]}
    for trial in (first, second):  # the second as a resumed run's: its table read back first
        RowWriter(spec, "r", ResultsTable(tmp_path), history).write(trial, TrialOutcome(
            status="ok", metrics={"train/samples_per_s": 70.8, **windows}))
    column = pq.read_table(tmp_path / "results.parquet").schema.field(
        "train/window_samples_per_s")
    assert pa.types.is_list(column.type), column
    assert compare.windows(compare.load_run(str(tmp_path)).iloc[0].to_dict()) == [
        70.88, 71.0, 70.5]
    hist = history_store.read(tmp_path / "root")
    assert len(hist) == 2 and list(hist["train/window_samples_per_s"].iloc[1]) == [
        70.88, 71.0, 70.5]

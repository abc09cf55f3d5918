"""The history: append-only files under the results root, whole or absent, read with filters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import raybench.metrics  # noqa: F401  declares the train/ columns whose units a file keeps
from raybench import columns
from raybench.results import history
from raybench.results.history import History
from raybench.results.table import ID_COLUMNS
from tests.conftest import ROOT

# appends `n` rows of run `run` into `root`, one History per process as a sweep has
WRITER = """
import sys
from raybench.results.history import History
from raybench.results.table import ID_COLUMNS
root, run, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = History(root, code_version="test")
for i in range(n):
    h.append({**dict.fromkeys(ID_COLUMNS), "sweep": "s", "run_id": run, "trial_key": f"k{i % 4}", "trial_index": i,
              "status": "ok", "train/samples_per_s": float(i), "workload.note": "x" * 2000})
    print(i, flush=True)
"""


def row(**values) -> dict:
    """A history row: the identity columns every real row has, then `values`."""
    return {**dict.fromkeys(ID_COLUMNS), "status": "ok", **values}


def writer(root: Path, run: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), run, str(n)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)


def test_two_sweeps_appending_at_once_lose_nothing(tmp_path):
    procs = [writer(tmp_path, run, 60) for run in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0
    hist = history.read(tmp_path)
    assert len(hist) == 120
    assert hist.groupby("run_id")["trial_index"].apply(sorted).to_dict() == {
        "a": list(range(60)), "b": list(range(60))}
    assert len(history.files(tmp_path)) == 2  # a file per writer; none rewrote the other's


def test_a_writer_killed_mid_append_leaves_only_whole_files(tmp_path):
    """SIGKILL while rows are being written, again and again: every read after it works and
    sees whole rows only; the temporaries a killed writer left are not read."""
    for run in ("k1", "k2", "k3"):
        p = writer(tmp_path, run, 10_000)
        for _ in range(5 + hash(run) % 20):  # a different moment each time
            p.stdout.readline()
        p.send_signal(signal.SIGKILL)
        p.wait()
        hist = history.read(tmp_path)
        assert (hist["train/samples_per_s"] == hist["trial_index"]).all()
    assert set(hist["run_id"]) == {"k1", "k2", "k3"}
    # a temporary as a kill leaves it (store.write_bytes: `<file>.tmp<pid>`), half-written
    hdir = tmp_path / "history"
    stale = hdir / "k9.abc.parquet.tmp999"
    stale.write_bytes(b"PAR1 half a file")
    assert len(history.read(tmp_path)) == len(hist)
    old = time.time() - history.STALE_TMP_S - 10
    os.utime(stale, (old, old))
    History(tmp_path, code_version="t").append(row(run_id="next", trial_key="k0"))
    assert not stale.exists()  # the next writer clears what is over an hour old


def test_legacy_table_is_read_in_place_beside_new_files_of_other_columns(tmp_path):
    pd.DataFrame({"sweep": ["s"], "run_id": ["old"], "trial_key": ["k0"], "status": ["ok"],
                  "recorded_at": ["2026-10-01T00:00:00+00:00"], "code_version": ["v0"],
                  "train/samples_per_s": [100.0], "gone/column": [None]}).to_parquet(
        tmp_path / "history.parquet")
    h = History(tmp_path, code_version="v1")
    h.append(row(sweep="s", run_id="new", trial_key="k0", **{
        "train/samples_per_s": 90.0, "gone/column": 1.5, "new/column_ms": 3.0}))
    h.append(row(sweep="s", run_id="new", trial_key="k1", **{"train/samples_per_s": 50.0}))
    hist = history.read(tmp_path)
    assert list(hist["run_id"]) == ["old", "new", "new"]  # oldest first
    assert pd.isna(hist["gone/column"][0]) and hist["gone/column"][1] == 1.5
    assert pd.isna(hist["new/column_ms"][0]) and hist["new/column_ms"][1] == 3.0
    one = history.read(tmp_path, ds.field("trial_key") == "k0", ["run_id", "trial_key"])
    assert list(one.columns) == ["run_id", "trial_key"] and list(one["run_id"]) == ["old", "new"]
    assert (tmp_path / "history.parquet").stat().st_size > 0  # never rewritten
    assert history.units(tmp_path)["train/samples_per_s"]["unit"] == "samples/s"


def test_csv_export_and_a_root_without_history(tmp_path):
    History(tmp_path, code_version="v").append(row(sweep="s", run_id="r", trial_key="k"))
    History(tmp_path, code_version="v").append(row(sweep="t", run_id="r2", trial_key="k"))
    out = tmp_path / "h.csv"
    assert history.main([str(tmp_path), "--csv", str(out), "--sweep", "t"]) == 0
    assert pd.read_csv(out)["sweep"].tolist() == ["t"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "raybench.history", str(empty), "--csv",
                           str(empty / "x.csv")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "holds no history" in proc.stderr and "Fix:" in proc.stderr
    assert not (empty / "x.csv").exists()


@pytest.mark.parametrize("existing", [0, 2000])
def test_an_append_does_not_read_the_history(tmp_path, existing, monkeypatch):
    for i in range(existing // 500):
        h = History(tmp_path, code_version="v")
        h.rows = [row(run_id=f"r{i}", trial_key=f"k{j}") for j in range(499)]
        h.append(row(run_id=f"r{i}", trial_key="k"))
    assert len(history.read(tmp_path)) == existing
    monkeypatch.setattr(history, "read_table", lambda *a, **k: pytest.fail("append read"))
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pytest.fail("append read"))
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "history").glob("*.parquet")}
    History(tmp_path, code_version="v").append(row(run_id="new", trial_key="k"))
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "history").glob("*.parquet")}
    assert {p: t for p, t in after.items() if p in before} == before  # earlier files untouched
    assert len(after) == len(before) + 1


def test_old_run_files_fold_into_a_segment_and_every_row_reads_once(tmp_path, monkeypatch):
    """70 run files a day old: one compaction folds 64 into a segment (the sweep's end calls
    it); rows read once before, during (segment written, its files not yet removed) and after;
    files written within the day, a running sweep's, are not folded."""
    past = time.time() - 2 * history.ACTIVE_S
    for r in range(70):
        History(tmp_path, code_version="v").append(row(run_id=f"r{r:02d}", trial_key="k", **{
            "train/samples_per_s": float(r)}))
    for p in (tmp_path / "history").glob("*.parquet"):
        os.utime(p, (past, past))
    live = History(tmp_path, code_version="v")
    live.append(row(run_id="live", trial_key="k"))
    assert history.compact(tmp_path, at_least=80) is None  # not yet 80 old files
    removed = []
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: removed.append(self))
    segment = history.compact(tmp_path)
    assert segment and len(removed) == 64
    mid = history.read(tmp_path)  # the folded files still there: read once, from the segment
    assert sorted(mid["run_id"]) == sorted([f"r{r:02d}" for r in range(70)] + ["live"])
    monkeypatch.undo()
    for p in removed:
        p.unlink()
    names = [Path(p).name for p in history.files(tmp_path)]
    assert sum(n.startswith(history.SEGMENT) for n in names) == 1 and len(names) == 8
    assert live.file in history.files(tmp_path)  # recent: left alone
    after = history.read(tmp_path)
    assert len(after) == 71 and not after.duplicated(["run_id"]).any()
    folded = after[after["run_id"] != "live"].sort_values("run_id")
    assert list(folded["train/samples_per_s"]) == list(range(70))
    units = columns.read_metadata(pq.read_schema(segment).metadata)  # the segment keeps them
    assert units["train/samples_per_s"]["unit"] == "samples/s"


def test_a_writer_whose_file_was_folded_goes_on_in_a_new_file(tmp_path):
    h = History(tmp_path, code_version="v")
    h.append(row(run_id="slow", trial_key="k0"))
    old = time.time() - 2 * history.ACTIVE_S
    os.utime(h.file, (old, old))
    assert history.compact(tmp_path, at_least=1)
    h.append(row(run_id="slow", trial_key="k1"))  # a day later, the run's next row
    hist = history.read(tmp_path)
    assert sorted(hist["trial_key"]) == ["k0", "k1"]


def test_a_damaged_history_file_is_skipped_with_a_warning_and_left_alone(tmp_path, caplog,
                                                                         monkeypatch):
    """A truncated history file never stops a read, an append or a fold (issue 41, item 7)."""
    for run in ("a", "b"):
        History(tmp_path, "test").append(row(run_id=run, trial_key="k"))
    damaged = Path(history.files(tmp_path)[0])
    damaged.write_bytes(damaged.read_bytes()[:100])
    hist = history.read(tmp_path)
    assert len(hist) == 1 and "cannot be read" in caplog.text and damaged.name in caplog.text
    History(tmp_path, "test").append(row(run_id="c", trial_key="k"))
    past = time.time() - history.ACTIVE_S - 60
    for f in history.files(tmp_path):
        os.utime(f, (past, past))
    monkeypatch.setattr(history, "SEGMENT_FILES", 3)
    assert history.compact(tmp_path) is None  # two readable files: not enough to fold
    assert damaged.exists() and sorted(history.read(tmp_path)["run_id"]) == ["b", "c"]


def test_a_column_stored_as_a_list_in_one_run_and_text_in_another_reads(tmp_path, caplog):
    """One run file holds a metric as a list, another as text (what a resume wrote before it
    kept the type): Arrow cannot cast the one to the other, and every read of the root failed;
    now the other file's cells read as text, with a warning naming it (issue 63, item 1)."""
    History(tmp_path, "test").append(row(run_id="a", trial_key="k",
                                         **{"train/window_samples_per_s": [70.9, 71.0]}))
    History(tmp_path, "test").append(row(run_id="b", trial_key="k",
                                         **{"train/window_samples_per_s": "[70.88]"}))
    hist = history.read(tmp_path)
    assert sorted(hist["run_id"]) == ["a", "b"] and "read as text" in caplog.text
    by_run = dict(zip(hist["run_id"], hist["train/window_samples_per_s"], strict=True))
    assert by_run == {"a": "[70.9, 71.0]", "b": "[70.88]"}
    only_b = history.read(tmp_path, ds.field("run_id") == "b", ["run_id"])
    assert list(only_b["run_id"]) == ["b"]
    assert history.units(tmp_path) is not None


def test_the_units_read_skips_a_damaged_file(tmp_path, caplog):
    """report --history reads the files' units from their footers: through the same guard as
    the rows, a damaged file named and skipped (issue 63, item 2)."""
    History(tmp_path, "test").append(row(run_id="a", trial_key="k",
                                         **{"system/nodes": 1}))
    damaged = tmp_path / history.DIRECTORY / "b.test.parquet"
    damaged.write_bytes(b"PAR1 not a parquet file")
    assert history.units(tmp_path)["system/nodes"]["unit"] == "count"
    assert "cannot be read" in caplog.text and damaged.name in caplog.text


def _bad_files(hdir: Path, good: Path) -> dict[str, Path]:
    """Every kind of file issue 63 (item 2) put beside a history's run files, by name."""
    import numpy as np
    import pyarrow as pa

    whole = good.read_bytes()
    flipped = bytearray(whole)
    for i in range(8, len(whole) // 2, 7):  # the data pages, the footer left whole
        flipped[i] ^= 0xFF
    made = {"random": np.random.default_rng(0).bytes(5000), "empty": b"",
            "truncated": whole[: len(whole) // 2], "flipped": bytes(flipped)}
    out = {}
    for name, data in made.items():
        out[name] = hdir / f"{name}.000000000000.parquet"
        out[name].write_bytes(data)
    tables = {
        "struct": pa.table({"run_id": ["struct"], "status": ["ok"],
                            "train/samples_per_s": pa.array([{"a": 1.0}])}),
        "dupes": pa.Table.from_arrays([pa.array(["dupes"]), pa.array(["ok"]), pa.array(["x"])],
                                      names=["run_id", "status", "status"]),
        "text": pa.table({"run_id": ["text"], "status": ["ok"], "trial_key": ["k"],
                          "train/samples_per_s": ["fast"]}),
        "norows": pa.table({"run_id": pa.array([], pa.string()),
                            "train/samples_per_s": pa.array([], pa.float64())}),
    }
    for name, table in tables.items():
        out[name] = hdir / f"{name}.000000000000.parquet"
        pq.write_table(table, out[name])
    # a segment, readable, that claims a live run's file without holding its rows
    claim = pa.table({"run_id": ["other"], "status": ["ok"]}).replace_schema_metadata(
        {history.SOURCES_KEY: f'["{good.name}"]'.encode()})
    out["claiming"] = hdir / f"{history.SEGMENT}claiming.parquet"
    pq.write_table(claim, out["claiming"])
    out["segment"] = hdir / f"{history.SEGMENT}damaged.parquet"
    out["segment"].write_bytes(whole[:200])
    return out


def test_every_reader_of_a_history_gets_past_every_kind_of_bad_file(tmp_path, caplog, capsys):
    """Random, empty, truncated and bit-flipped run files, foreign ones (a struct where a
    metric is, a name twice, a metric as text, no rows), a damaged segment and one that claims
    another run's file: every reader reads the good runs' rows, names what it skips or reads
    as text, and never raises (issue 63, item 2)."""
    from raybench import compare
    from raybench.report import write_history
    from raybench.results import peaks

    for run, speed in (("r1", 100.0), ("r2", 101.0), ("r3", 99.0)):
        History(tmp_path, "v").append(row(
            run_id=run, trial_key="k", sweep="s", stage="benchmark",
            **{"train/samples_per_s": speed, "train/window_samples_per_s": [speed] * 4,
               "system/fingerprint": "fp", "perf/peak_probe": True,
               "perf/achieved_tflops_per_gpu": 2.0, "hardware.precision": "fp32"}))
    good = sorted((tmp_path / history.DIRECTORY).glob("r1.*.parquet"))[0]
    bad = _bad_files(tmp_path / history.DIRECTORY, good)
    caplog.clear()
    hist = history.read(tmp_path)
    assert {"r1", "r2", "r3"} <= set(hist["run_id"])
    for name in ("random", "empty", "truncated", "flipped", "dupes", "segment"):
        assert bad[name].name in caplog.text, name
    assert len(history.read(tmp_path, ds.field("run_id") == "r2", ["run_id"])) == 1
    assert history.units(tmp_path)["train/samples_per_s"]["unit"] == "samples/s"
    assert history.main([str(tmp_path), "--csv", str(tmp_path / "h.csv")]) == 0
    assert compare.main(["--history", str(tmp_path)]) in (0, 1, 4)
    assert write_history(tmp_path, tmp_path / "history.html").exists()
    assert peaks.latest(History(tmp_path, "v"), "fp") == {"fp32": 2.0}
    past = time.time() - 2 * history.ACTIVE_S
    for f in (tmp_path / history.DIRECTORY).glob("*.parquet"):
        os.utime(f, (past, past))
    history.compact(tmp_path, at_least=3)
    for name in ("random", "empty", "truncated", "flipped", "segment"):
        assert bad[name].exists(), name  # a damaged file stays for its owner to look at
    assert {"r1", "r2", "r3"} <= set(history.read(tmp_path)["run_id"])
    assert "Traceback" not in capsys.readouterr().err


def test_a_file_damaged_past_its_run_columns_is_not_folded_away(tmp_path, caplog):
    """A run file whose run_id and recorded_at read but another column's pages do not: the
    fold skipped its rows (read file by file) and then removed it with the files it folded,
    its rows gone from the history. It stays where it is, named."""
    for run in ("a", "b", "c"):
        History(tmp_path, "v").append(row(run_id=run, trial_key="k",
                                          **{"workload.note": "x" * 500}))
    damaged = sorted((tmp_path / history.DIRECTORY).glob("b.*.parquet"))[0]
    meta = pq.ParquetFile(damaged).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(0).column(names.index("workload.note"))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else \
        chunk.data_page_offset
    data = bytearray(damaged.read_bytes())
    for i in range(start, start + chunk.total_compressed_size):
        data[i] ^= 0x5A
    damaged.write_bytes(bytes(data))
    assert len(pq.read_table(damaged, columns=["run_id", "recorded_at"])) == 1
    past = time.time() - 2 * history.ACTIVE_S
    for f in (tmp_path / history.DIRECTORY).glob("*.parquet"):
        os.utime(f, (past, past))
    assert history.compact(tmp_path, at_least=2)
    assert damaged.exists() and damaged.name in caplog.text
    assert sorted(history.read(tmp_path)["run_id"]) == ["a", "c"]

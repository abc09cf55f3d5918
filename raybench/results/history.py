"""The long-lived history: every row of every run under a results root, append-only.

Owns `<root>/history/`, a Parquet dataset of one file per sweep process
(`<run_id>.<writer>.parquet`), and reading it back with filters. An append rewrites only its
own file, which holds only the rows this process wrote (at most one run's), so its cost does
not grow with the history; no append reads or rewrites an earlier run, two sweeps appending
at once write different files and need no lock, and every file appears whole (a rename, or an
object store's completed upload) or not at all. Reads list the `.parquet` files (a temporary
of a killed writer is never one of them), unify their schemas (runs of different workloads
have different columns) and push filters down to pyarrow.dataset. A `history.parquet` of
raybench before this layout is read in place, as one more file, and never written. Where the one
dataset read fails (a damaged or foreign file), salvage.py reads the files one by one.

CSV is an export (`python -m raybench.history ROOT --csv FILE`), not a second copy kept per
row: rewriting a CSV of everything is the cost this layout removes, and CSV loses types.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from raybench import columns, console, store
from raybench.records import now, uniform_cells
from raybench.results import fingerprint, salvage

DIRECTORY = "history"
LEGACY = "history.parquet"  # the single table of raybench before 2026-11-25: read, not written
STALE_TMP_S = 3600  # a temporary this old is a killed writer's (a write takes milliseconds)
SEGMENT = "segment-"  # a file folded from run files by compact()
SEGMENT_FILES = 64  # run files folded into one segment: a compaction reads at most this many
ACTIVE_S = 86_400  # a run file written within a day may still be appended to: not folded
SOURCES_KEY = b"raybench.history.sources"
# what the history page and `compare --history` read: reading every column of a thousand runs
# is what takes time (docs/journal/2026-11.md)
PAGE_COLUMNS = ["sweep", "run_id", "stage", "trial_key", "status", "recorded_at", "code_version",
                "train/samples_per_s", "train/window_samples_per_s", "train/step_time_cv_pct",
                "serve/output_tokens_per_s", "serve/window_output_tokens_per_s",
                "system/accelerator", "system/fingerprint", *fingerprint.SOFTWARE]


class History:
    """Appends this process's rows to its own file under `<root>/history/`; `compact` once
    the run is over."""

    def __init__(self, root: str | Path, code_version: str):
        self.root = str(root)
        self.dir = store.join(self.root, DIRECTORY)
        self.version = code_version  # version.code_version(): the caller's, as this imports none
        self.rows: list[dict[str, Any]] = []
        self.file: str | None = None  # named at the first append, after the run's id

    def append(self, row: dict[str, Any]) -> None:
        entry = {**row, "recorded_at": now(), "code_version": self.version}
        if self.file is not None and not store.is_file(self.file):
            # a compaction folded this file into a segment (this writer was idle for a day):
            # its rows are there, the next ones go to a new file
            self.rows, self.file = [], None
        self.rows.append(entry)
        if self.file is None:
            store.make_dirs(self.dir)
            _remove_stale_temporaries(self.dir)
            run = _file_prefix(row.get("run_id"))
            self.file = store.join(self.dir, f"{run}.{uuid.uuid4().hex[:12]}.parquet")
        frame = uniform_cells(pd.DataFrame(self.rows))
        table = pa.Table.from_pandas(frame, preserve_index=False)
        store.write_bytes(self.file, parquet_bytes(table))

    def compact(self) -> str | None:
        return compact(self.root)


def files(root: str | Path) -> list[str]:
    """Every history file under a results root that a read takes: the dataset's (less those a
    segment has taken in, while they are still there) and a legacy table."""
    out = []
    legacy = store.join(str(root), LEGACY)
    if store.is_file(legacy):
        out.append(legacy)
    hdir = store.join(str(root), DIRECTORY)
    if not store.is_dir(hdir):
        return out
    names = [n for n, is_dir in store.list_dir(hdir) if not is_dir and n.endswith(".parquet")]
    taken: set[str] = set()
    present = set(names)
    for n in names:
        if n.startswith(SEGMENT):
            taken.update(_sources(store.join(hdir, n), present))
    return out + [store.join(hdir, n) for n in names if n not in taken]


def read(root: str | Path, filter: ds.Expression | None = None,
         columns_: list[str] | None = None) -> pd.DataFrame:
    """The history's rows (all, or those `filter` keeps), oldest first. An empty frame when
    the root holds no history."""
    table = read_table(root, filter, columns_)
    frame = table.to_pandas()
    if "recorded_at" in frame:
        frame = frame.sort_values("recorded_at", kind="stable").reset_index(drop=True)
    return frame


def read_table(root: str | Path, filter: ds.Expression | None = None,
               columns_: list[str] | None = None) -> pa.Table:
    for attempt in range(3):
        try:
            return _read_table(files(root), filter, columns_)
        except FileNotFoundError:
            if attempt == 2:  # a compaction removed what was listed: list again
                raise
    raise AssertionError("unreachable")


def _read_table(paths: list[str], filter: ds.Expression | None,
                columns_: list[str] | None) -> pa.Table:
    if not paths:
        return pa.table({})
    fs, _ = store.resolve(paths[0])
    factory = ds.FileSystemDatasetFactory(fs, [store.resolve(p)[1] for p in paths],
                                          ds.ParquetFileFormat())
    try:
        # every file's schema: a column one run lacks is null there; a column null in one run
        # and typed in another takes the type (permissive promotion)
        schema = factory.inspect(promote_options="permissive", fragments=None)
        wanted = [c for c in columns_ if c in schema.names] if columns_ else None
        return factory.finish(schema).to_table(columns=wanted, filter=filter)
    except (pa.ArrowException, OSError, ValueError):
        # a damaged file, a foreign one, types that do not unify or cast: file by file, each
        # trouble named once (issue 63, item 2); a missing file goes up (a compaction's)
        if not all(store.is_file(p) for p in paths):
            raise FileNotFoundError(paths) from None
        return salvage.read_file_by_file(fs, paths, filter, columns_)


def compact(root: str | Path, at_least: int | None = None) -> str | None:
    """Fold the oldest run files into one segment once there are `SEGMENT_FILES` of them (a
    read opens every file, and a thousand runs' files take seconds to open where fifteen
    segments take a fraction); the segment's metadata names the files it took in, so a read
    between its write and their removal skips them. Files written in the last
    `ACTIVE_S` may belong to a sweep still appending, and are left alone; one compaction at a
    time (a lock file). Returns the segment written, else None."""
    at_least = at_least or SEGMENT_FILES
    hdir = store.join(str(root), DIRECTORY)
    if store.is_uri(hdir) or not Path(hdir).is_dir():
        return None  # an object store has no lock to hold: its history is read unfolded
    with open(Path(hdir) / ".compact.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another sweep is folding these files
        cutoff = time.time() - ACTIVE_S
        loose = sorted(p for p in (Path(x) for x in files(root))
                       if p.parent == Path(hdir) and not p.name.startswith(SEGMENT)
                       and p.stat().st_mtime < cutoff)
        if len(loose) < at_least:
            return None
        loose = _foldable(loose)
        if len(loose) < at_least:
            return None
        loose = loose[:at_least]
        table = _read_table([str(p) for p in loose], None, None)
        units = {}
        for p in loose:
            units.update(columns.read_metadata(pq.read_schema(p).metadata))
        meta = {SOURCES_KEY: json.dumps([p.name for p in loose]).encode(),
                columns.META_KEY: json.dumps(units).encode()}
        segment = str(Path(hdir) / f"{SEGMENT}{now()[:19].replace(':', '')}-"
                      f"{uuid.uuid4().hex[:8]}.parquet")
        store.write_bytes(segment, parquet_bytes(table.replace_schema_metadata(meta)))
        for p in loose:
            p.unlink(missing_ok=True)
        return segment


def units(root: str | Path) -> dict[str, dict[str, str]]:
    """The metric columns' units, from the files' schema metadata."""
    out: dict[str, dict[str, str]] = {}
    paths = files(root)
    if not paths:
        return out
    fs, _ = store.resolve(paths[0])
    for _, schema in salvage.footers(fs, paths):  # a damaged file named, as by every reader
        out.update(columns.read_metadata(schema.metadata))
    return out


def parquet_bytes(table: pa.Table) -> bytes:
    """A history file: the units kept, pandas' metadata left out (a read opens every file's
    footer, and that was 15 of its 74 KB)."""
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != b"pandas"}
    if columns.META_KEY not in meta:  # a segment carries its run files' units already
        meta.update(columns.metadata(table.column_names))
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink)
    return sink.getvalue().to_pybytes()


def _sources(segment: str, present: set[str]) -> list[str]:
    """The run files among `present` that a segment took in: those it names whose run it holds
    rows of (a segment that claimed another run's file hid that run), none where it cannot be
    read. Its runs are read only while a file it names is still there (between its write and
    their removal, or a false claim): a read of the history lists every segment."""
    fs, path = store.resolve(segment)
    try:
        meta = pq.read_schema(path, filesystem=fs).metadata or {}
        named = [n for n in json.loads(meta.get(SOURCES_KEY, b"[]"))
                 if isinstance(n, str) and n in present]
        if not named:
            return []
        runs = set(pq.read_table(path, columns=["run_id"], filesystem=fs)["run_id"].to_pylist())
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        salvage.warn(segment, f"cannot be read as a segment ({store.first_line(e)}): its "
                     "files are read one by one; move it away to silence this")
        return []
    held = {_file_prefix(r) for r in runs}
    out = [n for n in named if n.rsplit(".", 2)[0] in held]
    if len(out) < len(named):
        salvage.warn(segment, f"names {len(named) - len(out)} run file(s) whose rows it does "
                     "not hold: those files are read as they are")
    return out


def _file_prefix(run_id: Any) -> str:
    """The start of the name History gives a run's file."""
    return str(run_id or "run").replace("/", "_")


def _foldable(paths: list[Path]) -> list[Path]:
    """The run files a compaction may fold and remove: whole, and raybench's own (its columns,
    named after the run they hold). A damaged or foreign file stays where it is, for its
    owner to look at."""
    out = []
    for p in paths:
        try:  # every column: one whose pages do not read would be skipped by the fold, and
            # its file removed with the others (its rows gone)
            table = pq.read_table(p)
        except (pa.ArrowException, OSError, ValueError) as e:
            salvage.warn(str(p), f"cannot be folded ({store.first_line(e)}): left where it is")
            continue
        if not {"run_id", "recorded_at"} <= set(table.column_names):
            salvage.warn(str(p), "cannot be folded (no run_id or recorded_at: not a run file "
                         "raybench wrote): left where it is")
            continue
        if {_file_prefix(r) for r in table["run_id"].to_pylist()} == {p.name.rsplit(".", 2)[0]}:
            out.append(p)
    return out


def no_history(root: str | Path) -> str:
    return (f"raybench: {root} holds no history (no {DIRECTORY}/ folder of Parquet files and "
            f"no {LEGACY}). Fix: pass the results root a sweep wrote to (output.root, default "
            "./results)")


def _remove_stale_temporaries(hdir: str) -> None:
    if store.is_uri(hdir):
        return  # an object appears whole on upload: no temporaries
    cutoff = time.time() - STALE_TMP_S
    for p in Path(hdir).glob("*.tmp*"):
        try:
            if p.is_file() and p.stat().st_mtime < cutoff:
                p.unlink()
        except OSError:
            pass  # another process removed it first


def main(argv: list[str] | None = None, prog: str = "python -m raybench.history") -> int:
    p = console.parser(prog, "Export the history under a results root as CSV.")
    p.add_argument("root", help="results root (holds history/ or a legacy history.parquet)")
    p.add_argument("--csv", required=True, metavar="FILE", help="write the rows as CSV")
    p.add_argument("--sweep", help="only this sweep's rows")
    p.add_argument("--trial-key", help="only this configuration's rows")
    args = p.parse_args(argv)
    if not files(args.root):
        print(no_history(args.root), file=sys.stderr)
        return 2
    keep = None
    for name, value in (("sweep", args.sweep), ("trial_key", args.trial_key)):
        if value is not None:
            term = ds.field(name) == value
            keep = term if keep is None else keep & term
    frame = read(args.root, keep)
    store.write_text(args.csv, frame.to_csv(index=False))
    print(f"{len(frame)} rows -> {args.csv}")
    return 0

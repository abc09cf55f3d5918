"""The results table on disk: `results.parquet`, `results.csv` and the per-trial JSON files.

Owns the table's layout (identity columns, then every config value, then metrics with units in
their names, then the rest) and its atomic writes: the Parquet file's schema metadata carries
the metric columns' units (columns.py), every file is written whole or not at all. Does not
make rows (rows.py) or decide when they are written (writer.py). Never parses strings back into
objects: Parquet and JSON only.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from raybench import columns, store
from raybench.records import uniform_cells
from raybench.trials import TrialSpec

ID_COLUMNS = ["sweep", "run_id", "stage", "trial_index", "trial_key", "system", "start_time",
              "end_time", "status", "error"]


class ResultsTable:
    """`<dir>/results.parquet` and `results.csv`, rewritten atomically on every append. On
    opening a run that has rows (a resume), the CSV is written again from the Parquet table,
    which is written first: a driver killed between the two left the CSV a row short."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.parquet = self.dir / "results.parquet"
        self.csv = self.dir / "results.csv"
        self.rows: list[dict[str, Any]] = []
        if self.parquet.exists():
            frame = store.read_rows(self.parquet)
            self.rows = frame.to_dict("records")
            atomic(self.csv, lambda p: frame.to_csv(p, index=False))

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        write_table(self.dir, to_frame(self.rows))

    def write_trial(self, trial: TrialSpec, detail: dict[str, Any]) -> Path:
        return self.write_detail(trial.index, trial.key, detail)

    def write_detail(self, index: int, key: str, detail: dict[str, Any]) -> Path:
        """`trials/NNNN_<key>.json`: a row's detail (a sweep's trial, an imported file's)."""
        path = self.dir / "trials" / f"{index:04d}_{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(jsonable(detail), indent=1, sort_keys=False)
        atomic(path, lambda p: Path(p).write_text(text))
        return path


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with identity columns first and a stable, sorted rest."""
    frame = uniform_cells(pd.DataFrame(rows))
    config = sorted(c for c in frame.columns if "." in c and c not in ID_COLUMNS)
    metrics = sorted(c for c in frame.columns if "/" in c)
    rest = [c for c in frame.columns if c not in {*ID_COLUMNS, *config, *metrics}]
    return frame[[*ID_COLUMNS, *config, *metrics, *rest]]


def write_table(directory: Path, frame: pd.DataFrame) -> None:
    """`results.parquet`, then `results.csv`, each whole or not at all."""
    atomic(Path(directory) / "results.parquet", lambda p: write_parquet(frame, p))
    atomic(Path(directory) / "results.csv", lambda p: frame.to_csv(p, index=False))


def write_parquet(frame: pd.DataFrame, path: str | Path) -> None:
    """The frame as Parquet, with its metric columns' units in the schema metadata."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = {**(table.schema.metadata or {}), **columns.metadata(list(frame.columns))}
    pq.write_table(table.replace_schema_metadata(meta), path)


def atomic(path: Path, write: Callable[[str], object]) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonable(obj: Any) -> Any:
    """`obj` with string keys and JSON's null for the floats JSON has no word for."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj

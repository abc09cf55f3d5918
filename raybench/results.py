"""The results table: one row per trial, failures included, appended after every trial.

Owns the row layout (identity columns, then every config value, then metrics with units in their
names, then status and error), atomic writes of `results.parquet` + `results.csv` and the
per-trial JSON with raw step times. Never parses strings back into objects: Parquet and JSON only.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from raybench.grid import TrialSpec

Status = Literal["ok", "oom", "error", "timeout", "infeasible"]
ID_COLUMNS = ["sweep", "run_id", "trial_index", "trial_key", "system", "start_time", "end_time",
              "status", "error"]


def make_row(*, sweep: str, run_id: str, system: str, trial: TrialSpec, status: Status,
             error: str | None, start: str, end: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "sweep": sweep, "run_id": run_id, "trial_index": trial.index, "trial_key": trial.key,
        "system": system, "start_time": start, "end_time": end, "status": status,
        "error": error, **trial.config(), **metrics,
    }


class ResultsTable:
    """`<dir>/results.parquet` and `results.csv`, rewritten atomically on every append."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.parquet = self.dir / "results.parquet"
        self.csv = self.dir / "results.csv"
        self.rows: list[dict[str, Any]] = []
        if self.parquet.exists():
            self.rows = pd.read_parquet(self.parquet).to_dict("records")

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        frame = to_frame(self.rows)
        _atomic(self.parquet, lambda p: frame.to_parquet(p, index=False))
        _atomic(self.csv, lambda p: frame.to_csv(p, index=False))

    def write_trial(self, trial: TrialSpec, detail: dict[str, Any]) -> Path:
        path = self.dir / "trials" / f"{trial.index:04d}_{trial.key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(_jsonable(detail), indent=1, sort_keys=False)
        _atomic(path, lambda p: Path(p).write_text(text))
        return path


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with identity columns first and a stable, sorted rest."""
    frame = pd.DataFrame(rows)
    config = sorted(c for c in frame.columns if "." in c and c not in ID_COLUMNS)
    metrics = sorted(c for c in frame.columns if "/" in c)
    rest = [c for c in frame.columns if c not in {*ID_COLUMNS, *config, *metrics}]
    return frame[[*ID_COLUMNS, *config, *metrics, *rest]]


def _atomic(path: Path, write) -> None:
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


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj

"""`python -m raybench.bench history`: what the long-lived history costs a sweep and a reader.

A run's appends into an empty results root and into one holding many earlier runs (each run's
own file, folded into segments as sweeps leave them), and the read of one configuration's rows
with the history page's columns and with all. Measures results/history.py; owns nothing of it.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from raybench import store
from raybench.results.history import (
    ACTIVE_S,
    DIRECTORY,
    PAGE_COLUMNS,
    SEGMENT,
    History,
    compact,
    files,
    parquet_bytes,
    read,
)


def benchmark(row: dict[str, Any], root: Path, rows: int = 100_000, runs: int = 1_000,
              run_rows: int = 100, repeats: int = 5) -> dict[str, Any]:
    """`python -m raybench.bench history`: a run's appends (`run_rows` rows, each rewriting
    that run's own file) into an empty root and into one holding `rows` rows of `runs` earlier
    runs, and reading one configuration's rows out of those, with the history page's columns
    and with all (ms; appends: medians over `repeats` runs)."""
    configs = max(1, rows // runs)  # each earlier run: one row per configuration

    def one_run(run_id: str) -> list[float]:
        h, costs = History(root, code_version="bench"), []
        for i in range(run_rows):
            t0 = time.perf_counter()
            h.append({**row, "run_id": run_id, "trial_index": i, "trial_key": f"cfg{i % configs}"})
            costs.append(1e3 * (time.perf_counter() - t0))
        return costs

    empty = [c for r in range(repeats) for c in one_run(f"empty{r}")]
    for p in files(root):  # leave the root empty again
        fs, path = store.resolve(p)
        fs.delete_file(path)
    fill_s, fold_s = _earlier_runs(row, root, runs, configs)
    layout = [Path(p).name for p in files(root)]
    full = [c for r in range(repeats) for c in one_run(f"full{r}")]

    def reads(columns_: list[str] | None) -> tuple[list[float], int]:
        out, found = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            found = len(read(root, ds.field("trial_key") == "cfg7", columns_))
            out.append(1e3 * (time.perf_counter() - t0))
        return out, found

    page, found = reads(PAGE_COLUMNS)
    whole, _ = reads(None)
    return {
        "row_columns": len(row), "existing_rows": runs * configs, "existing_runs": runs,
        "run_rows": run_rows, "fill_s": round(fill_s, 1), "folding_s": round(fold_s, 1),
        "files": len(layout), "segments": sum(n.startswith(SEGMENT) for n in layout),
        "append_ms_empty": _appends(empty, run_rows), "append_ms_full": _appends(full, run_rows),
        # one configuration's rows (every earlier run has one, each measured run one more)
        "read_one_config_rows": found,
        "read_one_config_page_columns_ms": page, "read_one_config_all_columns_ms": whole,
    }


def _earlier_runs(row: dict[str, Any], root: Path, runs: int, configs: int
                  ) -> tuple[float, float]:
    """`runs` earlier runs as sweeps leave them (a file each, written days ago, folded at each
    run's end once 64 are old enough); seconds in all and in the folds."""
    past = time.time() - 2 * ACTIVE_S
    fold_s, t0 = 0.0, time.perf_counter()
    for r in range(runs):
        frame = pd.DataFrame([{**row, "run_id": f"past{r:05d}", "trial_index": i,
                               "trial_key": f"cfg{i}", "recorded_at": f"2026-01-01T00:{r:05d}",
                               "code_version": "bench"} for i in range(configs)])
        path = Path(root, DIRECTORY, f"past{r:05d}.bench.parquet")
        table = pa.Table.from_pandas(frame, preserve_index=False)
        store.write_bytes(str(path), parquet_bytes(table))
        os.utime(path, (past, past))
        t1 = time.perf_counter()
        compact(root)
        fold_s += time.perf_counter() - t1
    return time.perf_counter() - t0, fold_s


def _appends(costs: list[float], run_rows: int) -> dict[str, float]:
    """Append times (ms) of runs of `run_rows` appends: median, max, a run's first and last."""
    return {"median": statistics.median(costs), "max": max(costs),
            "first": statistics.median(costs[::run_rows]),
            "last": statistics.median(costs[run_rows - 1::run_rows])}

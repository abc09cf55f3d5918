"""`python -m raybench.bench compare`: how `compare`'s time grows with a run's configurations.

Two made-up runs of N configurations each (a grid of two axes, windows per row, the columns a
real row has), NEW a few per cent off BASE, written as run directories and compared as
`python -m raybench.compare BASE NEW` compares them: the seconds for each N. Measures
compare.py; owns nothing of it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench import compare
from raybench.results.table import write_table


def made_up_run(root: Path, name: str, configs: int, windows: int, scale: float,
                seed: int) -> Path:
    """A run directory of `configs` ok rows, each with `windows` window throughputs."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(configs):
        mean = 100.0 + i % 7
        w = (mean * scale * (1 + 0.01 * rng.standard_normal(windows))).tolist()
        rows.append({
            "sweep": "bench", "run_id": name, "stage": "benchmark", "trial_index": i,
            "trial_key": f"k{i:06d}", "system": "bench", "start_time": "2026-01-01T00:00:00",
            "end_time": "2026-01-01T00:00:01", "status": "ok", "error": None,
            "workload.name": "resnet", "workload.batch_size": 8 * (1 + i % 4),
            "workload.seed": i // 4, "hardware.precision": "fp32",
            "train/samples_per_s": float(np.mean(w)), "train/window_samples_per_s": w,
            "system/fingerprint": "bench", "system/accelerator": "cpu",
        })
    out = root / name
    out.mkdir(parents=True)
    write_table(out, pd.DataFrame(rows))
    return out


def benchmark(sizes: list[int], windows: int = 5) -> dict[str, Any]:
    """Seconds of compare_runs (the runs' loading apart) for each number of configurations."""
    out: dict[str, Any] = {"windows": windows, "seconds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            base = made_up_run(Path(tmp) / str(n), "base", n, windows, 1.0, 0)
            new = made_up_run(Path(tmp) / str(n), "new", n, windows, 0.97, 1)
            b, nw = compare.load_run(str(base)), compare.load_run(str(new))
            t0 = time.perf_counter()
            results = compare.compare_runs(b, nw)
            out["seconds"][n] = round(time.perf_counter() - t0, 3)
            assert len(results) == n
    return out

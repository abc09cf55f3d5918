"""`python -m raybench.bench verdicts`: how often compare's rule errs, on simulated windows.

Windows are drawn with a known ratio NEW/BASE: each window's throughput is the run's mean times
a log-normal factor of the given CV, and, where `drift` is set, each run's mean moves by a
log-normal factor of that CV too (the run-to-run change one run's windows cannot see). For a
rerun (ratio 1) it counts how often report/judge.py calls it `slower`; for a slowdown (ratio
0.8 by default) how often it does not, and how often each verdict comes out. Measures the
rule; owns nothing of it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from raybench.report import judge


def simulate(windows: int, ratio: float, cv_pct: float, drift_pct: float, draws: int,
             threshold_pct: float, seed: int) -> dict[str, float]:
    """Shares of each verdict over `draws` simulated pairs of runs."""
    rng = np.random.default_rng(seed)

    def run(mean: np.ndarray) -> np.ndarray:
        shift = np.exp(drift_pct / 100 * rng.standard_normal((draws, 1)))
        return mean * shift * np.exp(cv_pct / 100 * rng.standard_normal((draws, windows)))

    base, new = run(np.full((draws, 1), 100.0)), run(np.full((draws, 1), 100.0 * ratio))
    verdicts = judge.decide_many(list(zip(base.tolist(), new.tolist(), strict=True)),
                                 threshold_pct)
    counts = Counter(v["verdict"] for v in verdicts)
    return {v: round(counts[v] / draws, 4) for v in judge.VERDICTS}


def benchmark(windows: list[int], cvs: list[float], drifts: list[float], slowdown: float,
              draws: int, threshold_pct: float = judge.THRESHOLD_PCT) -> list[dict[str, Any]]:
    """Per windows a side, window CV and run drift: the rerun's and the slowdown's verdicts."""
    out = []
    for n in windows:
        for cv in cvs:
            for drift in drifts:
                rerun = simulate(n, 1.0, cv, drift, draws, threshold_pct, seed=n)
                slow = simulate(n, slowdown, cv, drift, draws, threshold_pct, seed=1000 + n)
                out.append({"windows": n, "cv_pct": cv, "drift_pct": drift,
                            "rerun_called_slower": rerun["slower"],
                            "rerun": rerun,
                            f"missed_{round(100 * (1 - slowdown))}pct_slowdown":
                                round(1 - slow["slower"], 4),
                            "slowdown": slow})
    return out

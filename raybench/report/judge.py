"""Is a configuration slower? The decision between two sets of a configuration's windows.

Owns the rule that `python -m raybench.compare` and the report's history page both apply, made
from the rows' measured windows (`train/window_samples_per_s`): an exact two-sided
Mann-Whitney U test (scipy) AND a practical threshold, the larger of a default (3%) and the
run-to-run spread the configuration has shown where that is known. The ratio NEW/BASE of the
windows' means comes with a 95% percentile bootstrap interval (seeded). Verdicts: `slower` /
`faster` (significant and beyond the threshold), `unchanged` (the interval lies within the
threshold, or the difference is significant but smaller than it), `inconclusive` (neither;
with the windows per side that could decide). Pure: frames and lists in, verdicts out.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
import pandas as pd

from raybench.records import present
from raybench.report.assess import trained_rows
from raybench.results import fingerprint

THRESHOLD_PCT = 3.0  # below this a change is not worth a verdict, however certain
ALPHA = 0.05
WINDOWS = "train/window_samples_per_s"
THROUGHPUT = "train/samples_per_s"
VERDICTS = ("slower", "faster", "unchanged", "inconclusive")


def threshold_arg(text: str) -> float:
    """`--threshold-pct` as the command lines take it: a finite share, at least 0 (NaN passed
    every comparison and called nothing slower; a negative one called every run slower)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a threshold: give a per cent of 0 or more, e.g. 3")
    return value


def windows_to_decide(alpha: float = ALPHA) -> int:
    """The fewest windows per side with which an exact two-sided Mann-Whitney test can reach
    `alpha` at all (complete separation gives p = 2 / C(2n, n)): 4 for 0.05."""
    n = 1
    while 2 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def decide(base: list[float], new: list[float], threshold_pct: float = THRESHOLD_PCT,
           spread_pct: float | None = None) -> dict[str, Any]:
    """The verdict on NEW against BASE from their windows' throughputs."""
    from scipy.stats import bootstrap, mannwhitneyu  # 0.3 s: only when something is judged

    threshold = max(threshold_pct, spread_pct or 0.0)
    rule = "run-to-run spread" if spread_pct and spread_pct > threshold_pct else "fixed"
    b, n = np.asarray(base, float), np.asarray(new, float)
    ratio = float(n.mean() / b.mean())
    p = float(mannwhitneyu(n, b, alternative="two-sided", method="exact").pvalue)
    low = high = None
    if len(b) >= 3 and len(n) >= 3 and (np.ptp(b) > 0 or np.ptp(n) > 0):
        # vectorized: the same resamples (the generator draws them alike), a 2,000-fold
        # Python loop less per configuration
        ci = bootstrap((n, b), _ratio_of_means, paired=False, vectorized=True,
                       confidence_level=0.95, n_resamples=2000, method="percentile",
                       random_state=np.random.default_rng(0))
        low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
    change = 100.0 * (ratio - 1.0)
    within = low is not None and 1 - threshold / 100 <= low and high <= 1 + threshold / 100
    if p < ALPHA and abs(change) > threshold:
        verdict = "faster" if ratio > 1 else "slower"
    elif within or p < ALPHA:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    out = {"ratio": ratio, "ratio_ci95": [low, high], "change_pct": change, "p": p,
           "threshold_pct": threshold, "threshold": rule, "verdict": verdict,
           "windows": [len(b), len(n)]}
    if verdict == "inconclusive" and min(len(b), len(n)) < windows_to_decide():
        out["windows_needed"] = windows_to_decide()  # fewer cannot reach ALPHA at all
    return out


def _ratio_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) / np.mean(y, axis=axis)


EARLIER_RUNS = 5  # a row's baseline in the history: the windows of its last this many runs


def judge_history(hist: pd.DataFrame, threshold_pct: float = THRESHOLD_PCT,
                  run_id: str | None = None) -> pd.DataFrame:
    """Each benchmark row (of `run_id` only, where given) judged against the earlier rows of
    its configuration on the same system (`trial_key` and `system/fingerprint`): its windows
    against the pooled windows of the last EARLIER_RUNS of them, the threshold widened to the
    spread those runs showed (twice their throughput's CV, once there are three). One row per
    judged row, with the verdict's fields; rows without an earlier run are left out."""
    ok = trained_rows(hist)
    keys = [k for k in ("trial_key", "system/fingerprint") if k in ok]
    out = []
    for _, part in ok.sort_values("recorded_at", kind="stable").groupby(keys, dropna=False):
        rows = part.to_dict("records")
        for i in range(1, len(rows)):
            row = rows[i]
            if run_id is not None and row["run_id"] != run_id:
                continue
            earlier = rows[max(0, i - EARLIER_RUNS):i]
            base = [w for r in earlier for w in windows(r)]
            new = windows(row)
            spread = _spread([r[THROUGHPUT] for r in rows[:i]])
            result = decide(base, new, threshold_pct, spread) if base and new else {
                "verdict": "inconclusive", "reason": "no windows in these rows"}
            out.append({**row, **result, "base": float(np.mean([r[THROUGHPUT] for r in earlier])),
                        "software_change": fingerprint.software_changes(rows[i - 1], row)})
    return pd.DataFrame(out)


def run_spread(history: pd.DataFrame | None, row: dict[str, Any],
               exclude: set[Any] = frozenset()) -> float | None:
    """Twice the throughput CV% over the history's runs of this row's configuration on its
    system (other than `exclude`'s runs), once there are three; else None."""
    if history is None or history.empty or THROUGHPUT not in history:
        return None
    same = history[(history["trial_key"] == row.get("trial_key"))
                   & (history["status"] == "ok") & ~history["run_id"].isin(exclude)]
    fp = row.get("system/fingerprint")
    if "system/fingerprint" in same and present(fp):
        same = same[same["system/fingerprint"] == fp]
    return _spread(same[THROUGHPUT].dropna().tolist())


def _spread(values: list[float]) -> float | None:
    """Twice the CV% of a configuration's throughput over its runs, from three runs on."""
    if len(values) < 3:
        return None
    return 200.0 * float(np.std(values, ddof=1)) / float(np.mean(values))


def windows(row: dict[str, Any]) -> list[float]:
    w = row.get(WINDOWS)
    return [float(x) for x in w] if w is not None and len(w) else []

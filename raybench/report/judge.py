"""Is a configuration slower? The decision between two sets of a configuration's windows.

Owns the rule that `python -m raybench.compare` and the report's history page both apply, made
from the rows' measured windows (`train/window_samples_per_s`; for a closed-loop or offline
serving row, `serve/window_output_tokens_per_s`): a two-sided test AND a practical
threshold, the larger of a default (3%) and the run-to-run spread the configuration has shown
where that is known. The test: with four windows a side or more, the exact Mann-Whitney U
(scipy), the ratio NEW/BASE of the windows' means with a 95% percentile bootstrap interval
(seeded); with two or three, where Mann-Whitney cannot reach p < 0.05 at all (a quick row's
three: p >= 0.10), Welch's t on the windows' logs and its interval. Verdicts: `slower` /
`faster` (significant and beyond the threshold), `unchanged` (the interval lies within the
threshold, or the difference is significant but smaller than it), `inconclusive` (neither;
with about how many windows a side would decide). Pure: frames and lists in, verdicts out.
"""

from __future__ import annotations

import argparse
import math
import warnings
from typing import Any

import numpy as np
import pandas as pd

from raybench.records import present
from raybench.results import fingerprint

THRESHOLD_PCT = 3.0  # below this a change is not worth a verdict, however certain
ALPHA = 0.05
WINDOWS = "train/window_samples_per_s"
THROUGHPUT = "train/samples_per_s"
# a closed-loop or offline serving row's windows and rate (scenarios/llm/figures.py): judged
# by the same rule, where a row has no training windows
SERVE_WINDOWS = "serve/window_output_tokens_per_s"
SERVE_THROUGHPUT = "serve/output_tokens_per_s"
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
    return decide_many([(base, new)], threshold_pct, [spread_pct])[0]


def decide_many(pairs: list[tuple[list[float], list[float]]],
                threshold_pct: float = THRESHOLD_PCT,
                spreads: list[float | None] | None = None) -> list[dict[str, Any]]:
    """`decide` for many configurations at once: those with as many windows a side are tested
    in one scipy call (10,000 configurations, one by one, took 45 s; issue 63, item 4). Each
    verdict is the one its pair alone gets: the bootstrap's resamples are drawn per shape and
    shared by its rows, as one pair's call draws them."""
    spreads = spreads if spreads is not None else [None] * len(pairs)
    arrays = [(np.asarray(b, float), np.asarray(n, float)) for b, n in pairs]
    stats: list[dict[str, Any]] = [{} for _ in pairs]
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, (b, n) in enumerate(arrays):
        shapes.setdefault((len(b), len(n)), []).append(i)
    for (nb, nn), same in shapes.items():
        test = (_mann_whitney if min(nb, nn) >= windows_to_decide()
                else _welch_on_logs if min(nb, nn) >= 2 else _too_few)
        # 256 rows a call: the bootstrap's (rows, resamples, windows) arrays then stay in the
        # cache (10,000 rows in one call: 18.7 s of indexing; in 256s: 1.4 s)
        for at in range(0, len(same), 256):
            rows = same[at:at + 256]
            tested = test(np.stack([arrays[i][0] for i in rows]),
                          np.stack([arrays[i][1] for i in rows]))
            for j, i in enumerate(rows):
                stats[i] = {k: v[j] for k, v in tested.items()}
    return [_verdict(b, n, st, threshold_pct, spread)
            for (b, n), st, spread in zip(arrays, stats, spreads, strict=True)]


def _mann_whitney(b: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
    """Four windows a side or more: the exact Mann-Whitney test, the percentile bootstrap's
    interval of the ratio of means (rows whose windows are all equal: none)."""
    from scipy.stats import bootstrap, mannwhitneyu  # 0.3 s: only when something is judged

    p = np.atleast_1d(mannwhitneyu(n, b, alternative="two-sided", method="exact",
                                   axis=-1).pvalue)
    ci = bootstrap((n, b), _ratio_of_means, paired=False, vectorized=True, axis=-1,
                   confidence_level=0.95, n_resamples=2000, method="percentile",
                   random_state=np.random.default_rng(0)).confidence_interval
    # windows all equal on both sides: the interval is the ratio itself
    flat = (np.ptp(b, axis=-1) == 0) & (np.ptp(n, axis=-1) == 0)
    exact = n.mean(axis=-1) / b.mean(axis=-1)
    low = np.where(flat, exact, np.atleast_1d(ci.low))
    high = np.where(flat, exact, np.atleast_1d(ci.high))
    return {"p": p, "low": low, "high": high, "test": np.full(len(p), "mann-whitney")}


def _welch_on_logs(b: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
    """Two or three windows a side, where no exact Mann-Whitney test can reach ALPHA (3 a side:
    p >= 0.10 whatever the windows): Welch's t on the logs of the throughputs, its 95%
    interval of the log ratio taken back as a ratio. It assumes the windows' logs roughly
    normal, which three cannot show; simulated in `python -m raybench.bench verdicts`."""
    from scipy.stats import t as student  # scipy.stats: as above
    from scipy.stats import ttest_ind

    lb, ln = np.log(b), np.log(n)
    # rows whose windows are all equal (their p is set below) make scipy warn of precision
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = np.atleast_1d(ttest_ind(ln, lb, axis=-1, equal_var=False).pvalue)
        vb, vn = lb.var(axis=-1, ddof=1) / lb.shape[-1], ln.var(axis=-1, ddof=1) / ln.shape[-1]
        se = np.sqrt(vb + vn)
        df = (vb + vn) ** 2 / (vb ** 2 / (lb.shape[-1] - 1) + vn ** 2 / (ln.shape[-1] - 1))
        half = student.ppf(0.975, df) * se
    diff = ln.mean(axis=-1) - lb.mean(axis=-1)
    flat = se == 0  # windows all equal on both sides: the interval is the ratio itself
    p = np.where(flat, np.where(diff == 0, 1.0, 0.0), p)
    low = np.where(flat, np.exp(diff), np.exp(diff - half))
    high = np.where(flat, np.exp(diff), np.exp(diff + half))
    return {"p": p, "low": low, "high": high, "test": np.full(len(p), "welch-t on logs")}


def _too_few(b: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
    """One window on a side: no test can say anything about its spread."""
    k = len(b)
    return {"p": np.ones(k), "low": np.full(k, np.nan), "high": np.full(k, np.nan),
            "test": np.full(k, "none")}


def _verdict(b: np.ndarray, n: np.ndarray, st: dict[str, Any], threshold_pct: float,
             spread_pct: float | None) -> dict[str, Any]:
    threshold = max(threshold_pct, spread_pct or 0.0)
    rule = "run-to-run spread" if spread_pct and spread_pct > threshold_pct else "fixed"
    ratio = float(n.mean() / b.mean())
    p = float(st["p"])
    low, high = (None if math.isnan(st[k]) else float(st[k]) for k in ("low", "high"))
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
           "windows": [len(b), len(n)], "test": str(st["test"])}
    if verdict == "inconclusive":
        out["windows_needed"] = windows_needed(b, n, threshold)
    return out


def windows_needed(b: np.ndarray, n: np.ndarray, threshold_pct: float) -> int:
    """About how many windows a side would put the 95% interval of the ratio within the
    threshold at the spread these windows show (normal approximation: the half-width of the
    log ratio's interval is 1.96 * cv * sqrt(2 / windows)), and never fewer than two, nor
    than one more than the larger side has."""
    logs = [np.log(x) for x in (b, n) if len(x) > 1]
    cv = float(np.sqrt(np.mean([x.var(ddof=1) for x in logs]))) if logs else 0.0
    wanted = 2 * (1.96 * cv / math.log1p(threshold_pct / 100)) ** 2
    return max(2, max(len(b), len(n)) + 1, math.ceil(wanted))


def _ratio_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) / np.mean(y, axis=axis)


EARLIER_RUNS = 5  # a row's baseline in the history: the windows of its last this many runs


def judged_rows(hist: pd.DataFrame) -> pd.DataFrame:
    """The rows a history judges: benchmark rows that ran with a rate their windows measure
    (a training row's samples/s; a closed-loop or offline serving row's output tokens/s, where
    it kept its windows). A Server row has none: its throughput is its arrival rate."""
    df = hist[hist["stage"] == "benchmark"] if "stage" in hist else hist
    df = df[df["status"] == "ok"] if "status" in df else df
    trained = df[THROUGHPUT].notna() if THROUGHPUT in df else pd.Series(False, index=df.index)
    served = (df[SERVE_THROUGHPUT].notna() & df[SERVE_WINDOWS].notna()
              if SERVE_THROUGHPUT in df and SERVE_WINDOWS in df
              else pd.Series(False, index=df.index))
    return df[trained | served]


def judge_history(hist: pd.DataFrame, threshold_pct: float = THRESHOLD_PCT,
                  run_id: str | None = None) -> pd.DataFrame:
    """Each benchmark row (of `run_id` only, where given) judged against the earlier rows of
    its configuration on the same system (`trial_key` and `system/fingerprint`): its windows
    against the pooled windows of the last EARLIER_RUNS of them, the threshold widened to the
    spread those runs showed (twice their rate's CV, once there are three). Training and
    serving rows alike (judged_rows), each by its own rate (`headline`, named in `metric`).
    One row per judged row, with the verdict's fields; rows without an earlier run are left
    out."""
    ok = judged_rows(hist)
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
            spread = _spread([v for r in rows[:i] if (v := headline(r)) is not None])
            result = decide(base, new, threshold_pct, spread) if base and new else {
                "verdict": "inconclusive", "reason": "no windows in these rows"}
            rates = [v for r in earlier if (v := headline(r)) is not None]
            out.append({**row, **result, "metric": metric_of(row), "headline": headline(row),
                        "base": float(np.mean(rates)) if rates else None,
                        "software_change": fingerprint.software_changes(rows[i - 1], row)})
    return pd.DataFrame(out)


def run_spread(history: pd.DataFrame | None, row: dict[str, Any],
               exclude: set[Any] = frozenset()) -> float | None:
    """Twice the CV% of this row's rate (`metric_of`) over the history's runs of its
    configuration on its system (other than `exclude`'s runs), once there are three; else
    None."""
    metric = metric_of(row)
    if history is None or history.empty or metric is None or metric not in history:
        return None
    same = history[(history["trial_key"] == row.get("trial_key"))
                   & (history["status"] == "ok") & ~history["run_id"].isin(exclude)]
    fp = row.get("system/fingerprint")
    if "system/fingerprint" in same and present(fp):
        same = same[same["system/fingerprint"] == fp]
    return _spread(same[metric].dropna().tolist())


def _spread(values: list[float]) -> float | None:
    """Twice the CV% of a configuration's throughput over its runs, from three runs on."""
    if len(values) < 3:
        return None
    return 200.0 * float(np.std(values, ddof=1)) / float(np.mean(values))


def windows(row: dict[str, Any]) -> list[float]:
    """A row's measured windows: a training row's throughput per window, else a serving row's
    output tokens/s per window; none for a row that has neither."""
    for key in (WINDOWS, SERVE_WINDOWS):
        w = row.get(key)
        if w is not None and not isinstance(w, float) and len(w):
            return [float(x) for x in w]
    return []


def metric_of(row: dict[str, Any]) -> str | None:
    """The column of the rate a row's windows measure: samples/s of a training row, output
    tokens/s of a serving one; None for a row with neither."""
    for key in (THROUGHPUT, SERVE_THROUGHPUT):
        if present(row.get(key)):
            return key
    return None


def headline(row: dict[str, Any]) -> float | None:
    """The rate a row's windows measure (`metric_of`'s column)."""
    key = metric_of(row)
    return float(row[key]) if key else None

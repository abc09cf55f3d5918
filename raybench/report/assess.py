"""Judging trials: a validity badge with reasons per trial, and the recommendations. Pure.

Owns what makes a figure trustworthy (ok status, enough measured steps, CV% under a threshold,
no throttling where telemetry says so) and the three recommendations: the fastest valid
configuration, the fastest within a memory budget, and the best accuracy per second where the
workload reports accuracy. Inputs are results-table frames; nothing here reads files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

CV_LIMIT_PCT = 10.0  # step-time CV above this: the window was too noisy to trust
MIN_STEPS = 10  # fewer measured steps than this give unstable percentiles
THROUGHPUT = "train/samples_per_s"
# accuracy metrics workloads report, best first; the first present one is used
ACCURACY_KEYS = ("xview3/aggregate", "eval/accuracy", "det/map50")


@dataclass(frozen=True)
class Thresholds:
    cv_pct: float = CV_LIMIT_PCT
    min_steps: int = MIN_STEPS


def validity(row: dict[str, Any], t: Thresholds = Thresholds()) -> list[str]:
    """Reasons a trial's numbers should not be trusted; empty when it is valid."""
    reasons = []
    status = row.get("status")
    if status != "ok":
        reasons.append("out of memory" if status == "oom" else f"{status}: "
                       f"{str(row.get('error') or '')[:120]}")
        return reasons
    cv = row.get("train/step_time_cv_pct")
    if _num(cv) and cv > t.cv_pct:
        reasons.append(f"step-time CV {cv:.1f}% > {t.cv_pct:g}%")
    steps = row.get("train/measured_steps")
    if _num(steps) and steps < t.min_steps:
        reasons.append(f"only {int(steps)} measured steps (< {t.min_steps})")
    if row.get("gpu/throttled") is True:
        reasons.append(f"GPU throttled ({row.get('gpu/throttle_reasons') or 'see telemetry'})")
    return reasons


def with_validity(df: pd.DataFrame, t: Thresholds = Thresholds()) -> pd.DataFrame:
    out = df.copy()
    reasons = [validity(r, t) for r in df.to_dict("records")]
    out["valid"] = [not r for r in reasons]
    out["validity_reasons"] = ["; ".join(r) for r in reasons]
    return out


def peak_memory_mb(row: dict[str, Any]) -> float | None:
    """The memory that limits a configuration: device peak on GPU, process peak on CPU."""
    for key in ("mem/peak_allocated_mb", "host/rss_peak_mb"):
        if _num(row.get(key)):
            return float(row[key])
    return None


def recommend(df: pd.DataFrame, memory_budget_mb: float | None = None) -> dict[str, Any]:
    """Best valid benchmark trials: fastest; fastest within the budget; best accuracy/s."""
    bench = df[df["stage"] == "benchmark"] if "stage" in df else df
    varied = varied_columns(bench)
    rows = [r for r in with_validity(bench).to_dict("records")
            if r["valid"] and _num(r.get(THROUGHPUT))]
    out: dict[str, Any] = {"fastest": None, "fastest_within_budget": None,
                           "best_accuracy_per_s": None, "memory_budget_mb": memory_budget_mb}
    if not rows:
        return out
    out["fastest"] = _pick(max(rows, key=lambda r: r[THROUGHPUT]), varied)
    if memory_budget_mb is not None:
        fitting = [r for r in rows if (peak_memory_mb(r) or float("inf")) <= memory_budget_mb]
        if fitting:
            out["fastest_within_budget"] = _pick(max(fitting, key=lambda r: r[THROUGHPUT]),
                                                 varied)
    acc_key = next((k for k in ACCURACY_KEYS if any(_num(r.get(k)) for r in rows)), None)
    if acc_key:
        scored = [r for r in rows if _num(r.get(acc_key))]
        best = max(scored, key=lambda r: r[acc_key] * r[THROUGHPUT])
        out["best_accuracy_per_s"] = _pick(best, varied) | {"accuracy_metric": acc_key,
                                                            "accuracy": best[acc_key]}
    return out


def config_label(row: dict[str, Any], varied: list[str]) -> str:
    """A short human name for a configuration: the values the grid varied, else the key."""
    parts = [f"{k.split('.', 1)[1]}={row[k]}" for k in varied if k in row]
    return ", ".join(parts) or str(row.get("trial_key"))


def varied_columns(df: pd.DataFrame) -> list[str]:
    """Config columns whose value differs between trials: the sweep's axes."""
    cols = [c for c in df.columns if c.startswith(("workload.", "hardware.", "measure."))]
    return [c for c in cols if df[c].astype(str).nunique() > 1]


def _pick(row: dict[str, Any], varied: list[str]) -> dict[str, Any]:
    return {"trial_key": row.get("trial_key"), "run_id": row.get("run_id"),
            "label": config_label(row, varied), "samples_per_s": row.get(THROUGHPUT),
            "peak_memory_mb": peak_memory_mb(row),
            "config": {k: row[k] for k in varied if k in row}}


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def regressions(hist: pd.DataFrame, threshold_pct: float = 5.0) -> pd.DataFrame:
    """Rows of the history whose throughput fell below the median of the earlier runs of the
    same configuration by more than the threshold, widened to twice the measured CV% where
    the run was noisier than that (noise is not a regression)."""
    ok = hist[(hist["status"] == "ok") & hist[THROUGHPUT].notna()]
    if "stage" in ok:
        ok = ok[ok["stage"] == "benchmark"]
    flagged = []
    for _, part in ok.sort_values("recorded_at").groupby("trial_key"):
        values = part[THROUGHPUT].tolist()
        for i in range(1, len(values)):
            base = float(pd.Series(values[:i]).median())
            cv = part["train/step_time_cv_pct"].iloc[i] if "train/step_time_cv_pct" in part else 0
            limit = max(threshold_pct, 2 * float(cv) if cv == cv and cv is not None else 0.0)
            drop = 100.0 * (base - values[i]) / base if base > 0 else 0.0
            if drop > limit:
                flagged.append({**part.iloc[i].to_dict(), "drop_pct": drop, "limit_pct": limit})
    return pd.DataFrame(flagged)

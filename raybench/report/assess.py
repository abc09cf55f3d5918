"""Judging trials: a validity badge with reasons per trial, and the recommendations. Pure.

Owns what makes a figure trustworthy (ok status, enough measured steps, CV% under a threshold
(across repeats where there are several windows, else across steps), no thermal or hardware
slowdown where telemetry says so (the power cap is a note, not a fault), a finite training
loss) and the three recommendations: the fastest valid configuration, the fastest within a
memory budget, and the best accuracy per second where the workload reports accuracy. Inputs
are results-table frames; nothing here reads files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from raybench import columns, fabric, workloads
from raybench.metrics import REPEAT_CV_LIMIT_PCT, SLOW_RANK_PCT
from raybench.telemetry import POWER_CAP

CV_LIMIT_PCT = 10.0  # step-time CV above this: the window was too noisy to trust
# With repeats, the windows' spread is judged (REPEAT_CV_LIMIT_PCT, metrics.py). Step-time CV
# is then the wrong test: loader-fed steps arrive in bursts (an H100 ResNet-50 at 13-33% step
# CV gave windows within 0.1-4.4% of each other), which a 10% rule would reject.
MIN_STEPS = 10  # fewer measured steps than this give unstable percentiles
THROUGHPUT = "train/samples_per_s"
# Columns naming what each row's workload declared for the report (hooks on its class): its
# accuracy figure (accuracy_metric), its headline rate, which ranks its rows where every row has
# it (headline_metric: on an H100, 978 ViT-L tiles/s of 384 px are fewer pixels than 602 tiles/s
# of 512 px), and its size axis (size_axis), which figures draw rates and memory against.
ACCURACY_METRIC = "eval/accuracy_metric"
HEADLINE = "perf/headline_metric"
SIZE_AXIS = "perf/size_axis"
# Inference rows: the Offline pass's samples/s, the Server rate found (in samples/s).
OFFLINE = "infer/samples_per_s"
SERVER = "server/samples_per_s"
SERVING = "serve/output_tokens_per_s"  # an LLM's serving rows: output tokens, not samples
REPLICAS = "inference.replicas"
SCALING = "infer/scaling_efficiency_pct"


@dataclass(frozen=True)
class Thresholds:
    cv_pct: float = CV_LIMIT_PCT
    repeat_cv_pct: float = REPEAT_CV_LIMIT_PCT
    min_steps: int = MIN_STEPS


def validity(row: dict[str, Any], t: Thresholds = Thresholds()) -> list[str]:
    """Reasons a trial's numbers should not be trusted; empty when it is valid."""
    reasons = []
    status = row.get("status")
    if status != "ok":
        reasons.append("out of memory" if status == "oom" else f"{status}: "
                       f"{columns.text(row.get('error'))[:120]}")
        return reasons
    repeat_cv = row.get("train/repeat_cv_pct")
    cv = row.get("train/step_time_cv_pct")
    if _num(repeat_cv):  # several windows: judge the spread of what the headline averages
        if repeat_cv > t.repeat_cv_pct:
            reasons.append(f"CV across repeats {repeat_cv:.1f}% > {t.repeat_cv_pct:g}%")
    elif _num(cv) and cv > t.cv_pct:
        reasons.append(f"step-time CV {cv:.1f}% > {t.cv_pct:g}%")
    steps = row.get("train/measured_steps")
    if _num(steps) and steps < t.min_steps:
        reasons.append(f"only {int(steps)} measured steps (< {t.min_steps})")
    if row.get("train/loss_finite") is False:
        reasons.append("training loss became nan/inf: the run diverged, its step times are not "
                       "a training run's (lower workload.lr, or check the precision)")
    reasons_text = columns.text(row.get("gpu/throttle_reasons"))
    slowdowns = [r for r in reasons_text.split(",") if r and r != POWER_CAP]
    if slowdowns or (row.get("gpu/throttled") is True and not reasons_text):
        reasons.append(f"GPU throttled ({','.join(slowdowns) or 'see telemetry'})")
    if row.get("infer/accuracy_ok") is False:  # the accuracy gate of an inference run
        acc, metric = row.get("infer/accuracy"), row.get("infer/accuracy_metric")
        metric = metric if isinstance(metric, str) else "accuracy"  # rows before the column
        reasons.append(f"{metric} {acc:.4f} < target {row.get('infer/accuracy_target'):g}"
                       if _num(acc) else f"{metric} not measured")
    if row.get("server/met_bound") is False:
        bound = row.get("server/latency_bound_ms")
        reason = (f"no rate kept p{row.get('server/latency_percentile'):g} latency under "
                  f"{bound:g} ms" if _num(bound) else "no rate met the token bounds "
                  "(server/ttft_bound_ms, server/tpot_bound_ms)")
        if row.get("server/rule") == "mlperf":  # rows before the rule was required say none
            # a short run may keep its percentile and still fail: too few queries to certify
            reason += (f" by MLPerf's rule (early stopping: {row.get('server/early_stopping')};"
                       f" {_count(row.get('server/queries_needed'))} queries needed, "
                       f"{_count(row.get('server/queries'))} sent)")
        reasons.append(reason)
    return reasons


def _count(value: Any) -> str:
    return f"{int(value):,}" if _num(value) else "?"


def notes(row: dict[str, Any]) -> list[str]:
    """What a reader should know of a valid row without distrusting it."""
    out = []
    capped = row.get("gpu/power_capped_pct")
    # rows written before the share was recorded name the bit in throttle_reasons only
    if (_num(capped) and capped > 0) or (capped is None and POWER_CAP in columns.text(
            row.get("gpu/throttle_reasons"))):
        power, clock = row.get("gpu/power_mean_w"), row.get("gpu/sm_clock_mean_mhz")
        share = f" in {capped:.0f}% of samples" if _num(capped) else ""
        out.append("at the GPU's power limit" + share
                   + (f", {power:.0f} W mean" if _num(power) else "")
                   + (f", SM clock {clock:.0f} MHz mean" if _num(clock) else ""))
    nodes = row.get("cluster/nodes_used")
    if _num(nodes) and nodes > 1 and fabric.over_sockets(row.get("cluster/nccl_net")):
        out.append("measured over TCP sockets (NCCL NET/Socket): the nodes' InfiniBand, RoCE or "
                   "EFA devices were not used; see cluster/ for the settings")
    slow = row.get("train/slow_ranks")
    if isinstance(slow, str) and slow:
        out.append(f"rank {slow} more than {SLOW_RANK_PCT:g}% slower than the median rank on "
                   "its own compute (DDP's waits hide it in step times; see per-rank times)")
    return out


def with_validity(df: pd.DataFrame, t: Thresholds = Thresholds()) -> pd.DataFrame:
    out = df.copy()
    rows = df.to_dict("records")
    reasons = [validity(r, t) for r in rows]
    out["valid"] = [not r for r in reasons]
    out["validity_reasons"] = ["; ".join(r) for r in reasons]
    out["validity_notes"] = ["; ".join(notes(r)) for r in rows]
    return out


def peak_memory_mb(row: dict[str, Any]) -> float | None:
    """The memory that limits a configuration: device peak on GPU, process peak on CPU."""
    for key in ("mem/peak_allocated_mb", "host/rss_peak_mb"):
        if _num(row.get(key)):
            return float(row[key])
    return None


def with_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """Offline rows gain their scaling efficiency: samples/s over replicas x the samples/s of
    the 1-replica row of the same configuration and run (none where that row is missing)."""
    if OFFLINE not in df or REPLICAS not in df:
        return df
    out = df.copy()
    ok = out[(out["status"] == "ok") & out[OFFLINE].notna()]
    others = [c for c in varied_columns(ok) if c != REPLICAS] + ["run_id"]
    eff = pd.Series(float("nan"), index=out.index)
    for _, part in ok.groupby([c for c in others if c in ok], dropna=False):
        base = part[part[REPLICAS] == 1][OFFLINE]
        if not base.empty:
            eff[part.index] = 100.0 * part[OFFLINE] / (part[REPLICAS] * base.iloc[0])
    out[SCALING] = eff
    return out


def recommend(df: pd.DataFrame, memory_budget_mb: float | None = None) -> dict[str, Any]:
    """Best valid benchmark trials: fastest; fastest within the budget; best accuracy/s."""
    bench = df[df["stage"] == "benchmark"] if "stage" in df else df
    varied = varied_columns(bench)
    judged = with_validity(bench).to_dict("records")
    # Training rows rank by training throughput; an inference sweep by its Offline samples/s,
    # else by the Server rate found; an LLM's serving rows by output tokens/s (per GPU: their
    # headline, below).
    key = next((k for k in (THROUGHPUT, OFFLINE, SERVER, SERVING)
                if any(r["valid"] and _num(r.get(k)) for r in judged)), THROUGHPUT)
    rows = [r for r in judged if r["valid"] and _num(r.get(key))]
    out: dict[str, Any] = {"fastest": None, "fastest_within_budget": None,
                           "best_accuracy_per_s": None, "memory_budget_mb": memory_budget_mb}
    if not rows:
        return out
    if key != THROUGHPUT:
        rows = [{**r, THROUGHPUT: r[key]} for r in rows]  # what _pick and the page read
    rate = rate_column(rows)
    out["ranked_by"] = rate if rate != THROUGHPUT or key == THROUGHPUT else key
    shown = rate if rate != THROUGHPUT else None

    def pick(row: dict[str, Any]) -> dict[str, Any]:
        return _pick(row, varied, shown)

    out["fastest"] = pick(max(rows, key=lambda r: r[rate]))
    if memory_budget_mb is not None:
        fitting = [r for r in rows if (peak_memory_mb(r) or float("inf")) <= memory_budget_mb]
        if fitting:
            out["fastest_within_budget"] = pick(max(fitting, key=lambda r: r[rate]))
    acc_key = accuracy_key(rows)
    if acc_key:
        scored = [r for r in rows if _num(r.get(acc_key))]
        best = max(scored, key=lambda r: r[acc_key] * r[THROUGHPUT])
        out["best_accuracy_per_s"] = pick(best) | {"accuracy_metric": acc_key,
                                                    "accuracy": best[acc_key]}
    return out


def accuracy_key(rows: list[dict[str, Any]]) -> str | None:
    """The accuracy figure these rows' workload declared (`eval/accuracy_metric`), where a row
    has it: the most common name, so one odd row does not change what a table is ranked by."""
    named = [r[ACCURACY_METRIC] for r in rows if isinstance(r.get(ACCURACY_METRIC), str)
             and _num(r.get(r[ACCURACY_METRIC]))]
    return max(sorted(set(named)), key=named.count) if named else None


def rate_column(rows: list[dict[str, Any]]) -> str:
    """The rate these rows are ranked and drawn by: the headline their workload declared where
    every row has it (pixels/s of tiles, tokens/s per GPU of an LLM), else samples/s."""
    headline = declared(rows, HEADLINE, "headline_metric")
    return headline if headline and all(_num(r.get(headline)) for r in rows) else THROUGHPUT


def declared(rows: list[dict[str, Any]], column: str, hook: str) -> str | None:
    """What these rows' workload declared for the report in `column` (written to each row):
    the most common name, so one odd row does not change it. Rows of runs older than the
    column: the class attribute `hook` of their workload (`workload.name`), where it is known."""
    named = [r[column] for r in rows if isinstance(r.get(column), str)]
    if not named and not any(column in r for r in rows):
        for name in sorted({r.get("workload.name") for r in rows} - {None}):
            try:
                value = getattr(workloads.get(str(name)), hook)
            except KeyError:  # a workload this version no longer has
                continue
            named += [value] if value else []
    return max(sorted(set(named)), key=named.count) if named else None


def size_axis(df: pd.DataFrame) -> str | None:
    """The size axis these rows' workload declared (a config column such as the tile), where
    the grid varied it; None: nothing to draw against."""
    axis = declared(df.to_dict("records"), SIZE_AXIS, "size_axis")
    return axis if axis and axis in df and df[axis].nunique() > 1 else None


def rate_text(pick: dict[str, Any]) -> str:
    """The pick's throughput as people read it: samples/s, and its workload's headline rate
    where it declares one (pixels/s of tiles)."""
    text = f"{pick['samples_per_s']:.1f} samples/s"
    headline = pick.get("headline")
    if not headline:
        return text
    metric = columns.lookup(headline["metric"])  # else as its key spells it: x_per_s, x/s
    unit = metric.unit if metric else headline["metric"].rpartition("/")[2].replace("_per_", "/")
    value, prefix = headline["value"], ""
    for scale, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            value, prefix = value / scale, p
            break
    if headline["metric"].startswith(SERVING.split("/")[0] + "/"):  # tokens, not samples
        return f"{value:.1f} {prefix}{unit} ({headline['metric'].split('/')[1]})"
    return f"{text} ({value:.1f} {prefix}{unit})"


def config_label(row: dict[str, Any], varied: list[str]) -> str:
    """A short human name for a configuration: the values the grid varied, else the key."""
    parts = [f"{k.split('.', 1)[1]}={row[k]}" for k in varied if k in row]
    return ", ".join(parts) or str(row.get("trial_key"))


def varied_columns(df: pd.DataFrame) -> list[str]:
    """Config columns whose value differs between trials: the sweep's axes.

    A measure.* column that only follows another axis (the tile benchmark's warmup and window
    are set per mode) is not an axis of its own and would only lengthen every label."""
    cols = [c for c in df.columns
            if c.startswith(("workload.", "hardware.", "measure.", "inference."))]
    varied = [c for c in cols if df[c].astype(str).nunique() > 1]
    axes = [c for c in varied if not c.startswith("measure.")]
    if not axes:
        return varied
    keys = df[axes].astype(str)
    return axes + [c for c in varied if c.startswith("measure.")
                   and (df[c].astype(str).groupby([keys[a] for a in axes]).nunique() > 1).any()]


def _pick(row: dict[str, Any], varied: list[str], headline: str | None = None
          ) -> dict[str, Any]:
    return {"trial_key": row.get("trial_key"), "run_id": row.get("run_id"),
            "label": config_label(row, varied), "samples_per_s": row.get(THROUGHPUT),
            "headline": {"metric": headline, "value": row[headline]}
            if headline and _num(row.get(headline)) else None,
            "peak_memory_mb": peak_memory_mb(row),
            "config": {k: row[k] for k in varied if k in row}}


def trained_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Training rows that ran (inference rows have figures of their own: inference.py)."""
    if "stage" in df:
        df = df[df["stage"] == "benchmark"]
    df = df[df["status"] == "ok"] if "status" in df else df
    return df[df[THROUGHPUT].notna()] if THROUGHPUT in df else df.iloc[0:0]


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v

"""Figures of a report: results frames in, plotly figures out (None where a figure does not
apply to the data, e.g. scaling with a single GPU count). Pure: no files, no globals.

Owns which quantity goes on which axis and how series are grouped: throughput vs batch per
worker count and precision, scaling efficiency against the ideal line, memory vs batch and size,
memory vs throughput with the Pareto frontier, step-time distributions per trial and per rank,
and the preprocess stage.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from raybench.report import inference, serving, tiles
from raybench.report.assess import (
    ACCURACY_METRIC,
    THROUGHPUT,
    accuracy_key,
    config_label,
    peak_memory_mb,
    size_axis,
    trained_rows,
    varied_columns,
)

BATCH = "workload.batch_size"
WORLD = "train/world_size"
PRECISION = "hardware.precision"


def _series_key(row: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k.split('/')[-1].split('.')[-1]}={row[k]}" for k in keys if k in row)


def throughput_vs_batch(df: pd.DataFrame) -> go.Figure | None:
    ok = trained_rows(df)
    if ok.empty or BATCH not in ok or ok[BATCH].nunique() < 2:
        return None
    # a line per run, rank count, precision and other workload setting the grid varied
    keys = [k for k in ("run_id", WORLD, PRECISION) if k in ok and ok[k].nunique() > 1] + \
        [c for c in varied_columns(ok) if c.startswith("workload.") and c != BATCH]
    fig = go.Figure()
    for name, part in ok.groupby(keys, dropna=False) if keys else [("all", ok)]:
        part = part.groupby(BATCH, as_index=False)[THROUGHPUT].max().sort_values(BATCH)
        label = _series_key(dict(zip(keys, name if isinstance(name, tuple) else (name,),
                                     strict=False)), keys) or "all trials"
        fig.add_trace(go.Scatter(x=part[BATCH], y=part[THROUGHPUT], mode="lines+markers",
                                 name=label))
    fig.update_layout(title="Throughput vs batch size (per rank)", xaxis_type="log",
                      xaxis_title="batch size per rank", yaxis_title="samples/s (all ranks)")
    return fig


def scaling_efficiency(df: pd.DataFrame) -> go.Figure | None:
    """Throughput at n ranks over n x throughput at 1 rank, for otherwise equal configs."""
    ok = trained_rows(df)
    if ok.empty or WORLD not in ok or ok[WORLD].nunique() < 2 or (ok[WORLD] == 1).sum() == 0:
        return None
    others = [c for c in varied_columns(ok)
              if c not in ("hardware.num_gpus", "hardware.cpu_workers")]
    fig = go.Figure()
    ns = sorted(ok[WORLD].unique())
    fig.add_trace(go.Scatter(x=ns, y=[100.0] * len(ns), mode="lines", name="ideal",
                             line={"dash": "dash", "color": "grey"}))
    groups = ok.groupby(others, dropna=False) if others else [("all", ok)]
    for name, part in groups:
        base = part[part[WORLD] == 1][THROUGHPUT]
        if base.empty:
            continue
        per_n = part.groupby(WORLD)[THROUGHPUT].max()
        eff = 100.0 * per_n / (per_n.index * base.max())
        label = _series_key(dict(zip(others, name if isinstance(name, tuple) else (name,),
                                     strict=False)), others) or "all trials"
        fig.add_trace(go.Scatter(x=list(eff.index), y=list(eff.values), mode="lines+markers",
                                 name=label))
    fig.update_layout(title="Scaling efficiency vs ranks (100% = ideal)", xaxis_title="ranks",
                      yaxis_title="efficiency %", xaxis_dtick=1)
    return fig


def memory_vs_batch(df: pd.DataFrame) -> go.Figure | None:
    ok = trained_rows(df)
    if ok.empty or BATCH not in ok:
        return None
    cols = [c for c in ("mem/peak_allocated_mb", "mem/peak_reserved_mb", "mem/allocated_mb",
                        "host/rss_peak_mb") if c in ok and ok[c].notna().any()]
    if not cols:
        return None
    axis = size_axis(ok)
    size = axis.split(".", 1)[-1] if axis else None
    fig = go.Figure()
    for col in cols:
        for t, part in ok.groupby(axis) if axis else [(None, ok)]:
            part = part.groupby(BATCH, as_index=False)[col].max().sort_values(BATCH)
            name = col.split("/")[1] + (f", {size}={t}" if axis else "")
            fig.add_trace(go.Scatter(x=part[BATCH], y=part[col], mode="lines+markers", name=name))
    fig.update_layout(title="Memory vs batch size" + (f" and {size}" if axis else ""),
                      xaxis_title="batch size per rank", yaxis_title="MB")
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated in (lower memory, higher throughput), by memory."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def memory_vs_throughput(df: pd.DataFrame) -> go.Figure | None:
    rows = [r for r in trained_rows(df).to_dict("records") if peak_memory_mb(r) is not None]
    if len(rows) < 2:
        return None
    varied = varied_columns(trained_rows(df))
    pts = [(peak_memory_mb(r), r[THROUGHPUT]) for r in rows]
    labels = [config_label(r, varied) for r in rows]
    front = pareto_front(pts)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers",
                             name="trials", text=labels, hovertemplate="%{text}<br>%{x:.0f} MB, "
                             "%{y:.1f} samples/s<extra></extra>"))
    fig.add_trace(go.Scatter(x=[pts[i][0] for i in front], y=[pts[i][1] for i in front],
                             mode="lines+markers", name="Pareto frontier",
                             text=[labels[i] for i in front], line={"color": "crimson"}))
    fig.update_layout(title="Peak memory vs throughput", xaxis_title="peak memory MB",
                      yaxis_title="samples/s")
    return fig


def step_time_distributions(details: dict[str, dict[str, Any]], df: pd.DataFrame
                            ) -> go.Figure | None:
    """Box per trial of every measured step (all ranks pooled) from the trial JSON files."""
    if not details:
        return None
    varied = varied_columns(trained_rows(df))
    rows = {r["trial_key"]: r for r in trained_rows(df).to_dict("records")}
    fig = go.Figure()
    for key, d in details.items():
        steps = [(w + c) * 1e3 for rec in d.get("records", [])
                 for w, c in zip(rec["wait_s"], rec["compute_s"], strict=True)]
        if steps and key in rows:
            fig.add_trace(go.Box(y=steps, name=config_label(rows[key], varied), boxmean=True))
    if not fig.data:
        return None
    fig.update_layout(title="Step time per trial (all ranks)", yaxis_title="ms", showlegend=False)
    return fig


def rank_skew(details: dict[str, dict[str, Any]]) -> go.Figure | None:
    """Mean step time per rank for multi-rank trials: a slow node or GPU stands out."""
    fig = go.Figure()
    for key, d in details.items():
        ranks = d.get("ranks", [])
        if len(ranks) > 1:
            fig.add_trace(go.Bar(x=[f"rank {r['rank']} ({r['hostname']})" for r in ranks],
                                 y=[r["step_time_mean_ms"] for r in ranks], name=key))
    if not fig.data:
        return None
    fig.update_layout(title="Mean step time per rank", yaxis_title="ms", barmode="group")
    return fig


def accuracy_vs_throughput(df: pd.DataFrame) -> go.Figure | None:
    """Where the workload reports accuracy: what each configuration buys and costs."""
    ok = trained_rows(df)
    key = accuracy_key(ok.to_dict("records"))
    if key is None:
        return None
    part = ok[ok[key].notna()]
    varied = varied_columns(ok)
    fig = go.Figure(go.Scatter(
        x=part[THROUGHPUT], y=part[key], mode="markers+text", textposition="top center",
        text=[config_label(r, varied) for r in part.to_dict("records")],
        hovertemplate="%{text}<br>%{x:.1f} samples/s, %{y:.3f}<extra></extra>"))
    fig.update_layout(title=f"{key} vs throughput", xaxis_title="samples/s", yaxis_title=key)
    return fig


def epoch_curves(details: dict[str, dict[str, Any]]) -> go.Figure | None:
    """Epoch-based trials: accuracy after each epoch and each epoch's training time."""
    runs = []
    for key, d in details.items():
        rank0 = next((r for r in d.get("records", []) if r.get("rank") == 0), None)
        epochs = (rank0 or {}).get("epochs") or []
        acc = (d.get("row") or {}).get(ACCURACY_METRIC)
        acc = acc if any(e.get(acc) is not None for e in epochs) else None
        if epochs:
            runs.append((key, epochs, acc))
    if not runs:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True,
                        subplot_titles=("accuracy after each epoch", "training time per epoch (s)"))
    palette = plotly.colors.qualitative.Plotly
    for i, (key, epochs, acc) in enumerate(runs):
        x = [e["epoch"] for e in epochs]
        line = {"color": palette[i % len(palette)]}  # one colour per trial in both panels
        if acc:
            fig.add_trace(go.Scatter(x=x, y=[e.get(acc) for e in epochs], mode="lines+markers",
                                     name=f"{key} {acc}", legendgroup=key, line=line),
                          row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[e["train_s"] for e in epochs], mode="lines+markers",
                                 name=key, legendgroup=key, showlegend=not acc, line=line),
                      row=2, col=1)
    fig.update_layout(title="Training by epoch", height=640)
    fig.update_xaxes(title_text="epoch", dtick=1, row=2, col=1)
    return fig


def gpu_timelines(details: dict[str, dict[str, Any]]) -> go.Figure | None:
    """GPU utilisation and power over each trial's measured window, per rank (from NVML)."""
    traces = []
    for key, d in details.items():
        for rec in d.get("records", []):
            samples = rec.get("telemetry") or []
            if len(samples) < 2:
                continue
            t0 = samples[0]["t"]
            x = [s["t"] - t0 for s in samples]
            name = f"{key} rank {rec['rank']}"
            traces.append((name, x, [s.get("util_pct") for s in samples],
                           [s.get("power_w") for s in samples]))
    if not traces:
        return None
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True,
                        subplot_titles=("GPU utilisation %", "GPU power W"))
    for name, x, util, power in traces:
        fig.add_trace(go.Scatter(x=x, y=util, name=name, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=power, name=name, legendgroup=name, showlegend=False),
                      row=2, col=1)
    fig.update_layout(title="GPU telemetry over the measured window")
    fig.update_xaxes(title_text="seconds into the window", row=2, col=1)
    return fig


def preprocess_stage(df: pd.DataFrame) -> go.Figure | None:
    if "stage" not in df:
        return None
    pre = df[(df["stage"] == "preprocess") & (df["status"] == "ok")]
    rate = "preprocess/chips_per_s"
    if pre.empty or rate not in pre or pre[rate].isna().all():
        return None
    cpus = pre["preprocess.cpus"] if "preprocess.cpus" in pre else [None] * len(pre)
    x = [f"cpus={'all' if c is None or c != c else int(c)}" for c in cpus]
    fig = go.Figure(go.Bar(x=x, y=pre["preprocess/chips_per_s"], name="chips/s",
                           text=[f"{v:.0f} MB peak" for v in pre["preprocess/peak_rss_mb_worker"]]))
    fig.update_layout(title="Preprocessing: chips/s", yaxis_title="chips/s")
    return fig


def all_figures(df: pd.DataFrame, details: dict[str, dict[str, Any]]
                ) -> list[tuple[str, go.Figure]]:
    every = details
    details = {k: d for k, d in every.items() if not (d.get("trial") or {}).get("inference")}
    candidates = [
        ("throughput", throughput_vs_batch(df)), ("scaling", scaling_efficiency(df)),
        ("memory", memory_vs_batch(df)), ("size_throughput", tiles.throughput_vs_size(df)),
        ("size_memory", tiles.memory_vs_size(df)), ("rate_mfu", tiles.rate_and_mfu(df)),
        ("step_breakdown", tiles.step_breakdown(df)),
        ("pareto", memory_vs_throughput(df)),
        ("steps", step_time_distributions(details, df)), ("ranks", rank_skew(details)),
        ("telemetry", gpu_timelines(details)),
        ("accuracy", accuracy_vs_throughput(df)), ("epochs", epoch_curves(details)),
        ("preprocess", preprocess_stage(df)),
        ("comparison", comparison_per_rank(df)),
        *inference.figures(df, every), *serving.figures(df, every),
    ]
    return [(name, fig) for name, fig in candidates if fig is not None]


def comparison_per_rank(df: pd.DataFrame) -> go.Figure | None:
    """Several runs side by side, normalised per rank (per GPU on GPU runs)."""
    ok = trained_rows(df)
    if ok.empty or "run_id" not in ok or ok["run_id"].nunique() < 2:
        return None
    per_rank = "train/samples_per_s_per_worker"
    varied = [c for c in varied_columns(ok) if not c.startswith("measure.")]
    fig = go.Figure()
    for run_id, part in ok.groupby("run_id"):
        system = part["system"].iloc[0] if "system" in part else ""
        labels = [config_label(r, varied) for r in part.to_dict("records")]
        fig.add_trace(go.Bar(x=labels, y=part[per_rank], name=f"{run_id} ({system})"))
    fig.update_layout(title="Runs compared: samples/s per rank", barmode="group",
                      yaxis_title="samples/s per rank (per GPU)")
    return fig


def history(hist: pd.DataFrame, flagged: pd.DataFrame, metric: str = THROUGHPUT,
            unit: str | None = None) -> go.Figure | None:
    """A metric over time per configuration (trial key) among `hist`'s rows that have it,
    regressions marked."""
    ok = hist[hist[metric].notna()] if metric in hist else hist.iloc[0:0]
    if ok.empty:
        return None
    fig = go.Figure()
    for key, part in ok.sort_values("recorded_at").groupby("trial_key"):
        fig.add_trace(go.Scatter(x=part["recorded_at"], y=part[metric], mode="lines+markers",
                                 name=f"{part['sweep'].iloc[0]} {key}"))
    flagged = flagged[flagged["metric"] == metric] if "metric" in flagged else flagged.iloc[0:0]
    if not flagged.empty:
        fig.add_trace(go.Scatter(x=flagged["recorded_at"], y=flagged[metric], mode="markers",
                                 name="regression", marker={"symbol": "x", "size": 14,
                                                            "color": "crimson"}))
    fig.update_layout(title=f"History: {metric}", xaxis_title="recorded at",
                      yaxis_title=f"{metric} ({unit})" if unit else metric)
    return fig

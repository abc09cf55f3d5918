"""Figures of a workload's size axis (the tile of a tiled model, an LLM's sequence length, as
its workload declares it: `Workload.size_axis`): its rate (the headline it declares, else
samples/s) and memory against it, a line per batch and per other axis; the rate per GPU and
MFU per configuration; and where a step's time goes (its timed phases stacked per
configuration).

Pure: results frames in, plotly figures out, None where the data has no size axis or no
phases. The phases are whatever a workload timed with `self.clock.phase` (`train/<phase>_mean_ms`).
"""

from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go

from raybench import columns
from raybench.report.assess import (
    THROUGHPUT,
    config_label,
    peak_memory_mb,
    rate_column,
    size_axis,
    trained_rows,
    varied_columns,
)

BATCH = "workload.batch_size"
# Means of the step and of parts that are not phases a workload timed
_NOT_PHASES = {"step_time", "compute_time", "data_wait", "own_compute"}


def _per_batch(ok: pd.DataFrame, axis: str) -> list[tuple[str, pd.DataFrame]]:
    """One series per batch size (and per other axis the grid varied, the size axis excepted)."""
    keys = [c for c in varied_columns(ok) if c != axis]
    if BATCH in ok and BATCH not in keys:
        keys.insert(0, BATCH)
    if not keys:
        return [("all trials", ok)]
    out = []
    for name, part in ok.groupby(keys, dropna=False):
        values = name if isinstance(name, tuple) else (name,)
        label = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in zip(keys, values, strict=True))
        out.append((label, part.sort_values(axis)))
    return out


def rate_of(ok: pd.DataFrame) -> tuple[str, str]:
    """The rate these rows are drawn by (assess.rate_column, as the report ranks them) and its
    axis title."""
    rate = rate_column(ok.to_dict("records"))
    if rate == THROUGHPUT:
        return THROUGHPUT, "samples/s (all ranks)"
    metric = columns.lookup(rate)
    return rate, f"{rate} ({metric.unit})" if metric else rate


def throughput_vs_size(df: pd.DataFrame) -> go.Figure | None:
    ok = trained_rows(df)
    axis = None if ok.empty else size_axis(ok)
    if axis is None:
        return None
    size = axis.split(".", 1)[-1].split("/")[-1]
    rate, title = rate_of(ok)
    fig = go.Figure()
    for label, part in _per_batch(ok, axis):
        fig.add_trace(go.Scatter(x=part[axis], y=part[rate], mode="lines+markers",
                                 name=label))
    fig.update_layout(title=f"Throughput vs {size} (a line per batch and layout)",
                      xaxis_title=size, yaxis_title=title)
    return fig


def rate_and_mfu(df: pd.DataFrame) -> go.Figure | None:
    """Per configuration, its rate (bars) and its MFU, or on a machine with no datasheet peak
    (a CPU) its TFLOP/s per GPU (markers, right axis): where a layout or a length stands."""
    ok = trained_rows(df)
    if ok.empty or len(ok) < 2 or "perf/achieved_tflops_per_gpu" not in ok or \
            ok["perf/achieved_tflops_per_gpu"].isna().all():
        return None
    rate, title = rate_of(ok)
    varied = varied_columns(ok)
    labels = [config_label(r, varied) for r in ok.to_dict("records")]
    mfu = "perf/mfu_pct" if "perf/mfu_pct" in ok and ok["perf/mfu_pct"].notna().any() \
        else "perf/achieved_tflops_per_gpu"
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=ok[rate], name=title))
    fig.add_trace(go.Scatter(x=labels, y=ok[mfu], name=mfu, mode="markers", yaxis="y2",
                             marker={"size": 12, "symbol": "diamond"}))
    fig.update_layout(title="Rate and MFU per configuration", yaxis_title=title,
                      yaxis2={"title": "MFU %" if mfu == "perf/mfu_pct" else "TFLOP/s per GPU",
                              "overlaying": "y", "side": "right", "rangemode": "tozero"})
    return fig


def memory_vs_size(df: pd.DataFrame) -> go.Figure | None:
    """The memory that limits a size: device peak on GPU, process peak on CPU."""
    ok = trained_rows(df)
    axis = None if ok.empty else size_axis(ok)
    if axis is None:
        return None
    size = axis.split(".", 1)[-1]
    fig = go.Figure()
    for label, part in _per_batch(ok, axis):
        peaks = [peak_memory_mb(r) for r in part.to_dict("records")]
        if any(p is not None for p in peaks):
            fig.add_trace(go.Scatter(x=part[axis], y=peaks, mode="lines+markers", name=label))
    if not fig.data:
        return None
    fig.update_layout(title=f"Peak memory vs {size} (a line per batch)",
                      xaxis_title=size, yaxis_title="MB")
    return fig


def phases_of(df: pd.DataFrame) -> list[str]:
    """The timed phases present, in the order a step runs them where known."""
    found = {m.group(1) for c in df.columns
             if (m := re.fullmatch(r"train/(\w+)_mean_ms", c)) and df[c].notna().any()}
    found -= _NOT_PHASES
    order = ["forward", "backward", "optimizer", "prefill", "decode"]
    return [p for p in order if p in found] + sorted(found - set(order))


def step_breakdown(df: pd.DataFrame) -> go.Figure | None:
    """Mean step time per configuration split into its timed phases, stacked; `rest` is what
    the phases leave of the step (data wait, launch, synchronisation), never below zero."""
    ok = trained_rows(df)
    phases = phases_of(ok)
    if ok.empty or not phases:
        return None
    ok = ok[ok[[f"train/{p}_mean_ms" for p in phases]].notna().any(axis=1)]
    varied = varied_columns(ok)
    labels = [config_label(r, varied) for r in ok.to_dict("records")]
    fig = go.Figure()
    timed = 0.0
    for p in phases:
        ms = ok[f"train/{p}_mean_ms"].fillna(0.0)
        timed = timed + ms
        fig.add_trace(go.Bar(x=labels, y=ms, name=p))
    if "train/step_time_mean_ms" in ok:
        rest = (ok["train/step_time_mean_ms"] - timed).clip(lower=0.0)
        fig.add_trace(go.Bar(x=labels, y=rest, name="rest of the step",
                             marker={"color": "lightgrey"}))
    fig.update_layout(title="Where a step's time goes (mean per step, stacked)",
                      barmode="stack", yaxis_title="ms")
    return fig

"""Figures of a workload's size axis (the tile of a tiled model, as its workload declares it:
`Workload.size_axis`): throughput and memory against it, a line per batch; and where a step's
time goes (its timed phases stacked per configuration).

Pure: results frames in, plotly figures out, None where the data has no size axis or no
phases. The phases are whatever a workload timed with `self.clock.phase` (`train/<phase>_mean_ms`).
"""

from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go

from raybench.report.assess import (
    THROUGHPUT,
    config_label,
    peak_memory_mb,
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


def throughput_vs_size(df: pd.DataFrame) -> go.Figure | None:
    ok = trained_rows(df)
    axis = None if ok.empty else size_axis(ok)
    if axis is None:
        return None
    size = axis.split(".", 1)[-1]
    fig = go.Figure()
    for label, part in _per_batch(ok, axis):
        fig.add_trace(go.Scatter(x=part[axis], y=part[THROUGHPUT], mode="lines+markers",
                                 name=label))
    fig.update_layout(title=f"Throughput vs {size} (a line per batch)",
                      xaxis_title=size, yaxis_title="samples/s (all ranks)")
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

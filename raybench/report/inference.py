"""Figures of inference rows: results frames and trial details in, plotly figures out. Pure.

Owns the Offline figures (samples/s and scaling efficiency against replicas, samples/s per node,
the projected time of the sweep's dataset) and the Server figures (the rate search: latency
percentile of every probed rate against the bound; the latency distribution at the rate
found), MLPerf's LoadGen's runs beside raybench's own, and the accuracy gate (agreement
with the fp32 reference, or the task's own score such as the detector's xView3 aggregate,
against the target).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from raybench.report.assess import (
    OFFLINE,
    REPLICAS,
    SCALING,
    config_label,
    varied_columns,
    with_scaling,
)


def _rows(df: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """Rows of one scenario served by calls (LLM serving rows: report/serving.py)."""
    if "inference.scenario" not in df:
        return df.iloc[0:0]
    part = df[(df["inference.scenario"] == scenario) & (df["status"] == "ok")]
    if "serve/requests" in part:
        part = part[part["serve/requests"].isna()]
    return part[part["stage"] == "benchmark"] if "stage" in part else part


def _label(row: dict[str, Any], varied: list[str], drop: tuple[str, ...] = ()) -> str:
    return config_label(row, [c for c in varied if c not in drop and c != "inference.scenario"])


def offline_scaling(df: pd.DataFrame) -> go.Figure | None:
    off = _rows(with_scaling(df), "offline")
    if off.empty:
        return None
    varied = varied_columns(off)
    fig = go.Figure()
    others = [c for c in varied if c != REPLICAS]
    groups = off.groupby(others, dropna=False) if others else [("all", off)]
    for _, part in groups:
        part = part.sort_values(REPLICAS)
        label = _label(part.iloc[0].to_dict(), others) or "all trials"
        eff = [f"{e:.0f}% of ideal" if e == e else "" for e in part.get(SCALING, [])]
        fig.add_trace(go.Bar(x=part[REPLICAS].astype(str), y=part[OFFLINE], name=label,
                             text=eff, textposition="outside"))
    fig.update_layout(title="Offline: samples/s by replicas (label: scaling efficiency)",
                      xaxis_title="replicas", yaxis_title="samples/s (all replicas)",
                      barmode="group")
    return fig


def offline_per_node(df: pd.DataFrame) -> go.Figure | None:
    off = _rows(df, "offline")
    if off.empty or "infer/node_samples_per_s" not in off:
        return None
    varied = varied_columns(off)
    labels, per_node = [], []
    for r in off.to_dict("records"):
        labels.append(_label(r, varied) or r["trial_key"])
        per_node.append(json.loads(r["infer/node_samples_per_s"] or "{}"))
    nodes = sorted({n for d in per_node for n in d})
    fig = go.Figure()
    for node in nodes:
        fig.add_trace(go.Bar(x=labels, y=[d.get(node) for d in per_node], name=node))
    fig.update_layout(title="Offline: samples/s per node", barmode="stack",
                      yaxis_title="samples/s")
    return fig


def offline_projection(df: pd.DataFrame) -> go.Figure | None:
    off = _rows(df, "offline")
    if off.empty or "infer/projected_s" not in off or off["infer/projected_s"].isna().all():
        return None
    off = off[off["infer/projected_s"].notna()]
    varied = varied_columns(off)
    n = int(off["infer/project_samples"].iloc[0])
    fig = go.Figure(go.Bar(x=[_label(r, varied) or r["trial_key"] for r in off.to_dict("records")],
                           y=off["infer/projected_s"] / 60, name="projected"))
    fig.update_layout(title=f"Offline: projected time for {n:,} samples (start-up + samples at "
                      "the measured rate)", yaxis_title="minutes")
    return fig


def server_search(df: pd.DataFrame) -> go.Figure | None:
    srv = _rows(df, "server")
    if srv.empty or "server/search" not in srv:
        return None
    varied = varied_columns(srv)
    fig = go.Figure()
    bound = None
    for r in srv.to_dict("records"):
        probes = json.loads(r["server/search"] or "[]")
        pct = f"p{r['server/latency_percentile']:g}_ms"
        bound = r.get("server/latency_bound_ms") or bound
        probes.sort(key=lambda p: p["rate_qps"])
        # A rate whose run was stopped once too many queries were late has no percentile:
        # drawn just above the bound, as a miss.
        ys = [p[pct] if p[pct] is not None else (bound or 0) * 1.15 for p in probes]
        fig.add_trace(go.Scatter(
            x=[p["rate_qps"] for p in probes], y=ys, mode="lines+markers",
            name=_label(r, varied) or r["trial_key"],
            marker={"symbol": ["circle" if p["passed"] else "x" for p in probes], "size": 10},
            text=["met" if p["passed"] else "missed" + ("" if p[pct] is not None else
                  ": stopped early, percentile beyond the bound") for p in probes],
            hovertemplate="%{x:.1f} q/s: %{text}<extra></extra>"))
    if bound:
        fig.add_hline(y=bound, line_dash="dash", line_color="crimson",
                      annotation_text=f"bound {bound:g} ms")
    fig.update_layout(title="Server: latency percentile of every probed Poisson rate (x: the "
                      "bound was missed)", xaxis_title="queries/s", yaxis_title="latency ms")
    return fig


def server_latency(details: dict[str, dict[str, Any]], df: pd.DataFrame) -> go.Figure | None:
    srv = _rows(df, "server")
    if srv.empty:
        return None
    varied = varied_columns(srv)
    fig = go.Figure()
    for r in srv.to_dict("records"):
        records = (details.get(r["trial_key"]) or {}).get("records") or []
        lat = [x for x in (records[0].get("latency_ms") or []) if x is not None] if records else []
        if not lat:
            continue
        rate = r.get("server/rate_qps")
        name = (_label(r, varied) or r["trial_key"]) + (f" at {rate:.1f} q/s" if rate else "")
        fig.add_trace(go.Box(y=lat, name=name, boxpoints=False))
    if not fig.data:
        return None
    fig.update_layout(title="Server: query latency at the rate found", yaxis_title="ms")
    return fig


def accuracy_gate(df: pd.DataFrame) -> go.Figure | None:
    if "infer/accuracy" not in df or df["infer/accuracy"].isna().all():
        return None
    rows = df[df["infer/accuracy"].notna()]
    varied = varied_columns(rows)
    labels = [_label(r, varied, ()) or r["trial_key"] for r in rows.to_dict("records")]
    colour = ["seagreen" if ok else "crimson" for ok in rows["infer/accuracy_ok"]]
    metrics = rows.get("infer/accuracy_metric", pd.Series(dtype=object)).dropna()
    metric = str(metrics.iloc[0]) if not metrics.empty else "agreement"  # one workload a sweep
    what = ("agreement with an fp32 reference pass" if metric == "agreement" else
            f"{metric} of a pass over the validation set")
    fig = go.Figure(go.Bar(x=labels, y=rows["infer/accuracy"], marker_color=colour,
                           name=metric))
    target = rows["infer/accuracy_target"].dropna()
    if not target.empty:
        fig.add_hline(y=float(target.iloc[0]), line_dash="dash",
                      annotation_text=f"target {float(target.iloc[0]):g}")
    fig.update_layout(title=f"Accuracy gate: {what} (red: below target, run invalid)",
                      yaxis_title=metric)
    return fig


# the row's own figure of the rate LoadGen was run at, beside LoadGen's measured one
OWN_RATE = {"server": ("server/rate_qps", "loadgen/scheduled_samples_per_s"),
            "offline": ("infer/samples_per_s", "loadgen/samples_per_s")}


def loadgen_runs(df: pd.DataFrame) -> go.Figure | None:
    """Rows that MLPerf's LoadGen drove (inference.loadgen): raybench's own rate beside
    LoadGen's, each bar named with LoadGen's verdict and the constraints behind it."""
    if "loadgen/validity" not in df:
        return None
    rows = df[df["loadgen/validity"].notna() & (df["status"] == "ok")]
    if rows.empty:
        return None
    varied = varied_columns(rows)
    labels, own, theirs, notes = [], [], [], []
    for r in rows.to_dict("records"):
        scenario = r.get("inference.scenario") or "server"
        own_col, lg_col = OWN_RATE.get(scenario, OWN_RATE["server"])
        if scenario == "offline" and r.get("serve/requests_per_s") is not None:
            own_col = "serve/requests_per_s"  # an LLM's Offline: requests, LoadGen's samples
        labels.append(f"{_label(r, varied) or r['trial_key']} ({scenario})")
        own.append(r.get(own_col))
        theirs.append(r.get(lg_col) if r.get(lg_col) is not None
                      else r.get("loadgen/samples_per_s"))
        notes.append(f"LoadGen: {r['loadgen/validity']}; early stopping "
                     f"{_yes(r.get('loadgen/early_stopping_met'))}, latency constraint "
                     f"{_yes(r.get('loadgen/perf_constraints_met'))}, min duration "
                     f"{_yes(r.get('loadgen/min_duration_met'))}")
    fig = go.Figure([
        go.Bar(x=labels, y=own, name="raybench's own run", hovertext=notes),
        go.Bar(x=labels, y=theirs, name="LoadGen's run", text=[n.split(";")[0] for n in notes],
               textposition="outside", hovertext=notes,
               marker_color=["seagreen" if r["loadgen/validity"] == "VALID" else "darkorange"
                             for r in rows.to_dict("records")])])
    fig.update_layout(title="MLPerf's LoadGen: its run at raybench's rate (Server) or of the "
                      "same replicas (Offline), with its verdict (orange: INVALID; hover for "
                      "why)", barmode="group", yaxis_title="queries/s (Server), samples/s "
                      "(Offline)")
    return fig


def _yes(flag: Any) -> str:
    return "met" if flag is True else "not met" if flag is False else "n/a"


def figures(df: pd.DataFrame, details: dict[str, dict[str, Any]]
            ) -> list[tuple[str, go.Figure | None]]:
    return [("offline_scaling", offline_scaling(df)), ("offline_nodes", offline_per_node(df)),
            ("offline_projection", offline_projection(df)), ("server", server_search(df)),
            ("server_latency", server_latency(details, df)),
            ("accuracy_gate", accuracy_gate(df)), ("loadgen", loadgen_runs(df))]

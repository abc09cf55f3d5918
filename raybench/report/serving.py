"""Figures of LLM serving rows (scenarios/llm/): results frames and trial details in, plotly
figures out. Pure.

Owns the throughput-per-GPU against speed-per-user curve of the concurrency sweeps with its
Pareto front (the figure InferenceMAX and NVIDIA's serving notes draw), the distributions of
time to first token and per output token, the share of requests within the limits set
(goodput), and the Server search judged on TTFT and TPOT.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from raybench.report.assess import config_label, varied_columns
from raybench.scenarios.llm.figures import pareto

PER_GPU, PER_USER = "serve/output_tokens_per_s_per_gpu", "serve/tokens_per_s_per_user"


def serving_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "serve/requests" not in df:
        return df.iloc[0:0]
    part = df[df["serve/requests"].notna() & (df["status"] == "ok")]
    return part[part["stage"] == "benchmark"] if "stage" in part else part


def _label(row: dict[str, Any], varied: list[str]) -> str:
    return config_label(row, varied) or row["trial_key"]


def throughput_vs_speed(df: pd.DataFrame) -> go.Figure | None:
    rows = serving_rows(df)
    if rows.empty or PER_GPU not in rows or PER_USER not in rows:  # imported rows may lack one
        return None
    rows = rows[rows[PER_GPU].notna() & rows[PER_USER].notna()]
    if "serve/concurrency" not in rows or rows["serve/concurrency"].isna().all():
        return None
    rows = rows[rows["serve/concurrency"].notna()]
    points = list(zip(rows[PER_USER], rows[PER_GPU], strict=True))
    front = pd.Series(pareto(points), index=rows.index)
    lines = [c for c in varied_columns(rows) if c not in ("inference.concurrency",
                                                           "serve/concurrency")]
    groups = rows.groupby(lines, dropna=False) if lines else [("all", rows)]
    fig = go.Figure()
    for _, part in groups:
        part = part.sort_values("serve/concurrency")
        fig.add_trace(go.Scatter(
            x=part[PER_USER], y=part[PER_GPU], mode="lines+markers+text",
            text=[f"{int(c)}" for c in part["serve/concurrency"]], textposition="top center",
            name=config_label(part.iloc[0].to_dict(), lines) or "all trials",
            marker={"symbol": ["star" if front[i] else "circle" for i in part.index],
                    "size": [14 if front[i] else 8 for i in part.index]},
            hovertemplate="concurrency %{text}: %{y:.0f} tokens/s/GPU at %{x:.1f} "
                          "tokens/s/user<extra></extra>"))
    fig.update_layout(title="Output tokens/s per GPU against tokens/s per user, by concurrency "
                      "(label: users; star: on the Pareto front)",
                      xaxis_title="tokens/s per user (1 / TPOT)",
                      yaxis_title="output tokens/s per GPU")
    return fig


def token_latency(details: dict[str, dict[str, Any]], df: pd.DataFrame) -> go.Figure | None:
    rows = serving_rows(df)
    if rows.empty:
        return None
    varied = varied_columns(rows)
    fig = go.Figure()
    for r in rows.to_dict("records"):
        records = (details.get(r["trial_key"]) or {}).get("records") or []
        requests = records[0].get("requests") or [] if records else []
        for what, colour in (("ttft", "steelblue"), ("tpot", "darkorange")):
            values = [q[what] for q in requests if q.get(what) is not None]
            if values:
                fig.add_trace(go.Box(y=values, name=f"{what.upper()} {_label(r, varied)}",
                                     marker_color=colour, boxpoints=False))
    if not fig.data:
        return None
    fig.update_layout(title="Time to first token and per output token, every request (ms)",
                      yaxis_title="ms", yaxis_type="log", showlegend=False)
    return fig


def limits(df: pd.DataFrame) -> go.Figure | None:
    rows = serving_rows(df)
    bounds = [c for c in ("inference.ttft_bound_ms", "inference.tpot_bound_ms") if c in rows]
    if rows.empty or not bounds or rows[bounds].isna().all().all():
        return None
    varied = varied_columns(rows)
    fig = go.Figure(go.Bar(
        x=[_label(r, varied) for r in rows.to_dict("records")], y=rows["serve/limits_met_pct"],
        text=[f"goodput {g:.2f} req/s" if g == g else "" for g in rows["serve/goodput_rps"]],
        textposition="outside"))
    first = rows.iloc[0]
    said = ", ".join(f"{c.split('.')[1].split('_')[0].upper()} <= {first[c]:g} ms"
                     for c in bounds if first[c] == first[c] and first[c] is not None)
    fig.update_layout(title=f"Requests within every limit ({said}); label: goodput",
                      yaxis_title="% of requests", yaxis_range=[0, 105])
    return fig


def token_search(df: pd.DataFrame) -> go.Figure | None:
    rows = serving_rows(df)
    if rows.empty or "server/search" not in rows:
        return None
    rows = rows[rows["server/search"].notna()]
    if rows.empty:
        return None
    varied = varied_columns(rows)
    fig = go.Figure()
    for r in rows.to_dict("records"):
        probes = sorted(json.loads(r["server/search"]), key=lambda p: p["rate_qps"])
        pct = f"p{r['server/latency_percentile']:g}_ms"
        for what, dash in (("ttft", "solid"), ("tpot", "dot")):
            key = f"{what}_{pct}"
            if not any(key in p for p in probes):
                continue
            fig.add_trace(go.Scatter(
                x=[p["rate_qps"] for p in probes], y=[p.get(key) for p in probes],
                mode="lines+markers", line={"dash": dash},
                name=f"{what.upper()} {pct[:-3]} {_label(r, varied)}",
                marker={"symbol": ["circle" if p["passed"] else "x" for p in probes],
                        "size": 10}))
    if not fig.data:
        return None
    fig.update_layout(title="Server: TTFT and TPOT percentile of every probed Poisson rate "
                      "(x: a limit was missed or the probe stopped early)",
                      xaxis_title="requests/s", yaxis_title="ms", yaxis_type="log")
    return fig


def figures(df: pd.DataFrame, details: dict[str, dict[str, Any]]
            ) -> list[tuple[str, go.Figure | None]]:
    return [("serving_pareto", throughput_vs_speed(df)),
            ("serving_latency", token_latency(details, df)),
            ("serving_limits", limits(df)), ("serving_search", token_search(df))]

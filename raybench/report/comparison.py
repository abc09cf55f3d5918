"""`compare`'s page: the comparison in the report's style (pure: its verdict rows in, HTML
out): the table, and each configuration's ratio with its 95% interval against the threshold
band. compare.py writes it for `--html`."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from raybench.records import present
from raybench.report import page as report_page

PAGE_COLUMNS = ["config", "trial_key", "base", "new", "ratio", "ci95_low", "ci95_high", "p",
                "threshold_pct", "threshold", "verdict", "windows_needed", "software_change"]


def page(results: list[dict[str, Any]], title: str, header: list[str]) -> str:
    """The comparison as a self-contained page in the report's style: the table, and each
    configuration's ratio with its 95% interval against the threshold band."""
    rows = [{**r, "ci95_low": (r.get("ratio_ci95") or [None, None])[0],
             "ci95_high": (r.get("ratio_ci95") or [None, None])[1]} for r in results]
    figs = []
    drawn = [r for r in rows if present(r.get("ratio"))]
    if drawn:
        names = [str(r["config"] or r["trial_key"]) for r in drawn]
        ratio = [r["ratio"] for r in drawn]
        up = [(r["ci95_high"] - r["ratio"]) if present(r["ci95_high"]) else 0 for r in drawn]
        down = [(r["ratio"] - r["ci95_low"]) if present(r["ci95_low"]) else 0 for r in drawn]
        colour = {"slower": "#c62828", "faster": "#2e7d32", "unchanged": "#1565c0",
                  "inconclusive": "#9e9e9e"}
        fig = go.Figure(go.Scatter(
            x=ratio, y=names, mode="markers", text=[r["verdict"] for r in drawn],
            marker={"size": 11, "color": [colour[r["verdict"]] for r in drawn]},
            error_x={"type": "data", "symmetric": False, "array": up, "arrayminus": down}))
        t = max(float(r["threshold_pct"]) for r in drawn) / 100
        fig.add_vrect(x0=1 - t, x1=1 + t, fillcolor="#1565c0", opacity=0.08, line_width=0)
        fig.add_vline(x=1.0, line_dash="dot")
        fig.update_layout(title="NEW / BASE throughput, 95% interval; band: the threshold",
                          xaxis_title="ratio", height=max(300, 60 + 40 * len(drawn)))
        figs.append(("ratios", fig))
    model = {"title": title, "header": header, "table_title": "Configurations",
             "columns": PAGE_COLUMNS, "rows": rows}
    return report_page.render(model, figs)

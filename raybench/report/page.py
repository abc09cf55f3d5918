"""One self-contained HTML page from a report model: plotly.js embedded once, no CDN.

Owns layout and escaping. Every piece of user text (sweep names, labels, errors) goes through
`html.escape`; figure JSON is embedded with `</` broken up, so a name containing `</script>`
stays text. The table sorts on a header click with a few lines of inline script.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from raybench.columns import text
from raybench.report.assess import rate_text

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin-bottom:4px} .meta{color:#555;font-size:14px}
table{border-collapse:collapse;font-size:12px;margin:12px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;cursor:pointer;position:sticky;top:0}
.badge{padding:1px 6px;border-radius:8px;color:#fff;font-size:11px}
.unit{display:block;font-weight:normal;color:#666;font-size:11px}
.valid{background:#2e7d32}.invalid{background:#c62828}
.canonical{background:#1565c0}.quick{background:#9e9e9e}
.note{color:#8a6d00;font-size:11px}
.rec{border:1px solid #ccc;border-radius:6px;padding:8px 12px;margin:8px 0;background:#fafafa}
.chart{width:100%;height:460px;margin:16px 0}
.tablewrap{max-height:520px;overflow:auto}
"""
SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th, col){
  th.addEventListener('click', function(){
    var tb = th.closest('table').tBodies[0], rows = Array.from(tb.rows);
    var asc = th.dataset.asc !== '1'; th.dataset.asc = asc ? '1' : '0';
    rows.sort(function(a, b){
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
      return asc ? c : -c;
    });
    rows.forEach(function(r){ tb.appendChild(r); });
  });
});
"""


def render(model: dict[str, Any], figures: list[tuple[str, go.Figure]]) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>raybench: {e(model['title'])}</title><style>{STYLE}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
        f"<h1>{e(model['title'])}</h1>",
        "".join(f"<div class='meta'>{e(line)}</div>" for line in model["header"]),
        *(["<h2>Recommendations</h2>", _recommendations(model["recommendations"])]
          if model.get("recommendations") else []),
        f"<h2>{e(model.get('table_title', 'Trials'))}</h2>",
        _table(model["columns"], model["rows"], model.get("units") or {}),
    ]
    if model.get("references"):  # published figures of the same GPU and workload
        parts += ["<h2>Published reference figures (samples/s per GPU; ratio = measured / "
                  "published)</h2>", _table(list(model["references"][0]),
                                            model["references"], {})]
    for i, (name, fig) in enumerate(figures):
        parts.append(_figure(f"fig-{i}-{name}", fig))
    parts.append(f"<script>{SORT_JS}</script></body></html>")
    return "".join(parts)


def _figure(div_id: str, fig: go.Figure) -> str:
    spec = pio.to_json(fig, validate=False).replace("</", "<\\/")
    return (f"<div id='{div_id}' class='chart'></div><script>(function(){{var f={spec};"
            f"Plotly.newPlot('{div_id}', f.data, f.layout, {{responsive: true}});}})();</script>")


def _recommendations(rec: dict[str, Any]) -> str:
    e = html.escape
    out = []
    budget = rec.get("memory_budget_mb")
    titles = {"fastest": "Maximum throughput",
              "fastest_within_budget": f"Maximum throughput within {budget:.0f} MB"
              if budget else "Maximum throughput within a memory budget",
              "best_accuracy_per_s": "Best accuracy per second"}
    for key, title in titles.items():
        pick = rec.get(key)
        if pick is None:
            text = "no valid trial qualifies"
            if key == "fastest_within_budget" and not budget:
                text = "no budget: set the system's gpu_memory_gb or --memory-budget-mb"
            elif key == "best_accuracy_per_s" and rec.get("fastest") is not None:
                text = "this workload reports no accuracy"
        else:
            mem = pick.get("peak_memory_mb")
            text = (f"{pick['label']}: {rate_text(pick)}"
                    + (f", peak {mem:.0f} MB" if mem else "") + f" (trial {pick['trial_key']})")
        out.append(f"<div class='rec'><b>{e(title)}</b>: {e(text)}</div>")
    return "".join(out)


def _table(columns: list[str], rows: list[dict[str, Any]],
           units: dict[str, dict[str, str]]) -> str:
    """Rows as a sortable table; a metric column's header shows its declared unit, its
    meaning on hover (tables written before units were declared show neither)."""
    e = html.escape
    head = "".join(
        f"<th title='{e(units[c]['unit'] + ': ' + units[c]['doc'])}'>{e(c)}"
        f"<span class='unit'>{e(units[c]['unit'])}</span></th>" if c in units
        else f"<th>{e(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            if c == "report" and v:  # the index links each run's page
                cells.append(f"<td data-v='{e(str(v))}'><a href='{e(str(v))}'>open</a></td>")
            elif c == "valid":
                cls, label = ("valid", "valid") if v else ("invalid", "invalid")
                why = e(text(r.get("validity_reasons")))
                note = e(text(r.get("validity_notes")))
                note_html = f" <span class='note'>{note}</span>" if note else ""
                cells.append(f"<td data-v='{int(bool(v))}' title='{why or note}'>"
                             f"<span class='badge {cls}'>{label}</span> {why}{note_html}</td>")
            elif c == "trial/category" and v in ("canonical", "quick"):
                cells.append(f"<td data-v='{e(v)}'><span class='badge {e(v)}'>{e(v)}</span></td>")
            else:
                if isinstance(v, float):
                    shown = "" if v != v else f"{v:.4g}"
                else:
                    shown = "" if v is None else str(v)
                cells.append(f"<td data-v='{e(json.dumps(v, default=str))}'>{e(shown)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<div class='tablewrap'><table class='sortable'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")

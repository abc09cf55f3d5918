"""Reports: results tables -> one self-contained HTML page, plus Markdown and JSON beside it.

`build(run_dirs)` reads each run directory (results.parquet, system_info.json, trials/*.json),
`model(...)` turns frames into what the page shows (pure), `figures.all_figures` draws it and
`page.render` writes the HTML string. `write(run_dirs, out)` is the only function that writes.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import pyarrow.parquet as pq
import yaml

from raybench import columns, store
from raybench.report import figures, judge, page, reference
from raybench.report.assess import (
    HEADLINE,
    THROUGHPUT,
    declared,
    rate_text,
    recommend,
    varied_columns,
    with_scaling,
    with_validity,
)
from raybench.results import history as hist_store
from raybench.spec import parse_yaml

TABLE_COLUMNS = ["valid", "trial/category", "run_id", "stage", "trial_key", "status", "device",
                 THROUGHPUT,
                 "train/step_time_p50_ms", "train/step_time_p99_ms", "train/step_time_cv_pct",
                 "train/data_wait_pct", "mem/peak_allocated_mb", "host/rss_peak_mb",
                 "preprocess/chips_per_s", "search/largest_batch",
                 "infer/samples_per_s", "infer/scaling_efficiency_pct",
                 "infer/replica_samples_per_s_mean", "infer/projected_s", "infer/tokens_per_s",
                 "server/rate_qps", "server/queries_per_call", "server/p50_ms", "server/p99_ms",
                 "server/ttft_p99_ms", "server/tpot_p99_ms", "infer/accuracy_metric",
                 "infer/accuracy", "infer/accuracy_target"]


def load(run_dir: Path) -> dict[str, Any]:
    run_dir = Path(run_dir)
    frame = pd.read_parquet(run_dir / "results.parquet")
    units = columns.read_metadata(pq.read_schema(run_dir / "results.parquet").metadata)
    info_path = run_dir / "system_info.json"
    details = {}
    for path in sorted((run_dir / "trials").glob("*.json")):
        d = json.loads(path.read_text())
        details[d["row"]["trial_key"]] = d
    return {"dir": str(run_dir), "frame": frame, "details": details, "units": units,
            "system": json.loads(info_path.read_text()) if info_path.exists() else {}}


def model(runs: list[dict[str, Any]], memory_budget_mb: float | None = None,
          allow_quick: bool = False) -> dict[str, Any]:
    """What the page shows, from loaded runs. Pure."""
    df = with_scaling(pd.concat([r["frame"] for r in runs], ignore_index=True))
    judged = with_validity(df)
    varied = varied_columns(df[df["stage"] == "benchmark"] if "stage" in df else df)
    # the core's columns, and after samples/s the headline rate the rows' workload declared
    headline = declared(judged.to_dict("records"), HEADLINE, "headline_metric")
    table = TABLE_COLUMNS[:8] + ([headline] if headline else []) + TABLE_COLUMNS[8:]
    shown = [c for c in table[:6] if c in judged] + varied + \
        [c for c in table[6:] if c in judged and judged[c].notna().any()]
    sweeps = sorted(set(df["sweep"].astype(str))) if "sweep" in df else ["?"]
    header = []
    for r in runs:
        s = r["system"]
        versions = s.get("versions", {})
        gpus = ", ".join(g.get("name", "?") for g in s.get("gpus", [])) or "no GPU"
        cluster = s.get("cluster", {})
        res = cluster.get("resources")
        where = (f"cluster {res.get('CPU', '?')} CPUs / {res.get('GPU', 0)} GPUs" if res
                 else cluster.get("mode", "cluster unknown"))  # bench run: "in-process, no Ray"
        header.append(
            f"run {Path(r['dir']).name}: system {_first(r['frame'], 'system')}, host "
            f"{s.get('host', '?')}, {gpus}, CPU {s.get('cpu', {}).get('model', '?')}; "
            f"{where}; started {_first(r['frame'], 'start_time')}; ray {versions.get('ray')}, "
            f"torch {versions.get('torch')}, CUDA {s.get('cuda', {}).get('torch_cuda')}")
        header += [node_line(ip, facts) for ip, facts in s.get("nodes", {}).items()]
    return {
        "title": " vs ".join(sweeps) if len(runs) > 1 else sweeps[0],
        "header": header, "columns": shown,
        "units": {k: v for r in runs for k, v in r.get("units", {}).items()},
        "rows": judged[shown + ["validity_reasons", "validity_notes"]].to_dict("records"),
        "recommendations": recommend(df, memory_budget_mb),
        "references": reference.compare(judged, allow_quick=allow_quick),
        "frame": df,
        "details": {k: v for r in runs for k, v in r["details"].items()},
    }


def node_line(ip: str, f: dict[str, Any]) -> str:
    """One node's own facts for the header: what ran there, as that node saw it."""
    if "error" in f:
        return f"node {ip}: facts unavailable ({f['error']})"
    gpus = f.get("gpus") or []
    names = sorted({g.get("name", "?") for g in gpus})
    gpu = (f"{len(gpus)}x {', '.join(names)}, driver {gpus[0].get('driver', '?')}" if gpus
           else "no GPU")
    cuda, cpu = f.get("cuda", {}), f.get("cpu", {})
    nccl = ", ".join(f"{k}={v}" for k, v in (f.get("nccl_env") or {}).items())
    return (f"node {ip} ({f.get('host', '?')}): {gpu}; CUDA {cuda.get('torch_cuda')}, NCCL "
            f"{cuda.get('nccl')}{' (' + nccl + ')' if nccl else ''}; CPU {cpu.get('model', '?')} "
            f"x{cpu.get('logical', '?')}, {f.get('memory_gb', '?')} GB; torch "
            f"{f.get('versions', {}).get('torch')}"
            + ("; topology in system_info.json" if f.get("gpu_topology") else ""))


def build(run_dirs: list[Path], memory_budget_mb: float | None = None,
          allow_quick: bool = False) -> tuple[str, dict]:
    m = model([load(d) for d in run_dirs], memory_budget_mb, allow_quick)
    return page.render(m, figures.all_figures(m["frame"], m["details"])), m


def write(run_dirs: list[Path], out: Path, memory_budget_mb: float | None = None,
          allow_quick: bool = False) -> Path:
    """report.html plus benchmark_report.md and benchmark_report.json beside it.
    `allow_quick`: quick rows get a ratio against published figures too."""
    text, m = build(run_dirs, memory_budget_mb, allow_quick)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(out, text)  # all or nothing: a kill leaves the old page or the new one
    summary = {"title": m["title"], "header": m["header"], "units": m["units"],
               "references": m["references"],
               "recommendations": m["recommendations"], "trials": m["rows"]}
    store.write_text(out.parent / "benchmark_report.json",
                     json.dumps(summary, indent=1, default=str))
    store.write_text(out.parent / "benchmark_report.md", markdown(m))
    return out


def markdown(m: dict[str, Any]) -> str:
    """benchmark_report.md. Every value is text, never markup: Markdown renderers pass HTML
    through, and a grid value or a label (`<b onmouseover=...>`, `<!--`) would be rendered."""
    def md(value: Any) -> str:
        return html.escape(str(value), quote=False).replace("|", "/")

    lines = [f"# {md(m['title'])}", "", *[f"- {md(h)}" for h in m["header"]], "",
             "## Recommendations", ""]
    for key, pick in m["recommendations"].items():
        if isinstance(pick, dict):
            lines.append(f"- {md(key)}: {md(pick['label'])}: {md(rate_text(pick))}")
    if m.get("references"):
        lines += ["", "## Published reference figures", "",
                  "| " + " | ".join(reference.COLUMNS) + " |",
                  "|" + " --- |" * len(reference.COLUMNS)]
        lines += ["| " + " | ".join(md(r[c]) for c in reference.COLUMNS) + " |"
                  for r in m["references"]]
    units = m.get("units") or {}
    heads = [f"{c} ({units[c]['unit']})" if c in units else c for c in m["columns"]]
    lines += ["", "## Trials", "", "| " + " | ".join(md(h) for h in heads) + " |",
              "|" + " --- |" * len(m["columns"])]
    for r in m["rows"]:
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in
                 (r.get(c) for c in m["columns"])]
        lines.append("| " + " | ".join(md(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_index(root: Path, out: Path | None = None) -> Path:
    """`index.html` listing every run under a results root, with links and headline figures."""
    root = Path(root)
    out = out or root / "index.html"
    rows = []
    for results in sorted(root.rglob("results.parquet")):
        run = results.parent
        try:
            df = store.read_rows(results)
        except store.UnreadableTable as e:  # listed as such; the other runs are still indexed
            rows.append(_unindexed(root, run, "unreadable", str(e).split(". Fix:")[0]))
            continue
        if "status" not in df:  # a table another tool wrote under the root
            rows.append(_unindexed(root, run, "foreign", "no status column: not raybench's"))
            continue
        ok = df[df["status"] == "ok"]
        best = ok[THROUGHPUT].max() if THROUGHPUT in ok and not ok.empty else None
        report_html = run / "report.html"
        rows.append({
            "sweep": _first(df, "sweep"), "run": run.relative_to(root).as_posix(),
            "system": _first(df, "system"), "started": _first(df, "start_time"),
            "rows": len(df), "ok": len(ok), "best samples/s": best,
            "report": _link(report_html, out.parent) if report_html.exists() else None,
        })
    m = {"title": f"raybench runs under {root}", "table_title": "Runs", "header": [
        f"{len(rows)} runs"], "columns": list(rows[0]) if rows else ["sweep"], "rows": rows}
    store.write_text(out, page.render(m, []))
    return out


def _unindexed(root: Path, run: Path, what: str, why: str) -> dict[str, Any]:
    return {"sweep": run.parent.name, "run": run.relative_to(root).as_posix(), "system": "?",
            "started": "?", "rows": what, "ok": why, "best samples/s": None, "report": None}


def write_history(root: Path, out: Path, threshold_pct: float = judge.THRESHOLD_PCT) -> Path:
    """A metric over time per configuration from a results root's history; every row judged
    against its configuration's earlier runs on the same system (judge.judge_history), the
    slower ones listed and marked."""
    # the page's columns only: reading every column of a thousand runs is what takes time
    hist = hist_store.read(root, columns_=hist_store.PAGE_COLUMNS)
    units = hist_store.units(root)
    judged = judge.judge_history(hist, threshold_pct)
    flagged = judged[judged["verdict"] == "slower"] if not judged.empty else judged
    cols = ["sweep", "trial_key", "system/accelerator", "run_id", "recorded_at", "code_version",
            "metric", "headline", "ratio", "p", "threshold_pct", "threshold", "software_change"]
    runs = hist["run_id"].nunique() if "run_id" in hist else 0
    m = {"title": "raybench history", "table_title": "Slower than the earlier runs",
         "header": [f"{root}: {len(hist)} rows, {runs} runs; each row's windows against its "
                    f"configuration's last {judge.EARLIER_RUNS} runs on the same system: "
                    f"exact Mann-Whitney p < {judge.ALPHA:g} and a drop beyond "
                    f"{threshold_pct:g}% or the spread those runs showed"],
         "columns": cols if not flagged.empty else ["sweep"],
         "rows": flagged.reindex(columns=cols).to_dict("records") if not flagged.empty else [],
         "units": units}
    # a figure per rate: training rows' samples/s, serving rows' output tokens/s
    figs = [(f"history {metric}", fig) for metric in (judge.THROUGHPUT, judge.SERVE_THROUGHPUT)
            if (fig := figures.history(judge.judged_rows(hist), flagged, metric,
                                       units.get(metric, {}).get("unit"))) is not None]
    store.write_text(out, page.render(m, figs))
    return out


def _link(target: Path, base: Path) -> str:
    """A relative URL from `base` to `target`, never one a browser reads as a scheme: a run
    directory named `javascript:alert(1)` is a path, percent-encoded, below `./`."""
    rel = Path(os.path.relpath(target, base)).as_posix()
    return quote(rel if rel.startswith("../") else f"./{rel}")


def budget_of(run_dir: Path) -> float | None:
    """The memory budget a run's sweep implies: its explicit budget, else the GPU's memory."""
    path = Path(run_dir) / "sweep.yaml"
    if not path.exists():
        return None
    try:  # the one loader for YAML (spec.parse_yaml); a run's copy edited into nonsense
        spec = parse_yaml(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        return None
    if not isinstance(spec, dict):
        return None
    explicit = (spec.get("hardware") or {}).get("memory_budget_mb")
    gpu_gb = (spec.get("system") or {}).get("gpu_memory_gb")
    return explicit or (gpu_gb * 1024 if gpu_gb else None)


def _first(df: pd.DataFrame, col: str) -> str:
    return str(df[col].iloc[0]) if col in df and len(df) else "?"

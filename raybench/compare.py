"""`python -m raybench.compare BASE NEW`: per configuration, is NEW faster, slower, unchanged,
or can its windows not tell?

Owns the decision between two rows of one configuration, made from their measured windows
(`train/window_samples_per_s`): an exact two-sided Mann-Whitney U test (scipy) AND a practical
threshold, the larger of a default (3%) and the run-to-run spread the configuration has shown
where that is known. The ratio NEW/BASE of the windows' means comes with a 95% percentile
bootstrap interval (seeded). Verdicts: `slower` / `faster` (significant and beyond the
threshold), `unchanged` (the interval lies within the threshold, or the difference is
significant but smaller than it), `inconclusive` (neither; with the windows per side that
could decide). Exit 1 when any configuration is `slower`, 0 otherwise, 2 for bad input.
`--history` judges the latest run of a results root against each configuration's earlier runs
on the same system (`judge_history`, which the report's history page uses too); `--html`
writes the comparison as a page in the report's style.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench import fingerprint, store
from raybench.records import present

THRESHOLD_PCT = 3.0  # below this a change is not worth a verdict, however certain
ALPHA = 0.05
WINDOWS = "train/window_samples_per_s"
THROUGHPUT = "train/samples_per_s"
VERDICTS = ("slower", "faster", "unchanged", "inconclusive")


def windows_to_decide(alpha: float = ALPHA) -> int:
    """The fewest windows per side with which an exact two-sided Mann-Whitney test can reach
    `alpha` at all (complete separation gives p = 2 / C(2n, n)): 4 for 0.05."""
    n = 1
    while 2 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def decide(base: list[float], new: list[float], threshold_pct: float = THRESHOLD_PCT,
           spread_pct: float | None = None) -> dict[str, Any]:
    """The verdict on NEW against BASE from their windows' throughputs."""
    from scipy.stats import bootstrap, mannwhitneyu

    threshold = max(threshold_pct, spread_pct or 0.0)
    rule = "run-to-run spread" if spread_pct and spread_pct > threshold_pct else "fixed"
    b, n = np.asarray(base, float), np.asarray(new, float)
    ratio = float(n.mean() / b.mean())
    p = float(mannwhitneyu(n, b, alternative="two-sided", method="exact").pvalue)
    low = high = None
    if len(b) >= 3 and len(n) >= 3 and (np.ptp(b) > 0 or np.ptp(n) > 0):
        ci = bootstrap((n, b), lambda x, y: np.mean(x) / np.mean(y), paired=False,
                       vectorized=False, confidence_level=0.95, n_resamples=2000,
                       method="percentile", random_state=np.random.default_rng(0))
        low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
    change = 100.0 * (ratio - 1.0)
    within = low is not None and 1 - threshold / 100 <= low and high <= 1 + threshold / 100
    if p < ALPHA and abs(change) > threshold:
        verdict = "faster" if ratio > 1 else "slower"
    elif within or p < ALPHA:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
    out = {"ratio": ratio, "ratio_ci95": [low, high], "change_pct": change, "p": p,
           "threshold_pct": threshold, "threshold": rule, "verdict": verdict,
           "windows": [len(b), len(n)]}
    if verdict == "inconclusive" and min(len(b), len(n)) < windows_to_decide():
        out["windows_needed"] = windows_to_decide()  # fewer cannot reach ALPHA at all
    return out


EARLIER_RUNS = 5  # a row's baseline in the history: the windows of its last this many runs


def judge_history(hist: pd.DataFrame, threshold_pct: float = THRESHOLD_PCT,
                  run_id: str | None = None) -> pd.DataFrame:
    """Each benchmark row (of `run_id` only, where given) judged against the earlier rows of
    its configuration on the same system (`trial_key` and `system/fingerprint`): its windows
    against the pooled windows of the last EARLIER_RUNS of them, the threshold widened to the
    spread those runs showed (twice their throughput's CV, once there are three). One row per
    judged row, with the verdict's fields; rows without an earlier run are left out."""
    from raybench.report.assess import trained_rows

    ok = trained_rows(hist)
    keys = [k for k in ("trial_key", "system/fingerprint") if k in ok]
    out = []
    for _, part in ok.sort_values("recorded_at", kind="stable").groupby(keys, dropna=False):
        rows = part.to_dict("records")
        for i in range(1, len(rows)):
            row = rows[i]
            if run_id is not None and row["run_id"] != run_id:
                continue
            earlier = rows[max(0, i - EARLIER_RUNS):i]
            base = [w for r in earlier for w in _windows(r)]
            new = _windows(row)
            spread = _spread([r[THROUGHPUT] for r in rows[:i]])
            result = decide(base, new, threshold_pct, spread) if base and new else {
                "verdict": "inconclusive", "reason": "no windows in these rows"}
            out.append({**row, **result, "base": float(np.mean([r[THROUGHPUT] for r in earlier])),
                        "software_change": fingerprint.software_changes(rows[i - 1], row)})
    return pd.DataFrame(out)


def run_spread(history: pd.DataFrame | None, row: dict[str, Any],
               exclude: set[Any] = frozenset()) -> float | None:
    """Twice the throughput CV% over the history's runs of this row's configuration on its
    system (other than `exclude`'s runs), once there are three; else None."""
    if history is None or history.empty or THROUGHPUT not in history:
        return None
    same = history[(history["trial_key"] == row.get("trial_key"))
                   & (history["status"] == "ok") & ~history["run_id"].isin(exclude)]
    fp = row.get("system/fingerprint")
    if "system/fingerprint" in same and present(fp):
        same = same[same["system/fingerprint"] == fp]
    return _spread(same[THROUGHPUT].dropna().tolist())


def _spread(values: list[float]) -> float | None:
    """Twice the CV% of a configuration's throughput over its runs, from three runs on."""
    if len(values) < 3:
        return None
    return 200.0 * float(np.std(values, ddof=1)) / float(np.mean(values))


def load_run(path: str) -> pd.DataFrame:
    """A run directory's benchmark rows that ran, one per configuration."""
    run = Path(path)
    table = run / "results.parquet"
    if not table.is_file():
        raise BadInput(f"{run} is not a run directory (no results.parquet). Fix: pass a "
                       "directory written by python -m raybench.sweep, e.g. "
                       "results/<sweep>/<run_id>")
    df = pd.read_parquet(table)
    if "stage" in df:
        df = df[df["stage"] == "benchmark"]
    return df[df["status"] == "ok"].drop_duplicates("trial_key", keep="last")


class BadInput(Exception):
    """What the user passed cannot be compared: the message says which and the fix."""


def compare_runs(base: pd.DataFrame, new: pd.DataFrame, threshold_pct: float = THRESHOLD_PCT,
                 across_systems: bool = False, names: tuple[str, str] = ("BASE", "NEW"),
                 allow_quick: bool = False, history: pd.DataFrame | None = None
                 ) -> list[dict[str, Any]]:
    """NEW's rows against BASE's, configuration by configuration. `history`: rows of earlier
    runs, whose run-to-run spread per configuration and system widens the threshold."""
    common = [k for k in new["trial_key"] if k in set(base["trial_key"])]
    if not common:
        raise BadInput(f"{names[0]} and {names[1]} have no configuration in common (no "
                       "trial_key in both). Fix: compare two runs of the same sweep file and "
                       "--set overrides")
    b, n = base.set_index("trial_key"), new.set_index("trial_key")
    fp, cat = "system/fingerprint", "trial/category"
    if not across_systems:
        differ = _differing(b, n, common, fp)
        if differ:
            raise BadInput(f"{names[0]} and {names[1]} ran on different systems "
                           f"({b.at[differ[0], 'system/accelerator']} against "
                           f"{n.at[differ[0], 'system/accelerator']}; system/fingerprint "
                           "differs). Fix: add --across-systems to compare two systems on "
                           "purpose")
    if not allow_quick:
        mixed = _differing(b, n, common, cat)
        if mixed:
            raise BadInput(f"{names[0]} and {names[1]} mix a quick row with a canonical one "
                           f"({b.at[mixed[0], cat]} against {n.at[mixed[0], cat]}, "
                           f"configuration {mixed[0]}): a quick row's few or unsettled windows "
                           "are not a baseline for a canonical one, nor the other way. Fix: "
                           "rerun the quick one with measure.repeats of 5 or more, or add "
                           "--allow-quick")
    out = []
    for key in common:
        rb, rn = {**b.loc[key].to_dict(), "trial_key": key}, {**n.loc[key].to_dict(),
                                                              "trial_key": key}
        wb, wn = _windows(rb), _windows(rn)
        spread = run_spread(history, rn, exclude={rb.get("run_id"), rn.get("run_id")})
        result = decide(wb, wn, threshold_pct, spread) if wb and wn else {
            "verdict": "inconclusive",
            "reason": "a row has no train/window_samples_per_s: written before raybench kept "
                      "them, or not a training row"}
        out.append({"trial_key": key, "config": _config(rn, new), "category": rn.get(cat),
                    "base": rb.get(THROUGHPUT),
                    "new": rn.get(THROUGHPUT), **result,
                    "software_change": fingerprint.software_changes(rb, rn),
                    "systems": [rb.get("system/accelerator"), rn.get("system/accelerator")]})
    return out


def _differing(b: pd.DataFrame, n: pd.DataFrame, keys: list[str], column: str) -> list[str]:
    """The configurations whose `column` both runs give, with different values."""
    if column not in b or column not in n:
        return []
    return [k for k in keys if present(b.at[k, column]) and present(n.at[k, column])
            and b.at[k, column] != n.at[k, column]]


def _windows(row: dict[str, Any]) -> list[float]:
    w = row.get(WINDOWS)
    return [float(x) for x in w] if w is not None and len(w) else []


def _config(row: dict[str, Any], run: pd.DataFrame) -> str:
    """The grid's values for this row: the config columns that differ within its run."""
    axes = [c for c in run.columns if "." in c and "/" not in c
            and run[c].astype(str).nunique() > 1]
    return " ".join(f"{c.split('.', 1)[1]}={row[c]}" for c in axes) or row.get(
        "workload.name", "")


def table(results: list[dict[str, Any]]) -> str:
    head = ["config", "base", "new", "ratio", "95% CI", "p", "verdict", "software change"]
    lines = [" | ".join(head)]
    for r in results:
        ci = r.get("ratio_ci95") or [None, None]
        lines.append(" | ".join([
            r["config"] or r["trial_key"], _fmt(r["base"]), _fmt(r["new"]), _fmt(r.get("ratio"), 3),
            f"{_fmt(ci[0], 3)}-{_fmt(ci[1], 3)}" if ci[0] is not None else "-",
            _fmt(r.get("p"), 3), r["verdict"]
            + (f" (needs {int(r['windows_needed'])} windows a side)"
               if present(r.get("windows_needed")) else "")
            + (f" ({r['reason']})" if present(r.get("reason")) else ""),
            r.get("software_change") if present(r.get("software_change")) else "-"]))
    return "\n".join(lines)


PAGE_COLUMNS = ["config", "trial_key", "base", "new", "ratio", "ci95_low", "ci95_high", "p",
                "threshold_pct", "threshold", "verdict", "windows_needed", "software_change"]


def page(results: list[dict[str, Any]], title: str, header: list[str]) -> str:
    """The comparison as a self-contained page in the report's style: the table, and each
    configuration's ratio with its 95% interval against the threshold band."""
    import plotly.graph_objects as go

    from raybench.report import page as report_page

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


def write_history(root: Path, out: Path, threshold_pct: float = THRESHOLD_PCT) -> Path:
    """A metric over time per configuration from a results root's history; every row judged
    against its configuration's earlier runs on the same system (compare.judge_history), the
    slower ones listed and marked."""
    from raybench import history as hist_store
    from raybench.report import figures
    from raybench.report import page as report_page

    # the page's columns only: reading every column of a thousand runs is what takes time
    hist = hist_store.read(root, columns_=hist_store.PAGE_COLUMNS)
    units = hist_store.units(root)
    judged = judge_history(hist, threshold_pct)
    flagged = judged[judged["verdict"] == "slower"] if not judged.empty else judged
    cols = ["sweep", "trial_key", "system/accelerator", "run_id", "recorded_at", "code_version",
            THROUGHPUT, "ratio", "p", "threshold_pct", "threshold", "software_change"]
    runs = hist["run_id"].nunique() if "run_id" in hist else 0
    m = {"title": "raybench history", "table_title": "Slower than the earlier runs",
         "header": [f"{root}: {len(hist)} rows, {runs} runs; each row's windows against its "
                    f"configuration's last {EARLIER_RUNS} runs on the same system: "
                    f"exact Mann-Whitney p < {ALPHA:g} and a drop beyond "
                    f"{threshold_pct:g}% or the spread those runs showed"],
         "columns": cols if not flagged.empty else ["sweep"],
         "rows": flagged.reindex(columns=cols).to_dict("records") if not flagged.empty else [],
         "units": units}
    fig = figures.history(hist, flagged, unit=units.get(THROUGHPUT, {}).get("unit"))
    store.write_text(out, report_page.render(m, [("history", fig)] if fig else []))
    return out


def _fmt(v: Any, digits: int = 1) -> str:
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raybench.compare", description=__doc__.split(
        "\n")[0])
    p.add_argument("base", nargs="?", help="run directory of the baseline")
    p.add_argument("new", nargs="?", help="run directory to judge against it")
    p.add_argument("--history", nargs="?", const="results", metavar="RESULTS_ROOT",
                   help="judge the latest run in the history under RESULTS_ROOT (default "
                   "results) against the earlier runs of each configuration on its system")
    p.add_argument("--threshold-pct", type=float, default=THRESHOLD_PCT,
                   help="smallest change that counts (default %(default)s)")
    p.add_argument("--across-systems", action="store_true",
                   help="compare runs of different systems (system/fingerprint) on purpose")
    p.add_argument("--allow-quick", action="store_true",
                   help="compare a quick row (trial/category) with a canonical one")
    p.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a page")
    args = p.parse_args(argv)
    if args.history is not None:
        return _main_history(args)
    if not (args.base and args.new):
        p.error("give BASE and NEW run directories, or --history [RESULTS_ROOT]")
    try:
        results = compare_runs(load_run(args.base), load_run(args.new), args.threshold_pct,
                               args.across_systems, (args.base, args.new), args.allow_quick,
                               _history_beside(Path(args.new)))
    except BadInput as e:
        print(f"raybench: {e}", file=sys.stderr)
        return 2
    slower = [r for r in results if r["verdict"] == "slower"]
    _write_page(args.html, results, f"{args.new} against {args.base}")
    if args.json:
        print(json.dumps({"raybench_compare": {"base": args.base, "new": args.new,
                                               "configurations": results,
                                               "slower": len(slower)}}, default=_json))
    else:
        print(table(results))
        counts = Counter(r["verdict"] for r in results)
        print(f"{len(results)} configurations: "
              + ", ".join(f"{v} {counts[v]}" for v in VERDICTS if counts[v]))
    return 1 if slower else 0


def _main_history(args: argparse.Namespace) -> int:
    from raybench import history

    if not history.files(args.history):
        print(history.no_history(args.history), file=sys.stderr)
        return 2
    hist = history.read(args.history)
    latest = hist.sort_values("recorded_at")["run_id"].iloc[-1]
    judged = judge_history(hist, args.threshold_pct, latest)
    if judged.empty:
        print(f"raybench: the latest run in {args.history} ({latest}) has no configuration "
              "that ran before on the same system. Fix: run the same sweep again, or compare "
              "two run directories", file=sys.stderr)
        return 2
    results = [{"trial_key": r["trial_key"], "config": r["trial_key"], "new": r[THROUGHPUT],
                **{k: r.get(k) for k in ("base", "ratio", "ratio_ci95", "p", "verdict",
                                         "threshold", "threshold_pct", "windows_needed",
                                         "reason", "software_change")}}
               for r in judged.to_dict("records")]
    slower = [r for r in results if r["verdict"] == "slower"]
    _write_page(args.html, results, f"{latest} against its earlier runs in {args.history}")
    if args.json:
        print(json.dumps({"raybench_compare": {"history": args.history, "run_id": latest,
                                               "configurations": results,
                                               "slower": len(slower)}}, default=_json))
    else:
        print(f"{latest} against its configurations' earlier runs in {args.history}")
        print(table(results))
    return 1 if slower else 0


def _history_beside(run: Path) -> pd.DataFrame | None:
    """The history of the results root a run directory sits in (results/<sweep>/<run>, or
    beside an explicit --output), for the configurations' run-to-run spread."""
    from raybench import history

    for root in (run.parent.parent, run.parent):
        if history.files(root):
            return history.read(root, columns_=["trial_key", "run_id", "status", THROUGHPUT,
                                                "system/fingerprint"])
    return None


def _write_page(path: str | None, results: list[dict[str, Any]], what: str) -> None:
    if not path:
        return
    store.write_text(path, page(results, "raybench comparison", [
        what, f"exact two-sided Mann-Whitney U over the windows, p < {ALPHA:g}, and a change "
        "beyond the threshold: slower / faster; the ratio's 95% interval within it: "
        "unchanged; else inconclusive"]))


def _json(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


if __name__ == "__main__":
    sys.exit(main())

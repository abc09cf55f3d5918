"""`python -m raybench.compare BASE NEW`: per configuration, is NEW faster, slower, unchanged,
or can its windows not tell?

Owns the command: two run directories' rows paired by configuration (refusing two systems or
a quick row against a canonical one unless asked), the run-to-run spread from the history
beside NEW, the table, the JSON line and the page. The decision itself is report/judge.py's
(exact Mann-Whitney U, below four windows a side Welch's t on the logs, and a practical
threshold). Exit 1 when any configuration is `slower`; else 4 when any is `inconclusive` (the
data cannot say it is not slower); 0 otherwise; 2 for bad input. `--history` judges the latest run
of a results root against each configuration's earlier runs on the same system; `--html`
writes the comparison as a page in the report's style.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench import console, store
from raybench.records import present
from raybench.report.judge import (
    ALPHA,
    SERVE_THROUGHPUT,
    THRESHOLD_PCT,
    THROUGHPUT,
    VERDICTS,
    decide_many,
    headline,
    judge_history,
    run_spread,
    threshold_arg,
    windows,
)
from raybench.results import fingerprint, history


def load_run(path: str) -> pd.DataFrame:
    """A run directory's benchmark rows that ran, one per configuration."""
    run = Path(path)
    table = run / "results.parquet"
    if not table.is_file():
        raise BadInput(f"{run} is not a run directory (no results.parquet). Fix: pass a "
                       "directory written by python -m raybench.sweep, e.g. "
                       "results/<sweep>/<run_id>")
    try:
        df = store.read_rows(table)
    except store.UnreadableTable as e:  # its message names the file and the rebuild
        raise BadInput(str(e)) from None
    lacking = [c for c in ("trial_key", "status") if c not in df]
    if lacking:
        raise BadInput(f"{table} has no {' or '.join(lacking)} column: not a table raybench "
                       "wrote. Fix: pass a run directory written by python -m raybench.sweep")
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
    in_base = set(base["trial_key"])  # once: built per key, 10,000 configurations took 12 s
    common = [k for k in new["trial_key"] if k in in_base]
    if not common:
        raise BadInput(f"{names[0]} and {names[1]} have no configuration in common (no "
                       "trial_key in both). Fix: compare two runs of the same sweep file and "
                       "--set overrides")
    b, n = base.set_index("trial_key"), new.set_index("trial_key")
    _refuse_unlike(b, n, common, names, across_systems, allow_quick)
    cat = "trial/category"
    # once per run, not per configuration: 10,000 configurations took 274 s when each pass
    # read every column of the run and the whole history (issue 63, item 4)
    axes = grid_axes(new)
    earlier = ({} if history is None or history.empty or "trial_key" not in history
               else dict(tuple(history.groupby("trial_key", sort=False))))
    rows_b, rows_n = b.to_dict("index"), n.to_dict("index")  # once: .loc per key took 2 s
    rows = [({**rows_b[k], "trial_key": k}, {**rows_n[k], "trial_key": k}) for k in common]
    wins = [(windows(rb), windows(rn)) for rb, rn in rows]
    has = [i for i, (wb, wn) in enumerate(wins) if wb and wn]
    spreads = [run_spread(earlier.get(common[i]), rows[i][1],
                          exclude={rows[i][0].get("run_id"), rows[i][1].get("run_id")})
               for i in has]
    verdicts = dict(zip(has, decide_many([wins[i] for i in has], threshold_pct, spreads),
                        strict=True))
    out = []
    for i, (key, (rb, rn)) in enumerate(zip(common, rows, strict=True)):
        result = verdicts.get(i) or {
            "verdict": "inconclusive",
            "reason": "a row has no measured windows (train/window_samples_per_s, or a "
                      "closed-loop or offline serving row's serve/window_output_tokens_per_s): "
                      "written before raybench kept them, a Server run, or a file that "
                      "lacked them"}
        out.append({"trial_key": key, "config": _config(rn, axes), "category": rn.get(cat),
                    "base": headline(rb), "new": headline(rn), **result,
                    "software_change": fingerprint.software_changes(rb, rn),
                    "systems": [rb.get("system/accelerator"), rn.get("system/accelerator")]})
    return out


def _refuse_unlike(b: pd.DataFrame, n: pd.DataFrame, common: list[str], names: tuple[str, str],
                   across_systems: bool, allow_quick: bool) -> None:
    """Two systems, or a quick row against a canonical one, only when asked for."""
    fp, cat = "system/fingerprint", "trial/category"
    differ = [] if across_systems else _differing(b, n, common, fp)
    if differ:
        raise BadInput(f"{names[0]} and {names[1]} ran on different systems "
                       f"({b.at[differ[0], 'system/accelerator']} against "
                       f"{n.at[differ[0], 'system/accelerator']}; system/fingerprint "
                       "differs). Fix: add --across-systems to compare two systems on purpose")
    mixed = [] if allow_quick else _differing(b, n, common, cat)
    if mixed:
        raise BadInput(f"{names[0]} and {names[1]} mix a quick row with a canonical one "
                       f"({b.at[mixed[0], cat]} against {n.at[mixed[0], cat]}, "
                       f"configuration {mixed[0]}): a quick row's few or unsettled windows "
                       "are not a baseline for a canonical one, nor the other way. Fix: "
                       "rerun the quick one with measure.repeats of 5 or more, or add "
                       "--allow-quick")


def _differing(b: pd.DataFrame, n: pd.DataFrame, keys: list[str], column: str) -> list[str]:
    """The configurations whose `column` both runs give, with different values."""
    if column not in b or column not in n:
        return []
    return [k for k in keys if present(b.at[k, column]) and present(n.at[k, column])
            and b.at[k, column] != n.at[k, column]]


def grid_axes(run: pd.DataFrame) -> list[str]:
    """The config columns whose values differ within a run: its grid's axes."""
    return [c for c in run.columns if "." in c and "/" not in c
            and run[c].astype(str).nunique() > 1]


def _config(row: dict[str, Any], axes: list[str]) -> str:
    """The grid's values for this row (`axes`: grid_axes of its run)."""
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


def _fmt(v: Any, digits: int = 1) -> str:
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def main(argv: list[str] | None = None, prog: str = "python -m raybench.compare") -> int:
    p = console.parser(prog, "Per configuration: is NEW faster, slower, unchanged, or unclear?")
    p.add_argument("base", nargs="?", help="run directory of the baseline")
    p.add_argument("new", nargs="?", help="run directory to judge against it")
    p.add_argument("--history", nargs="?", const="results", metavar="ROOT",
                   help="the history's latest run against its earlier ones")
    p.add_argument("--threshold-pct", type=threshold_arg, default=THRESHOLD_PCT, metavar="PCT",
                   help="smallest change that counts (default %(default)s)")
    p.add_argument("--across-systems", action="store_true",
                   help="compare two systems (system/fingerprint) on purpose")
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
    return exit_code(results)


EXIT_SLOWER, EXIT_UNDECIDED = 1, 4  # 2 is bad input, as everywhere in raybench


def exit_code(results: list[dict[str, Any]]) -> int:
    """1 where a configuration is slower; else 4 where one could not be decided (the data
    cannot say it is not slower, which 0 would), said on stderr with what would decide it;
    else 0."""
    if any(r["verdict"] == "slower" for r in results):
        return EXIT_SLOWER
    undecided = [r for r in results if r["verdict"] == "inconclusive"]
    if not undecided:
        return 0
    needed = [int(r["windows_needed"]) for r in undecided if present(r.get("windows_needed"))]
    print(f"raybench: {len(undecided)} of {len(results)} configurations undecided (exit "
          f"{EXIT_UNDECIDED}): their windows cannot tell a change beyond the threshold from "
          "none. Fix: "
          + (f"rerun with measure.repeats of {max(needed)} or more (about that many windows a "
             "side would decide at the spread seen)" if needed else
             "rerun both with a raybench that keeps train/window_samples_per_s"),
          file=sys.stderr)
    return EXIT_UNDECIDED


def _main_history(args: argparse.Namespace) -> int:
    if not history.files(args.history):
        print(history.no_history(args.history), file=sys.stderr)
        return 2
    hist = history.read(args.history)
    # raybench's own rows: a foreign file's rows have no time they were recorded at
    stamped = hist.dropna(subset=["recorded_at"]) if "recorded_at" in hist else hist.iloc[:0]
    if stamped.empty:
        print(history.no_history(args.history), file=sys.stderr)
        return 2
    latest = stamped.sort_values("recorded_at")["run_id"].iloc[-1]
    judged = judge_history(hist, args.threshold_pct, latest)
    if judged.empty:
        print(f"raybench: the latest run in {args.history} ({latest}) has no configuration "
              "that ran before on the same system. Fix: run the same sweep again, or compare "
              "two run directories", file=sys.stderr)
        return 2
    results = [{"trial_key": r["trial_key"], "config": r["trial_key"], "new": r["headline"],
                **{k: r.get(k) for k in ("base", "ratio", "ratio_ci95", "p", "verdict",
                                         "threshold", "threshold_pct", "windows_needed",
                                         "reason", "software_change", "metric")}}
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
    return exit_code(results)


def _history_beside(run: Path) -> pd.DataFrame | None:
    """The history of the results root a run directory sits in (results/<sweep>/<run>, or
    beside an explicit --output), for the configurations' run-to-run spread."""
    for root in (run.parent.parent, run.parent):
        if history.files(root):
            return history.read(root, columns_=["trial_key", "run_id", "status", THROUGHPUT,
                                                SERVE_THROUGHPUT, "system/fingerprint"])
    return None


def _write_page(path: str | None, results: list[dict[str, Any]], what: str) -> None:
    if not path:
        return
    from raybench.report.comparison import page  # plotly (0.3 s): only for --html

    store.write_text(path, page(results, "raybench comparison", [
        what, f"exact two-sided Mann-Whitney U over the windows (below four a side: Welch's t "
        f"on their logs), p < {ALPHA:g}, and a change beyond the threshold: slower / faster; "
        "the ratio's 95% interval within it: unchanged; else inconclusive"]))


def _json(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


if __name__ == "__main__":
    sys.exit(main())

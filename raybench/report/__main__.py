"""`python -m raybench.report RUN_DIR [RUN_DIR ...] [-o FILE] [--memory-budget-mb MB]`."""

from __future__ import annotations

import sys
from pathlib import Path

from raybench import console, store
from raybench.report import budget_of, write, write_history, write_index
from raybench.report.judge import threshold_arg
from raybench.results import history


def main(argv: list[str] | None = None, prog: str = "python -m raybench.report") -> int:
    p = console.parser(prog, "Self-contained HTML report of raybench runs, or of a history.")
    p.add_argument("runs", nargs="*", help="run directories (several: side by side)")
    p.add_argument("--index", metavar="ROOT", help="write ROOT/index.html of a results root")
    p.add_argument("--history", metavar="ROOT", help="write the history page of a results root")
    p.add_argument("--threshold-pct", type=threshold_arg, default=3.0, metavar="PCT",
                   help="the history page's smallest drop that counts")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="HTML file (default RUN_DIR/report.html for one run)")
    p.add_argument("--memory-budget-mb", type=float, metavar="MB",
                   help="for the within-budget recommendation")
    p.add_argument("--allow-quick", action="store_true",
                   help="quick rows (trial/category) against published figures too")
    args = p.parse_args(argv)
    if args.index:
        if not Path(args.index).is_dir():
            print(f"raybench: --index {args.index}: no such directory. Fix: pass the results "
                  "root a sweep wrote to (output.root, default ./results)", file=sys.stderr)
            return 2
        print(write_index(Path(args.index), Path(args.output) if args.output else None))
        return 0
    if args.history:
        root = Path(args.history)
        if root.name == history.LEGACY:  # the old single table: its results root
            root = root.parent
        if not history.files(root):
            print(history.no_history(args.history), file=sys.stderr)
            return 2
        out = Path(args.output) if args.output else root / "history.html"
        print(write_history(root, out, args.threshold_pct))
        return 0
    if not args.runs:
        p.error("give run directories, --index RESULTS_ROOT or --history RESULTS_ROOT")
    for r in args.runs:
        problem = _unusable(Path(r))
        if problem:
            print(f"raybench: {problem}", file=sys.stderr)
            return 2
    out = Path(args.output) if args.output else Path(args.runs[0]) / (
        "report.html" if len(args.runs) == 1 else "comparison.html")
    budget = args.memory_budget_mb or budget_of(Path(args.runs[0]))
    print(write([Path(r) for r in args.runs], out, budget, args.allow_quick))
    return 0


def _unusable(run: Path) -> str | None:
    """Why a run directory cannot be reported, as a paragraph; None when it can."""
    table = run / "results.parquet"
    if not table.is_file():
        return (f"{run} has no results.parquet. Fix: pass a run directory written by python -m "
                "raybench.sweep")
    try:
        rows = store.read_rows(table)
    except store.UnreadableTable as e:
        return str(e)
    if rows.empty:
        return (f"{table} holds no rows yet. Fix: report it once a trial has finished (a "
                "sweep writes each trial's row as it ends)")
    return None


if __name__ == "__main__":
    sys.exit(main())

"""`python -m raybench.report RUN_DIR [RUN_DIR ...] [-o FILE] [--memory-budget-mb MB]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raybench.report import budget_of, write


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raybench.report",
                                description="Self-contained HTML report of raybench runs")
    p.add_argument("runs", nargs="+", help="run directories (several: compared side by side)")
    p.add_argument("-o", "--output", help="HTML file (default RUN_DIR/report.html for one run)")
    p.add_argument("--memory-budget-mb", type=float, help="for the within-budget recommendation")
    args = p.parse_args(argv)
    missing = [r for r in args.runs if not (Path(r) / "results.parquet").exists()]
    if missing:
        print(f"raybench: {missing[0]} has no results.parquet. Fix: pass a run directory "
              "written by python -m raybench.sweep", file=sys.stderr)
        return 2
    out = Path(args.output) if args.output else Path(args.runs[0]) / (
        "report.html" if len(args.runs) == 1 else "comparison.html")
    budget = args.memory_budget_mb or budget_of(Path(args.runs[0]))
    print(write([Path(r) for r in args.runs], out, budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m raybench.bench`: measurements of raybench itself, and the in-process alias.

`overhead` compares a bare PyTorch loop with a full raybench trial (harness.py holds both
sides); `forward-check` times a forward-only trial against torch.utils.benchmark; `chips`
compares Ray Data chipping with the reference's serial whole-band chipping (data/chipbench.py);
`history` times the history's appends and reads (history.py).
`run SWEEP.yaml` is `python -m raybench.sweep SWEEP.yaml --runner local`, kept as a short name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raybench import cli, console, workloads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raybench.bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="= python -m raybench.sweep SWEEP --runner local")
    run.add_argument("sweep")
    run.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    run.add_argument("--trials", help="comma-separated trial indices (default: all)")
    run.add_argument("--output", help="run directory (default as for raybench.sweep)")
    run.add_argument("--jsonl", action="store_true", help="a JSON line per finished trial")
    run.add_argument("--resume", action="store_true",
                     help="finish an interrupted run; trials that have a row are not rerun")
    over = sub.add_parser("overhead", help="bare PyTorch loop vs a raybench trial")
    over.add_argument("sweep", nargs="?", default="sweeps/overhead_cpu.yaml")
    over.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    over.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side")
    over.add_argument("--trials-per-round", type=int, default=1, metavar="N",
                      help="each raybench round a sweep of N copies of the trial (with "
                      "--set execution.isolation=worker they share a worker group)")
    fwd = sub.add_parser("forward-check",
                         help="a forward-only trial's forward time vs torch.utils.benchmark.Timer")
    fwd.add_argument("sweep")
    fwd.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    fwd.add_argument("--trials", help="comma-separated trial indices (default: every forward-only "
                     "trial)")
    chips = sub.add_parser("chips", help="Ray Data chipping vs the reference's serial chipping")
    chips.add_argument("--data", default="results/chipbench_data",
                       help="scene root (generated there if it has no labels yet)")
    chips.add_argument("--scenes", type=int, default=3)
    chips.add_argument("--size", default="8000x8000", help="ROWSxCOLS of generated scenes")
    chips.add_argument("--chip-size", type=int, default=800)
    chips.add_argument("--cpus", type=int, help="Ray CPUs (default: all cores)")
    chips.add_argument("--seed", type=int, default=0)
    chips.add_argument("--settle", type=float, default=5.0,
                       help="seconds each side waits before its clock starts, so that every "
                            "side starts on memory in the same state (docs/performance.md)")
    hist = sub.add_parser("history", help="the history's append and read costs")
    hist.add_argument("--row", help="a results.parquet whose first row is the template "
                      "(default: the newest under results/)")
    hist.add_argument("--rows", type=int, default=100_000, help="earlier rows")
    hist.add_argument("--runs", type=int, default=1_000, help="earlier runs holding them")
    args = p.parse_args(argv)
    if args.cmd == "run":
        from raybench import sweep

        sets = [arg for x in args.set for arg in ("--set", x)]
        return sweep.main([args.sweep, "--runner", "local", *sets,
                           *(["--trials", args.trials] if args.trials else []),
                           *(["--output", args.output] if args.output else []),
                           *(["--resume"] if args.resume else []),
                           *(["--jsonl"] if args.jsonl else [])])
    cli.setup_logging()
    with console.held():
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    if args.cmd == "history":
        return _history(args)
    if args.cmd == "chips":
        from raybench.data.chipbench import compare

        result = compare(Path(args.data), args.scenes, args.size, args.chip_size, args.cpus,
                         args.seed, args.settle)
        console.emit({"raybench_chips_bench": result})
        return 0
    loaded = cli.load(args.sweep, args.set)
    if loaded is None:
        return cli.EXIT_INVALID
    spec, trials = loaded
    if args.cmd == "forward-check":
        from raybench.harness import forward_check

        wanted = {int(i) for i in args.trials.split(",")} if args.trials else None
        for t in trials:
            chosen = t.index in wanted if wanted else \
                workloads.get(t.workload_name).forward_only(t.workload)
            if chosen:
                console.emit({"raybench_forward_check": forward_check(t)})
        return 0
    if args.cmd == "overhead":
        from raybench.harness import overhead

        try:
            result = overhead(spec, trials[0], args.rounds, args.trials_per_round)
        except workloads.NoBareTwin as e:  # found by the first bare loop, before Ray starts
            print(f"raybench: bench overhead cannot compare {args.sweep}'s trial: {e}",
                  file=sys.stderr)
            return cli.EXIT_INVALID
        console.emit({"raybench_overhead": result})
        return 0
    raise AssertionError(f"unhandled command {args.cmd}")  # argparse allows no other


def _history(args: argparse.Namespace) -> int:
    import sys
    import tempfile

    import pandas as pd

    from raybench.history import benchmark

    found = sorted(Path("results").rglob("results.parquet"), key=lambda p: p.stat().st_mtime)
    source = Path(args.row) if args.row else (found[-1] if found else None)
    if source is None or not source.is_file():
        print(f"raybench: no results.parquet to take a real row from ({args.row or 'results/'})"
              ". Fix: run `make sweep` first, or pass --row RUN_DIR/results.parquet",
              file=sys.stderr)
        return 2
    row = pd.read_parquet(source).iloc[0].to_dict()
    with tempfile.TemporaryDirectory() as tmp:
        result = benchmark(row, Path(tmp), args.rows, args.runs)
    console.emit({"raybench_history_bench": {"row_from": str(source), **result}})
    return 0


if __name__ == "__main__":
    cli.exit(main())

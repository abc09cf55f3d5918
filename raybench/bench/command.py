"""`python -m raybench.bench`: measurements of raybench itself, and the in-process alias.

`overhead` compares a raybench trial with its workload's bare PyTorch twin and with torchrun
(overhead.py, twins.py), an LLM serving trial in-process with the same through Ray
(serving.py); `forward-check` times a forward-only trial against torch.utils.benchmark
(forward.py); `chips` compares Ray Data chipping with the reference's serial whole-band
chipping (chips.py); `history` times the history's appends and reads (history.py); `compare`
times compare against a run's configurations (comparison.py); `verdicts` simulates how often
compare's rule errs (verdicts.py); `dispatch` sets raybench's Server load against LoadGen's on
one replica of a known service time, with busy processes beside them (dispatch.py).
`run SWEEP.yaml` is `python -m raybench.sweep SWEEP.yaml --runner local`, kept as a short name.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from raybench import cli, console, workloads


def _parser(prog: str) -> argparse.ArgumentParser:
    p = console.parser(prog, "Benchmarks of raybench itself, and the in-process sweep.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=console.formatter)

    def sweep_file(parser: argparse.ArgumentParser, default: str | None = None) -> None:
        parser.add_argument("sweep", nargs="?" if default else None, default=default,
                            help="sweep YAML file" + (f" (default {default})" if default else ""))
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="override a dotted key (YAML), as for the sweep")

    _sweep_commands(command, sweep_file)
    _own_commands(command)
    return p


def _sweep_commands(command: Any, sweep_file: Any) -> None:
    """The commands that take a sweep file."""
    run = command("run", "the sweep in this process: sweep --runner local")
    sweep_file(run)
    run.add_argument("--trials", metavar="I,J", help="trial indices to run (default: all)")
    run.add_argument("--output", metavar="DIR", help="run directory (default as for the sweep)")
    run.add_argument("--jsonl", action="store_true", help="a JSON line per finished trial")
    run.add_argument("--resume", action="store_true", help="finish an interrupted run")
    over = command("overhead", "a trial against its bare twin and torchrun (serving: Ray)")
    sweep_file(over, "sweeps/overhead_cpu.yaml")
    over.add_argument("--rounds", type=int, default=3, metavar="N",
                      help="alternating rounds of each side (default 3)")
    over.add_argument("--trials-per-round", type=int, default=1, metavar="N",
                      help="trial copies a round (a worker group's with isolation=worker)")
    fwd = command("forward-check", "a forward-only trial against torch.utils.benchmark")
    sweep_file(fwd)
    fwd.add_argument("--trials", metavar="I,J", help="trial indices (default: every forward-only)")


def _own_commands(command: Any) -> None:
    """The benchmarks of raybench's own parts, each with its knobs."""
    chips = command("chips", "Ray Data chipping against the reference's serial chipping")
    chips.add_argument("--data", default="results/chipbench_data", metavar="DIR",
                       help="scene root (generated there without labels)")
    chips.add_argument("--scenes", type=int, default=3, metavar="N",
                       help="scenes generated (default 3)")
    chips.add_argument("--size", default="8000x8000", metavar="ROWSxCOLS",
                       help="generated scenes' size (default 8000x8000)")
    chips.add_argument("--chip-size", type=int, default=800, metavar="PX",
                       help="chip side in pixels (default 800)")
    chips.add_argument("--cpus", type=int, metavar="N", help="Ray CPUs (default: all cores)")
    chips.add_argument("--seed", type=int, default=0, help="seed of the generated scenes")
    chips.add_argument("--settle", type=float, default=5.0, metavar="S",
                       help="seconds each side waits before its clock (default 5)")
    comp = command("compare", "compare's time against a run's configurations")
    comp.add_argument("--configs", default="1000,2000,10000", metavar="N,M",
                      help="configurations a run (default 1000,2000,10000)")
    comp.add_argument("--windows", type=int, default=5, metavar="N",
                      help="windows a row (default 5)")
    verd = command("verdicts", "compare's rule on simulated windows of a known ratio")
    verd.add_argument("--windows", default="3,5,10", metavar="N,M",
                      help="windows a side (default 3,5,10)")
    verd.add_argument("--cv-pct", default="1,3,5", metavar="C,D",
                      help="each window's CV in per cent (default 1,3,5)")
    verd.add_argument("--drift-pct", default="0,2", metavar="C,D",
                      help="each run's own CV in per cent (default 0,2)")
    verd.add_argument("--slowdown", type=float, default=0.8, metavar="R",
                      help="the slowdown's ratio NEW/BASE (default 0.8)")
    verd.add_argument("--draws", type=int, default=2000, help="pairs of runs each (2000)")
    disp = command("dispatch", "raybench's Server load against LoadGen's beside busy processes")
    disp.add_argument("--service-ms", type=float, default=10.0, metavar="MS",
                      help="the replica's time a query (default 10)")
    disp.add_argument("--bound-ms", type=float, default=30.0, metavar="MS",
                      help="the latency bound (default 30)")
    disp.add_argument("--percentile", type=float, default=99.0, help="its percentile (99)")
    disp.add_argument("--seconds", type=float, default=10.0, metavar="S",
                      help="each probe's length on both sides (default 10)")
    disp.add_argument("--busy", type=int, default=2, metavar="N",
                      help="processes keeping a core busy each beside them (default 2)")
    disp.add_argument("--rounds", type=int, default=3, metavar="N",
                      help="seeds, each a search by each side (default 3)")
    disp.add_argument("--tolerance-pct", type=float, default=3.0, metavar="PCT",
                      help="the searches' bracket (default 3)")
    hist = command("history", "the history's append and read costs")
    hist.add_argument("--row", metavar="PARQUET",
                      help="template row's table (default: the newest in results/)")
    hist.add_argument("--rows", type=int, default=100_000, metavar="N",
                      help="earlier rows (default 100000)")
    hist.add_argument("--runs", type=int, default=1_000, metavar="N",
                      help="earlier runs holding them (default 1000)")


def main(argv: list[str] | None = None, prog: str = "python -m raybench.bench") -> int:
    p = _parser(prog)
    args = p.parse_args(argv)
    if args.cmd == "run":
        # the sweep command's imports: only for `bench run`
        from raybench.sweep import command as sweep

        sets = [arg for x in args.set for arg in ("--set", x)]
        return sweep.main([args.sweep, "--runner", "local", *sets,
                           *(["--trials", args.trials] if args.trials is not None else []),
                           *(["--output", args.output] if args.output else []),
                           *(["--resume"] if args.resume else []),
                           *(["--jsonl"] if args.jsonl else [])])
    cli.setup_logging()
    with console.held():
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    own = {"history": _history, "compare": _compare_costs, "verdicts": _verdict_rates,
           "chips": _chips, "dispatch": _dispatch}
    if args.cmd in own:
        return own[args.cmd](args)
    return _with_sweep(args)


def _compare_costs(args: argparse.Namespace) -> int:
    from raybench.bench.comparison import benchmark  # scipy: only here

    sizes = [int(n) for n in args.configs.split(",")]
    console.emit({"raybench_compare_bench": benchmark(sizes, args.windows)})
    return 0


def _verdict_rates(args: argparse.Namespace) -> int:
    from raybench.bench.verdicts import benchmark  # scipy: only here

    def values(text: str) -> list[float]:
        return [float(x) for x in text.split(",")]

    for line in benchmark([int(n) for n in values(args.windows)], values(args.cv_pct),
                          values(args.drift_pct), args.slowdown, args.draws):
        console.emit({"raybench_verdicts_bench": line})
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    from raybench.bench.dispatch import benchmark  # LoadGen: only here
    from raybench.failures import Infeasible

    try:
        result = benchmark(args.service_ms, args.bound_ms, args.percentile, args.seconds,
                           args.busy, args.rounds, args.tolerance_pct)
    except Infeasible as e:  # LoadGen not installed
        print(f"raybench: bench dispatch needs MLPerf's LoadGen: {e}", file=sys.stderr)
        return cli.EXIT_INVALID
    console.emit({"raybench_dispatch_bench": result})
    return 0


def _chips(args: argparse.Namespace) -> int:
    from raybench.bench.chips import compare  # rasterio (0.4 s): only for `bench chips`

    result = compare(Path(args.data), args.scenes, args.size, args.chip_size, args.cpus,
                     args.seed, args.settle)
    console.emit({"raybench_chips_bench": result})
    return 0


def _with_sweep(args: argparse.Namespace) -> int:
    """forward-check and overhead: a sweep file's trials."""
    loaded = cli.load(args.sweep, args.set)
    if loaded is None:
        return cli.EXIT_INVALID
    spec, trials = loaded
    if args.cmd == "forward-check":
        from raybench.bench.forward import forward_check  # torch: only for this command

        wanted = {int(i) for i in args.trials.split(",")} if args.trials else None
        for t in trials:
            chosen = t.index in wanted if wanted else \
                workloads.get(t.workload_name).forward_only(t.workload)
            if chosen:
                console.emit({"raybench_forward_check": forward_check(t)})
        return 0
    if args.cmd == "overhead" and trials[0].inference is not None:
        if not workloads.get(trials[0].workload_name).generates:
            print(f"raybench: bench overhead compares training trials and LLM serving trials; "
                  f"{args.sweep}'s first trial serves {trials[0].workload_name} by calls. Fix: "
                  "give a training sweep or a token workload's (sweeps/llm_serve_cpu.yaml)",
                  file=sys.stderr)
            return cli.EXIT_INVALID
        # the serving scenarios and Ray: only for this command
        from raybench.bench.serving import serving_overhead

        console.emit({"raybench_serving_overhead": serving_overhead(trials[0], args.rounds)})
        return 0
    if args.cmd == "overhead":
        from raybench.bench.overhead import overhead  # torch: only for this command
        from raybench.bench.twins import NoBareTwin

        try:
            result = overhead(spec, trials[0], args.rounds, args.trials_per_round)
        except NoBareTwin as e:  # found by the first bare loop, before Ray starts
            print(f"raybench: bench overhead cannot compare {args.sweep}'s trial: {e}",
                  file=sys.stderr)
            return cli.EXIT_INVALID
        console.emit({"raybench_overhead": result})
        return 0
    raise AssertionError(f"unhandled command {args.cmd}")  # argparse allows no other


def _history(args: argparse.Namespace) -> int:


    # pyarrow.dataset (0.25 s): only for `bench history`
    from raybench.bench.history import benchmark

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

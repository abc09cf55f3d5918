"""`python -m raybench.sweep SWEEP.yaml`: the sweep command, from a YAML file to a finished run.

Owns the command line: its options, the embedded Ray started beside the workload's import, the
run directory and its lock, which trials `--trials` picks, `--dry-run`'s plan, and the exit:
0 all trials ok, 3 some trials failed, 2 invalid input or unusable cluster, 130/143 interrupted
by SIGINT/SIGTERM (the rows written so far are whole; `--resume` finishes the run). The sweep
itself is loop.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path

from raybench import cli, console, runners, store, workloads
from raybench.results.history import History
from raybench.results.rundir import LOCK, history_root, writing
from raybench.spec import SpecError, load_sections
from raybench.sweep.loop import run_sweep
from raybench.trials import TrialSpec
from raybench.version import code_version


def main(argv: list[str] | None = None, prog: str = "python -m raybench.sweep") -> int:
    args = _parser(prog).parse_args(argv)
    cli.setup_logging()
    if args.runner == "ray":
        # Ray: not for --runner local or torchrun, which run without it
        from raybench.runners.on_ray import cluster

        cluster.show_ray_output(args.verbose)
    t0 = time.monotonic()
    # stdout for the JSON lines alone (console.py); a dry run's plan is text for a person
    with contextlib.nullcontext() if args.dry_run else console.held():
        return _main(args, t0)


def _main(args: argparse.Namespace, t0: float) -> int:
    started = _ray_beside_the_workload(args)
    try:
        return _run(args, t0, started)
    finally:
        if started:  # the runner ends it; this is for the returns before there is one
            # Ray: not for --runner local or torchrun, which run without it
            from raybench.runners.on_ray import cluster

            cluster.shutdown()


def _ray_beside_the_workload(args: argparse.Namespace) -> bool:
    """Start the embedded Ray while the workload's module is imported for the full check.
    Ray's start is 3-4 s here, much of it waiting for its new processes (the dashboard's
    address, the raylet's registration) with a core idle; the module imports torch (1.2-1.5
    s). Only where this run would start its own Ray anyway (the ray runner, no cluster, not a
    dry run), and only once the sweep file's checks that need no workload module pass: a
    typo in the file never starts Ray. Returns whether Ray was started (for this run's runner
    to own). Ray stays in this thread: the processes it starts end with the thread that
    started them (Ray's fate-sharing), so the import takes the other one."""
    if args.runner != "ray" or args.dry_run:
        return False
    # Ray: not for --runner local or torchrun, which run without it
    from raybench.runners.on_ray import cluster

    if cluster.target(args.address) or cluster.ray_is_up():
        return False
    try:
        workload = load_sections(args.sweep, args.set)
    except SpecError:
        return False  # cli.load says why, and nothing starts
    importing = threading.Thread(target=_import_quietly, args=(workload,), daemon=True)
    importing.start()
    started = cluster.connect(None)
    importing.join()
    return started


def _import_quietly(workload: str | None) -> None:
    try:
        if workload:
            workloads.get(workload)
    except Exception:  # an unknown name or a broken module: cli.load reports it
        pass


def _run(args: argparse.Namespace, t0: float, started: bool) -> int:
    loaded = cli.load(args.sweep, args.set)
    if loaded is None:
        return cli.EXIT_INVALID
    spec, trials = loaded
    trials = _picked(args, trials)
    if trials is None:
        return cli.EXIT_INVALID
    if args.dry_run:
        # Ray: not for --runner local or torchrun, which run without it
        from raybench.runners.on_ray import cluster, plan

        try:
            return plan.dry_run(spec, trials, args.address)
        except cluster.Unreachable as e:
            print(f"raybench: {e}", file=sys.stderr)
            return cli.EXIT_INVALID
    out = cli.output_dir(spec, args.output, args.resume)
    if out is None:
        return cli.EXIT_INVALID
    history = History(history_root(spec, args.output), code_version())
    runner = runners.runner_class(args.runner)
    try:
        with writing(out, spec.source):
            summary = run_sweep(spec, trials, out, runner(spec, out, args.address, started),
                                history, args.jsonl, t0)
    # before anything was written
    except (SpecError, store.UnreadableTable, *runner.input_errors) as e:
        print(f"raybench: {e}", file=sys.stderr)
        _remove_if_unused(out, args.resume)
        return cli.EXIT_INVALID
    except OSError as e:
        if not store.no_space(e):
            raise
        # every file is written whole or not at all: what is on disk is a shorter run
        _remove_if_unused(out, args.resume)
        then = (f"run the same command with --resume --output {out}: the rows written so far "
                "are whole, and the rest run then" if out.is_dir()
                else "run the same command again")
        print(f"raybench: no space left at {out} ({str(e).splitlines()[0][:160]}). Fix: free "
              f"space on that filesystem (or choose another --output or output.root), then "
              f"{then}", file=sys.stderr)
        return cli.EXIT_INVALID
    return cli.finish(summary)


def _remove_if_unused(out: Path, resume: bool) -> None:
    """A new run's directory that nothing was written to (its lock file aside)."""
    if not resume and out.is_dir() and all(p.name == LOCK for p in out.iterdir()):
        (out / LOCK).unlink(missing_ok=True)
        out.rmdir()


def _picked(args: argparse.Namespace, trials: list[TrialSpec]) -> list[TrialSpec] | None:
    """The trials `--trials` names (all without it), or None after saying what is wrong."""
    if args.trials is None:
        return trials
    try:
        listed = [int(i) for i in args.trials.split(",")]  # '' too: it names no trial
    except ValueError:
        print(f"raybench: {args.sweep}: --trials={args.trials!r}: not a list of trial indices. "
              "Fix: write e.g. --trials 0,3 (see --dry-run for the indices), or leave "
              "--trials out to run them all", file=sys.stderr)
        return None
    wanted = set(listed)
    if len(wanted) < len(listed):  # a trial runs once: `0,0` asks for what it cannot mean
        twice = sorted({i for i in listed if listed.count(i) > 1})
        print(f"raybench: {args.sweep}: --trials={args.trials!r} names trial {twice} more than "
              "once, and a trial runs once a run. Fix: name each index once", file=sys.stderr)
        return None
    unknown = sorted(wanted - {t.index for t in trials})
    if unknown:
        print(f"raybench: {args.sweep}: --trials={args.trials!r}: the sweep has no trial "
              f"{unknown} (its indices are 0 to {len(trials) - 1}). Fix: pick indices from "
              "--dry-run's plan", file=sys.stderr)
        return None
    return [t for t in trials if t.index in wanted]


def _parser(prog: str) -> argparse.ArgumentParser:
    p = console.parser(prog, "Run a sweep file's trials, each a row as it ends, then the report.")
    p.add_argument("sweep", help="sweep YAML file, e.g. sweeps/local_cpu.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key (YAML), e.g. grid.batch_size=[8,16]")
    p.add_argument("--runner", choices=sorted(runners.RUNNERS), default="ray",
                   help="ray (default), local (in-process, no Ray) or torchrun")
    p.add_argument("--trials", metavar="I,J", help="trial indices to run (default: all)")
    p.add_argument("--jsonl", action="store_true",
                   help="a JSON line per finished trial on stdout")
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    p.add_argument("--output", metavar="DIR",
                   help="run directory (default <output.root>/<name>/<UTC time>)")
    p.add_argument("--address", help="Ray cluster (default: RAY_ADDRESS, else embedded)")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's own output here too (default: its log files)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted run (--output, else the newest)")
    return p

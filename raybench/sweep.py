"""`python -m raybench.sweep SWEEP.yaml`: a whole sweep, from YAML to results table.

Owns the CLI and the one sweep loop, written against a `Runner` (runners/): the preprocess
stage, trials that can never be placed (an `infeasible` row each, never started), the
largest-batch search, resume, interrupts, history, the report and publishing. `--runner ray`
(the default) runs trials on an embedded Ray or a cluster, `--runner local` in this process.
Exit codes: 0 all trials ok, 3 some trials failed, 2 invalid input or unusable cluster, 130/143
interrupted by SIGINT/SIGTERM (the rows written so far are whole; `--resume` finishes the run).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from raybench import cli, console, fingerprint, interrupts, peaks, runners, store, workloads
from raybench.data.stage import PreprocessSpec
from raybench.grid import stage_variants
from raybench.history import History
from raybench.progress import Progress
from raybench.records import TrialOutcome
from raybench.results import ResultsTable, RowWriter, finished, now
from raybench.rundir import (
    LOCK,
    history_root,
    publish,
    run_facts,
    write_report,
    write_run_files,
    writing,
)
from raybench.runners import Runner, Unreachable
from raybench.search import search_all
from raybench.spec import SpecError, SweepSpec, load_sections
from raybench.trials import TrialSpec, derive
from raybench.version import code_version

log = logging.getLogger("raybench.sweep")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cli.setup_logging()
    if args.runner == "ray":
        from raybench import cluster

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
            from raybench import cluster

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
    from raybench import cluster

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
        from raybench import plan

        return plan.dry_run(spec, trials, args.address)
    out = cli.output_dir(spec, args.output, args.resume)
    if out is None:
        return cli.EXIT_INVALID
    history = History(history_root(spec, args.output), code_version())
    try:
        with writing(out, spec.source):
            runner = runners.make(args.runner, spec, out, args.address, started)
            summary = run_sweep(spec, trials, out, runner, history, args.jsonl, t0)
    except (SpecError, store.UnreadableTable, Unreachable) as e:  # before anything was written
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
    if not args.trials:
        return trials
    try:
        wanted = {int(i) for i in args.trials.split(",")}
    except ValueError:
        print(f"raybench: {args.sweep}: --trials={args.trials!r}: not a list of trial indices. "
              "Fix: write e.g. --trials 0,3 (see --dry-run for the indices)", file=sys.stderr)
        return None
    unknown = sorted(wanted - {t.index for t in trials})
    if unknown:
        print(f"raybench: {args.sweep}: --trials={args.trials!r}: the sweep has no trial "
              f"{unknown} (its indices are 0 to {len(trials) - 1}). Fix: pick indices from "
              "--dry-run's plan", file=sys.stderr)
        return None
    return [t for t in trials if t.index in wanted]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m raybench.sweep", description=__doc__.split("\n")[0])
    p.add_argument("sweep", help="sweep YAML file, e.g. sweeps/local_cpu.yaml")
    p.add_argument("--set", action="append", default=[], metavar="dotted.key=value",
                   help="override a spec value (YAML syntax), e.g. --set grid.batch_size=[8,16]")
    p.add_argument("--runner", choices=sorted(runners.RUNNERS), default="ray",
                   help="ray: trials on Ray (embedded, or the cluster of --address); local: in "
                   "this process, ranks spawned over torch.distributed, no Ray needed")
    p.add_argument("--trials", help="comma-separated trial indices to run (default: all)")
    p.add_argument("--jsonl", action="store_true",
                   help="print each finished trial as one JSON line on stdout "
                   '({"raybench_trial": ...}); the closing summary line stays last')
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    p.add_argument("--output", help="run directory (default <output.root>/<name>/<UTC time>)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else embedded)")
    p.add_argument("--verbose", action="store_true",
                   help="show Ray's own output here too (Tune, Train's controller, the "
                   "workers' output, Ray's warnings); by default it goes to Ray's log files")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted run: the --output directory, else the newest run "
                   "of this sweep; trials that have a row are not run again")
    return p


def run_sweep(spec: SweepSpec, trials: list[TrialSpec], out: Path, runner: Runner,
              history: History | None = None, jsonl: bool = False,
              t0: float | None = None) -> dict[str, Any]:
    """Run every trial through `runner` and return the summary; rows are on disk as each
    trial ends. The one sweep loop: stage, placement, search, resume, interrupts, history and
    the report are wired here for every runner. `t0`: when the run began (monotonic), where
    its runner's machinery started before this call (sweep.main); the summary's elapsed_s
    counts from there."""
    t0 = time.monotonic() if t0 is None else t0
    interrupted: int | None = None
    tracker = None
    if spec.output.mlflow:  # checked reachable at load (cli.load)
        from raybench.tracking import Tracker

        tracker = Tracker(spec, out)
    writer = RowWriter(spec, out.name, ResultsTable(out), history, jsonl,
                       sinks=[tracker.log_trial] if tracker else None)
    if writer.resumed:
        log.info("resuming %s: %d trial rows on disk, %d trials to run", out, writer.resumed,
                 sum(t.key not in writer.done for t in trials))
    try:
        with runner:
            interrupts.install()  # after ray.init, whose own SIGTERM handler would end the process
            runner.check(trials)
            if not writer.resumed:  # a resumed run keeps the system facts its first rows came from
                write_run_files(out, spec, *runner.system())
            writer.system = fingerprint.of(run_facts(out))
            writer.measured_peaks = peaks.latest(history, writer.system.get("system/fingerprint"))
            if tracker:
                tracker.start()
            outputs = [_stage(variant, out, writer) for variant in stage_variants(spec)]
            trials = _with_stage_output(trials, outputs)
            if not spec.search:  # a resumed search replays its probes' rows instead (probe below)
                trials = [t for t in trials if t.key not in writer.done]
            never = runner.unplaceable(trials)
            for t in trials:
                if t.key in never:
                    log.error("trial %d (%s) can never be placed: %s", t.index, t.key, never[t.key])
                    writer.write(t, TrialOutcome.failed("infeasible", never[t.key]))
            runnable = [t for t in trials if t.key not in never]
            searching = bool(spec.search and spec.search.largest_batch)
            write = _with_progress(writer, Progress(None if searching else len(runnable),
                                                    "probes" if searching else "trials"))
            if runnable and searching:
                def probe(t: TrialSpec) -> TrialOutcome:
                    if t.key not in writer.outcomes:
                        runner.run([t], write, name=f"probe_{t.index:04d}")
                    return writer.outcomes.get(t.key) or _lost(t, writer)

                search_all(spec.search.largest_batch, runnable, probe, writer)
            elif runnable:
                runner.run(runnable, write, last=True)
            for t in runnable:  # a trial the runner lost without a result is still a row
                if t.key not in writer.done:
                    _lost(t, writer)
    except KeyboardInterrupt as e:  # unrun trials get no row: --resume runs them
        interrupted = int(interrupts.signal_of(e))
        log.warning("interrupted by signal %d: %d trial rows are on disk; run the same command "
                    "with --resume to finish", interrupted, len(writer.done))
    summary = writer.summary(out, time.monotonic() - t0)
    if history is not None:
        try:  # after the run's last row: the fold costs no trial anything
            history.compact()
        except Exception:  # the run files stay as they are, read unfolded
            log.exception("could not fold the history's run files under %s", history.root)
    summary = {**summary, "report": write_report(out)}
    if tracker:
        summary["mlflow"] = tracker.finish({**summary, "interrupted": interrupted})
    if interrupted:
        summary["interrupted"] = interrupted
        return summary  # a partial run is not published
    if spec.output.storage:
        try:
            summary["storage"] = publish(out, spec.output.storage, spec.name)
        except OSError as e:  # the local copy is whole; say where the shared one failed
            log.error("could not copy the run to %s: %s", spec.output.storage, e)
            summary["storage_error"] = str(e)
    return summary


def _with_progress(writer: RowWriter, progress: Progress):
    """The runner's `done`: the row first, then the progress line."""
    def write(t: TrialSpec, outcome: TrialOutcome) -> None:
        writer.write(t, outcome, say=False)
        progress.advance(finished(t, outcome), keep=True)  # one line per finished trial
    return write


def _lost(t: TrialSpec, writer: RowWriter) -> TrialOutcome:
    writer.write(t, TrialOutcome.failed("error", "trial ended without a result"))
    return writer.outcomes[t.key]


def _with_stage_output(trials: list[TrialSpec], outputs: list[str | None]) -> list[TrialSpec]:
    """Each trial's workload takes the stage's output if it reads one (Workload.stage_input).
    With several stage variants there is no single answer: the workload then makes its own."""
    if len(outputs) != 1 or outputs[0] is None:
        return trials
    return [derive(t, rekey=False, workload=workloads.get(t.workload_name).stage_input(
        t.workload, outputs[0])) for t in trials]


def _stage(variant: PreprocessSpec, out: Path, writer: RowWriter) -> str | None:
    """Run one preprocess variant; a failure is a row, and the trials still run. Returns the
    chip directory, or None when the stage failed."""
    from raybench.data.stage import run_stage, stage_config, variant_key

    start = now()
    key = variant_key(variant)
    try:
        outcome = run_stage(variant, out)
    except Exception as e:  # missing inputs, corrupt rasters under on_error=fail, ...
        log.error("preprocess failed: %s", e)
        outcome = TrialOutcome(status="error", error=f"{type(e).__name__}: {e}",
                               config=stage_config(variant))
    writer.write_stage(key, outcome, start)
    return outcome.output if outcome.ok else None


if __name__ == "__main__":
    cli.exit(main())

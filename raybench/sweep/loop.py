"""The one sweep loop: every trial of a sweep through a `Runner`, each outcome a row as it ends.

Owns what is the same for every runner: the preprocess stage and its rows, trials that can never
be placed (an `infeasible` row each, never started), the largest-batch search (search.py),
resume, interrupts between whole rows, the history's fold, the report, the MLflow run, the copy
to shared storage and the summary line's figures. How ranks start is the runner's (runners/),
how a row is made and written results/'s, the command line command.py's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from raybench import interrupts, store, workloads
from raybench.data.stage import PreprocessSpec, run_stage, stage_config, variant_key
from raybench.grid import stage_variants
from raybench.progress import Progress
from raybench.records import TrialOutcome, now
from raybench.report.assess import validity
from raybench.results import fingerprint, peaks
from raybench.results.history import History
from raybench.results.rows import finished, headline
from raybench.results.rundir import publish, run_facts, write_run_files
from raybench.results.table import ResultsTable
from raybench.results.tracking import Tracker
from raybench.results.writer import RowWriter
from raybench.runners import Runner
from raybench.spec import SweepSpec
from raybench.sweep.search import search_all
from raybench.trials import TrialSpec, derive

log = logging.getLogger("raybench.sweep")


def run_sweep(spec: SweepSpec, trials: list[TrialSpec], out: Path, runner: Runner,
              history: History | None = None, jsonl: bool = False,
              t0: float | None = None) -> dict[str, Any]:
    """Run every trial through `runner` and return the summary; rows are on disk as each
    trial ends. The one sweep loop: stage, placement, search, resume, interrupts, history and
    the report are wired here for every runner. `t0`: when the run began (monotonic), where
    its runner's machinery started before this call (sweep/command.py); the summary's
    elapsed_s counts from there."""
    t0 = time.monotonic() if t0 is None else t0
    interrupted: int | None = None
    tracker = Tracker(spec, out) if spec.output.mlflow else None  # reachable: cli.load checked
    writer = RowWriter(spec, out.name, ResultsTable(out), history, jsonl,
                       sinks=[tracker.log_trial] if tracker else None)
    if writer.resumed:
        log.info("resuming %s: %d trial rows on disk, %d trials to run", out, writer.resumed,
                 sum(t.key not in writer.done for t in trials))
    try:
        with runner:
            interrupts.install()  # after ray.init, whose own SIGTERM handler would end the process
            _begin(spec, trials, out, runner, writer, history, tracker)
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
    return _finish(spec, out, writer, history, tracker, interrupted, time.monotonic() - t0)


def _begin(spec: SweepSpec, trials: list[TrialSpec], out: Path, runner: Runner,
           writer: RowWriter, history: History | None, tracker: Tracker | None) -> None:
    """Once the runner is up: the trials it can never serve refused (exit 2), the run files,
    the columns every row gets (system facts, this system's measured peaks), the MLflow run."""
    runner.check(trials)
    if not writer.resumed:  # a resumed run keeps the system facts its first rows came from
        write_run_files(out, spec, *runner.system())
    writer.system = fingerprint.of(run_facts(out))
    writer.measured_peaks = peaks.latest(history, writer.system.get("system/fingerprint"))
    if tracker:
        tracker.start()


def _finish(spec: SweepSpec, out: Path, writer: RowWriter, history: History | None,
            tracker: Tracker | None, interrupted: int | None, elapsed_s: float
            ) -> dict[str, Any]:
    """After the last row: the summary, the history's fold, the report, the MLflow run's end
    and, for a whole run, its copy to shared storage."""
    summary = summarize(writer, out, elapsed_s)
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


def write_report(out: Path) -> str | None:
    """`report.html` (+ .md/.json) of a finished run; a report that fails never fails a sweep."""
    if not (out / "results.parquet").exists():  # interrupted before its first row
        return None
    try:
        from raybench import report  # plotly: imported when a run has rows to draw

        return str(report.write([out], out / "report.html", report.budget_of(out)))
    except Exception as e:  # the table is the record; the page is a view of it
        if store.no_space(e):
            raise  # the sweep ends with exit 2, saying where
        log.exception("could not write the report for %s", out)
        return None


def summarize(writer: RowWriter, out: Path, elapsed_s: float) -> dict[str, Any]:
    """The run in figures for the closing JSON line: trials by status, how many rows the
    report's rules call invalid, the best valid row, the stages and searches."""
    statuses = list(writer.done.values())
    stages_failed = sum(s["status"] != "ok" for s in writer.stages)
    if writer.searches:  # a probe that does not fit is how a search ends, not a failure
        statuses = [s for s in statuses if s == "ok"]
        stages_failed += sum(s["largest_batch"] == 0 for s in writer.searches)
    ok = [r for r in writer.table.rows if r["status"] == "ok" and r["stage"] == "benchmark"]
    # the report's rule, for rows without a rate too (a Server search that met no rate)
    valid = [r for r in ok if not validity(r)]
    best = max((r for r in valid if headline(r)), key=headline, default=None)
    return {
        "sweep": writer.spec.name, "run_id": writer.run_id, "output": str(out),
        "results": str(writer.table.parquet), "trials": len(statuses),
        "ok": statuses.count("ok"),
        "failed": len(statuses) - statuses.count("ok") + stages_failed,
        "status_counts": {s: statuses.count(s) for s in sorted(set(statuses))},
        "invalid": len(ok) - len(valid),
        "best": None if best is None else {
            "trial_key": best["trial_key"], "samples_per_s": headline(best)},
        "preprocess": writer.stages,
        **({"largest_batch": writer.searches} if writer.searches else {}),
        **({"resumed_rows": writer.resumed} if writer.resumed else {}),
        "elapsed_s": round(elapsed_s, 1),
    }

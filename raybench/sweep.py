"""`python -m raybench.sweep SWEEP.yaml`: a whole sweep, from YAML to results table.

Owns the CLI, the Tune grid (the only module importing ray.tune: one function trial per
TrialSpec, one at a time) and the driver-side callback that appends a row as soon as each trial
ends. Trials that can never be placed become `infeasible` rows without being started.
Exit codes: 0 all trials ok, 3 some trials failed, 2 invalid input or unusable cluster, 130/143
interrupted by SIGINT/SIGTERM (the rows written so far are whole; `--resume` finishes the run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from raybench import cli, cluster, interrupts, plan
from raybench.data.stage import PreprocessSpec
from raybench.grid import TrialSpec, stage_variants
from raybench.results import (
    History,
    ResultsTable,
    RowWriter,
    history_root,
    now,
    publish,
    storage_uri,
    write_report,
    write_run_files,
)
from raybench.search import search_all
from raybench.spec import SpecError, SweepSpec

log = logging.getLogger("raybench.sweep")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cli.setup_logging()
    loaded = cli.load(args.sweep, args.set)
    if loaded is None:
        return cli.EXIT_INVALID
    spec, trials = loaded
    if args.dry_run:
        return plan.dry_run(spec, trials, args.address)
    out = cli.output_dir(spec, args.output, args.resume)
    if out is None:
        return cli.EXIT_INVALID
    history = History(history_root(spec, args.output))
    try:
        summary = run_sweep(spec, trials, out, args.address, history)
    except SpecError as e:  # found on the cluster before anything was written
        print(f"raybench: {e}", file=sys.stderr)
        if not args.resume and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        return cli.EXIT_INVALID
    return cli.finish(summary)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m raybench.sweep", description=__doc__.split("\n")[0])
    p.add_argument("sweep", help="sweep YAML file, e.g. sweeps/local_cpu.yaml")
    p.add_argument("--set", action="append", default=[], metavar="dotted.key=value",
                   help="override a spec value (YAML syntax), e.g. --set grid.batch_size=[8,16]")
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    p.add_argument("--output", help="run directory (default <output.root>/<name>/<UTC time>)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else embedded)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted run: the --output directory, else the newest run "
                   "of this sweep; trials that have a row are not run again")
    return p


def run_sweep(spec: SweepSpec, trials: list[TrialSpec], out: Path,
              address: str | None = None, history: History | None = None) -> dict[str, Any]:
    """Run every trial on Ray and return the summary; rows are on disk as each trial ends."""
    t0 = time.monotonic()
    run_id = out.name
    interrupted: int | None = None
    writer = RowWriter(spec, run_id, ResultsTable(out), history)
    if writer.resumed:
        log.info("resuming %s: %d trial rows on disk, %d trials to run", out, writer.resumed,
                 sum(t.key not in writer.done for t in trials))
    started = cluster.connect(address)
    interrupts.install()  # after ray.init, whose own SIGTERM handler would end the process
    try:
        nodes = cluster.nodes()
        why = None if spec.execution.logical_gpus else plan.gpus_missing(trials, nodes)
        if why:
            raise SpecError(spec.source, "hardware.num_gpus", spec.hardware.num_gpus, why,
                            "run it on a cluster with GPUs (--address or RAY_ADDRESS), set "
                            "hardware.num_gpus: 0 for CPU ranks, or execution.logical_gpus: "
                            "true to rehearse placement without GPUs")
        if not writer.resumed:  # a resumed run keeps the system facts its first rows came from
            write_run_files(out, spec, cluster.describe(), cluster.node_facts())
        outputs = [_stage(variant, out, writer) for variant in stage_variants(spec)]
        trials = _with_stage_output(trials, outputs)
        if not spec.search:  # a resumed search replays its probes' rows instead (probe below)
            trials = [t for t in trials if t.key not in writer.done]
        runnable = []
        no_token = spec.execution.concurrency == "per_node" and not any(
            n.get(plan.NODE_TOKEN) for n in nodes)
        for t in trials:
            why = plan.placement(t, nodes)
            if no_token:
                why = (f"concurrency per_node needs nodes started with --resources="
                       f"'{{\"{plan.NODE_TOKEN}\": 1}}' (see cluster/); this cluster has none")
            if why:
                log.error("trial %d (%s) can never be placed: %s", t.index, t.key, why)
                writer.write(t, {"status": "infeasible", "error": why, "metrics": {}})
            else:
                runnable.append(t)
        if runnable and spec.search and spec.search.largest_batch:
            def probe(t: TrialSpec) -> dict[str, Any]:
                if t.key not in writer.outcomes:
                    _tune(spec, [t], out, writer, name=f"probe_{t.index:04d}", nodes=nodes)
                return writer.outcomes[t.key]

            search_all(spec.search.largest_batch, runnable, probe, writer)
            runnable = []  # probes are not grid trials: nothing below is missing
        elif runnable and spec.inference:
            _scenarios(spec, runnable, writer)
        elif runnable:
            _tune(spec, runnable, out, writer, nodes=nodes)
        for t in runnable:  # a trial Tune lost without a result is still a row
            if t.key not in writer.done:
                writer.write(t, {"status": "error", "error": "trial ended without a result",
                                 "metrics": {}})
    except KeyboardInterrupt as e:  # unrun trials get no row: --resume runs them
        interrupted = int(interrupts.signal_of(e))
        log.warning("interrupted by signal %d: %d trial rows are on disk; run the same command "
                    "with --resume to finish", interrupted, len(writer.done))
    finally:
        if started:
            import ray

            ray.shutdown()
    summary = writer.summary(out, time.monotonic() - t0)
    summary = {**summary, "report": write_report(out)}
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


def _scenarios(spec: SweepSpec, trials: list[TrialSpec], writer: RowWriter) -> None:
    """Inference trials, one after another from the driver: their replicas (actors, a Ray
    Data actor pool) are the parallel part, and a Tune trial around them would only add a
    resource request that must fit beside theirs."""
    from raybench.scenarios.run import run_trial as run_scenario

    for t in trials:
        start = now()
        outcome = run_scenario(t, "ray", spec.execution.start_timeout_s,
                               spec.execution.logical_gpus)
        outcome.update(start_time=start, end_time=now())
        writer.write(t, outcome)


def _with_stage_output(trials: list[TrialSpec], outputs: list[str | None]) -> list[TrialSpec]:
    """A workload that reads chips (a `chips` field left unset) gets the stage's directory.
    With several stage variants there is no single answer: the workload then cuts its own."""
    if len(outputs) != 1 or outputs[0] is None:
        return trials
    fields = type(trials[0].workload).model_fields if trials else {}
    if "chips" not in fields:
        return trials
    return [t if t.workload.chips else
            dataclasses.replace(t, workload=t.workload.model_copy(update={"chips": outputs[0]}))
            for t in trials]


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
        outcome = {"status": "error", "error": f"{type(e).__name__}: {e}", "metrics": {},
                   "config": stage_config(variant)}
    writer.write_stage(key, outcome, start)
    return outcome.get("output") if outcome["status"] == "ok" else None


def _tune(spec: SweepSpec, trials: list[TrialSpec], out: Path, writer: RowWriter,
          name: str = "tune", nodes: list[dict[str, float]] | None = None) -> None:
    from ray import tune

    from raybench.trial import run_trial

    # Tune's CSV/JSON/TensorBoard loggers would duplicate our table; ours is the record.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # ...so Tune's end-of-run analysis finds no result.json; its warning about that is noise.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    storage = str(out / "ray")
    if spec.output.storage:  # checkpoints go straight to shared storage
        storage = storage_uri(spec.output.storage, spec.name, out.name, "ray")
        if "://" not in storage:
            storage = str(Path(storage).resolve())
    trials_dir = str(out / "trials")
    execution = spec.execution
    cwd = os.getcwd()  # the sweep's relative paths are relative to where it was started
    nodes = nodes or cluster.nodes()
    limit, why = plan.concurrency_limit(trials, nodes, execution.concurrency)
    log.info("concurrency %s", why)
    strategies = {t.key: plan.strategy(t, nodes, execution.placement, execution.concurrency)
                  for t in trials}

    def tune_trial(config: dict[str, Any], trial_dicts: list[dict[str, Any]]) -> None:
        trial = TrialSpec.from_dict(trial_dicts[config["trial"]])
        start = now()
        outcome = run_trial(trial, storage, trials_dir, execution, cwd, strategies[trial.key])
        outcome.update(start_time=start, end_time=now())
        tune.report({"raybench_outcome": json.dumps(outcome)})

    class Writer(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            outcome = json.loads(result["raybench_outcome"])
            writer.write(by_index[trial.config["trial"]], outcome)

        def on_trial_error(self, iteration, trials, trial, **info):
            t = by_index[trial.config["trial"]]
            if t.key not in writer.done:
                writer.write(t, {"status": "error", "metrics": {},
                                 "error": f"Tune trial failed: {_read(trial.error_file)}"})

    by_index = {i: t for i, t in enumerate(trials)}
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(tune_trial, trial_dicts=[t.to_dict() for t in trials]),
            {"cpu": 0.01},  # the trainer's workers hold the real resources; {"cpu": 0} is rejected
        ),
        param_space={"trial": tune.grid_search(list(by_index))},
        tune_config=tune.TuneConfig(max_concurrent_trials=limit, reuse_actors=False),
        run_config=tune.RunConfig(
            name=name, storage_path=storage, verbose=0, callbacks=[Writer()],
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    tuner.fit()


def _read(path: str | None) -> str:
    try:
        return Path(path).read_text()[-2000:] if path else "no error file"
    except OSError:
        return f"error file {path} unreadable"


if __name__ == "__main__":
    sys.exit(main())

"""The Ray runner: trials as a Tune grid of Ray Train runs, inference trials as replica actors.

Owns connecting to (or embedding) Ray, refusing a cluster that can never serve the sweep, the
placement check that turns impossible trials into rows before anything starts, and the Tune
grid (the only module importing ray.tune: one function trial per TrialSpec, a driver-side
callback handing each outcome back as soon as its trial ends). One trial's Ray Train run is
trial.py; one inference trial is scenarios/run.py.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import ray

from raybench import store
from raybench.columns import Metric, declare
from raybench.failures import clip
from raybench.records import TrialOutcome, now
from raybench.results.rundir import storage_uri
from raybench.runners import Done, Runner
from raybench.runners.on_ray import artifacts, cluster, plan
from raybench.runners.on_ray import private as ray_private
from raybench.spec import SpecError
from raybench.trials import TrialSpec, artifact_dir

log = logging.getLogger("raybench.sweep")

declare(Metric("overhead/report_s", "s", "the trial's end to its outcome reaching the driver "
               "through Tune"))


class RayRunner(Runner):
    name = "ray"
    input_errors = (cluster.Unreachable,)
    _started = False

    def start(self) -> None:
        self._started = cluster.connect(self.address) or self.started
        self.nodes = cluster.nodes()

    def check(self, trials: list[TrialSpec]) -> None:
        spec = self.spec
        why = None if spec.execution.logical_gpus else plan.gpus_missing(trials, self.nodes)
        if why:
            raise SpecError(spec.source, "hardware.num_gpus", spec.hardware.num_gpus, why,
                            "run it on a cluster with GPUs (--address or RAY_ADDRESS), set "
                            "hardware.num_gpus: 0 for CPU ranks, or execution.logical_gpus: "
                            "true to rehearse placement without GPUs")

    def stop(self) -> None:
        if self._started:
            cluster.shutdown()
            self._started = False

    def system(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None]:
        # embedded: this process started the Ray it uses (now, or before, as bench overhead does)
        embedded = cluster.target(self.address) is None
        return cluster.describe(), cluster.node_facts(embedded=embedded)

    def unplaceable(self, trials: list[TrialSpec]) -> dict[str, str]:
        no_token = self.spec.execution.concurrency == "per_node" and not any(
            n.get(plan.NODE_TOKEN) for n in self.nodes)
        out = {}
        for t in trials:
            why = plan.placement(t, self.nodes)
            if no_token:
                why = (f"concurrency per_node needs nodes started with --resources="
                       f"'{{\"{plan.NODE_TOKEN}\": 1}}' (see cluster/); this cluster has none")
            if why:
                out[t.key] = why
        return out

    def run(self, trials: list[TrialSpec], done: Done, name: str = "tune",
            last: bool = False) -> None:
        if not trials:
            return
        if trials[0].inference is not None:
            _scenarios(self.spec, trials, done, str(self.out / "trials"))
            return
        # a cluster joined may grow nodes later (an autoscaler): only an embedded Ray is sure
        # to be this one machine
        rows, tuner = _tuner(self.spec, trials, self.out, done, name, self.nodes,
                             embedded=cluster.target(self.address) is None,
                             ends_ray=last and self._started)
        rows.failed(tuner.fit())


def _scenarios(spec, trials: list[TrialSpec], done: Done, trials_dir: str) -> None:
    """Inference trials, one after another from the driver: their replicas (actors, a Ray
    Data actor pool) are the parallel part, and a Tune trial around them would only add a
    resource request that must fit beside theirs."""
    # torch (1.4 s): only for inference trials
    from raybench.scenarios.run import run_trial as run_scenario

    for t in trials:
        start = now()
        outcome = run_scenario(t, "ray", spec.execution.start_timeout_s,
                               spec.execution.logical_gpus, artifact_dir(trials_dir, t))
        outcome.start_time, outcome.end_time = start, now()
        done(t, outcome)


def _tuner(spec, trials: list[TrialSpec], out: Path, done: Done, name: str,
           nodes: list[dict[str, float]], embedded: bool = False,
           ends_ray: bool = False) -> tuple[_Rows, Any]:
    """The Tune grid, and the writer of its rows: one function trial per worker group
    (trial.tune_entry), each trial alone or (isolation: worker) the trials of one shape on
    one group of workers, one after another; max_concurrent_trials from
    plan.concurrency_limit; each outcome to the sweep loop as it comes (_Rows)."""
    from ray import tune  # Ray Tune: only once a sweep has training trials

    # Ray Train (0.56 s): only for training trials
    from raybench.runners.on_ray.mailbox import TrialRef
    from raybench.runners.on_ray.trial import tune_entry

    # Tune's CSV/JSON/TensorBoard loggers would duplicate our table; ours is the record.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # ...so Tune's end-of-run analysis finds no result.json; its warning about that is noise.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    execution = spec.execution
    limit, why = plan.concurrency_limit(trials, nodes, execution.concurrency)
    log.info("concurrency %s", why)
    strategies = {t.key: plan.strategy(t, nodes, execution.placement, execution.concurrency)
                  for t in trials}
    groups = plan.worker_groups(trials, strategies, execution.isolation, limit)
    if len(groups) < len(trials):
        log.info("isolation worker: %d trials on %d worker groups", len(trials), len(groups))
    runs = _run_settings(spec, out, strategies, handoff=len(groups) < len(trials),
                         # rank 0 may run where this run directory is not
                         parcels=len(nodes) > 1 or not embedded,
                         # the last group's Train run ends with the Ray that stop() ends
                         last=len(groups) - 1 if ends_ray else None)
    ray_private.start_autoscaling_coordinator()  # beside Tune's start, not the first trial's
    rows = _Rows(trials, groups, runs, done)
    return rows, tune.Tuner(
        tune.with_resources(
            tune.with_parameters(tune_entry, trials=[TrialRef.of(t) for t in trials],
                                 groups=groups, runs=runs),
            {"cpu": 0.01},  # the trainer's workers hold the real resources; {"cpu": 0} is rejected
        ),
        param_space={"group": tune.grid_search(list(range(len(groups))))},
        tune_config=tune.TuneConfig(max_concurrent_trials=limit, reuse_actors=False),
        run_config=tune.RunConfig(
            name=name, storage_path=runs.storage, verbose=0,
            stop=rows,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def _run_settings(spec, out: Path, strategies: dict[str, str], handoff: bool, parcels: bool,
                  last: int | None) -> Any:
    """What every Train run of the sweep shares (train.RunSettings), its actors started."""
    # Ray Train (0.56 s): only for training trials
    from raybench.runners.on_ray.mailbox import Mailbox, Parcels
    from raybench.runners.on_ray.train import RunSettings

    storage = str(out / "ray")
    if spec.output.storage:  # checkpoints go straight to shared storage
        storage = store.identity(storage_uri(spec.output.storage, spec.name, out.name, "ray"))
    trials_dir = str(out / "trials")
    return RunSettings(
        storage=storage, trials_dir=trials_dir, execution=spec.execution,
        cwd=os.getcwd(),  # the sweep's relative paths are relative to where it was started
        strategies=strategies,
        mailbox=Mailbox.remote(),  # the ranks' messages; a trial that never starts is a row
        parcels=Parcels.remote(artifacts.mark(trials_dir)) if parcels else None,
        handoff=handoff, last=last)


class _Rows:
    """The sweep loop's side of the Tune grid, in the driver: each outcome, with the trial's
    files where they came from another node, to `done` (the sweep loop's row) as its trial
    ends, then the word to a worker group waiting on that row; after the grid, a row for
    every trial whose Tune trial failed before reporting it.

    Tune calls it as a stop condition (RunConfig's `stop` callable: called in the driver on
    every result; this one never stops anything), not as a `tune.Callback`: Tune takes a
    census of its callbacks for Ray's usage statistics, and the census imports Ray's MLflow
    integration, which imports MLflow wherever it is installed (1.7 s at every sweep's start
    here, before the first trial, statistics on or off)."""

    def __init__(self, by_index: list[TrialSpec], groups: list[list[int]], runs: Any,
                 done: Done) -> None:
        self.by_index, self.groups, self.runs, self.done = by_index, groups, runs, done
        self.reported: set[int] = set()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        i = result.get("raybench_trial")
        if i is None or i in self.reported:  # Tune asks again about a trial's last result
            return False
        self.reported.add(i)
        outcome = TrialOutcome.from_dict(json.loads(result["raybench_outcome"]))
        runs, trials_dir = self.runs, self.runs.trials_dir
        if runs.parcels is not None:  # before the row: a sink may read the trial's folder
            name = Path(artifact_dir(trials_dir, self.by_index[i])).name
            files = ray.get(runs.parcels.take.remote(name))
            if files:
                log.info("wrote %d files of trial %s (%d bytes) from rank 0's node",
                         len(files), name, artifacts.unpack(trials_dir, files))
                _point_at_copy(outcome, trials_dir, name, files)
        if "fit_end" in outcome.stamps:  # Tune's report reaching the driver, with its row
            outcome.metrics["overhead/report_s"] = time.time() - outcome.stamps["fit_end"]
        self.done(self.by_index[i], outcome)
        if runs.handoff:
            runs.mailbox.put.remote(("row", i), True)
        return False

    def failed(self, grid: Any) -> None:
        """Rows for the trials of every Tune trial that failed (tune_entry raised) before it
        reported them."""
        for result in grid:
            if result.error is None:
                continue
            for i in self.groups[result.config["group"]]:
                if i not in self.reported:
                    self.done(self.by_index[i], TrialOutcome.failed(
                        "error", f"Tune trial failed: {clip(str(result.error), 2000, 600)}"))


def _point_at_copy(outcome: TrialOutcome, trials_dir: str, name: str,
                   files: list[tuple[str, bytes]]) -> None:
    """Ray Train kept the checkpoint at a local path of rank 0's node, which this driver does
    not see (no output.storage): the row names the copy that came with the trial's files."""
    kept = outcome.metrics.get("train/checkpoint")
    if kept and "://" not in kept and any(rel.startswith(f"{name}/checkpoint/")
                                          for rel, _ in files):
        outcome.metrics["train/checkpoint"] = str(Path(trials_dir) / name / "checkpoint")

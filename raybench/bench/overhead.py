"""`bench overhead`: the harness tax, a raybench trial beside its bare twin and beside torchrun.

Owns the comparison, round by round: throughput of raybench on Ray against the workload's bare
twin (twins.py: `resnet` has one, the workload the tax is quoted for) and against the same
trials under torchrun, the paired ratios' intervals and verdicts against raybench's goals, and
the fixed cost per trial (a trial's wall time outside its measured windows) by phase.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import ttest_1samp

from raybench import runners
from raybench.bench.twins import bare_loop, without_twin
from raybench.memory import steady_heap
from raybench.metrics.overhead import TRAIN_START_PARTS
from raybench.records import present
from raybench.runners.on_ray import cluster
from raybench.spec import SweepSpec
from raybench.sweep.loop import run_sweep
from raybench.trials import TrialSpec, derive

log = logging.getLogger(__name__)

# raybench's promises against torchrun, the launcher its users would otherwise script (issue
# 42): a trial through Ray keeps at least 99% of torchrun's per-step throughput, and a worker
# group's later trial costs at most torchrun's fixed cost per trial plus one second.
THROUGHPUT_GOAL = 0.99
LATER_TRIAL_MARGIN_S = 1.0
# what else the machine did during each side's windows, from the rows: the ranks' CPU use and
# their threads' time ready to run but waiting for a core (process.py). On two cores the
# Ray trial's threads waited 19% of the window against torchrun's 5% (docs/journal/2026-11.md).
HOST_FIGURES = ("host/cpu_util_pct", "host/run_wait_pct")


def overhead(spec: SweepSpec, trial: TrialSpec, rounds: int,
             per_round: int = 1) -> dict[str, Any]:
    """Bare loop without Ray, then bare, raybench on Ray and the same trials under torchrun
    (the launcher users would otherwise script) in turn, with Ray up; medians of each, and the
    rounds' paired ratios with their verdicts (`_Rounds.summary`).

    Each raybench round is a sweep of `per_round` copies of the trial (seeds differ, cost does
    not): with `execution.isolation: worker` they share a worker group, and the figures say
    what the first trial costs (the group's start-up), what each one after it costs, and the
    sweep's time outside its measured windows per trial. The torchrun side starts every trial's
    ranks afresh, as a torchrun script per configuration does."""
    copies = [trial] if per_round == 1 else [
        derive(trial, rekey=True, index=i, workload={"seed": trial.workload.seed + i})
        for i in range(per_round)]
    # Ray's daemons take CPU even when idle, which matters on small machines: measure the bare
    # loop once with no Ray at all, then alternate bare and raybench with Ray up. A trial with
    # no twin (several ranks, a workload without one): Ray against torchrun alone.
    if why := without_twin(trial):
        log.info("no bare loop beside this trial (%s): Ray against torchrun only", why)
    no_ray = [] if why else [bare_loop(trial) for _ in range(rounds)]
    started = cluster.connect(None)  # one Ray for all rounds: its start-up is not per trial
    tally = _Rounds()
    try:
        for i in range(rounds):
            bare = None if why else bare_loop(trial)
            rows, sweep_s = _sweep(spec, copies, "ray")
            theirs, _ = _sweep(spec, copies, "torchrun")
            tally.add(bare, rows, sweep_s, theirs)
            tally.log_round(i, bare, per_round, sweep_s)
    finally:
        if started:
            cluster.shutdown()
    out = {"config": trial.overrides or trial.config(), "rounds": rounds,
           "heap": steady_heap(),  # the bare loop's, as the ranks' (host/heap in the rows)
           "trials_per_round": per_round, "isolation": spec.execution.isolation,
           "bare_no_ray_samples_per_s": no_ray, **tally.summary(no_ray)}
    vs = out["throughput_vs_torchrun"]
    log.info("Ray / torchrun per-step throughput %.3f over %d round(s)%s: goal %g %s",
             vs["geomean"], rounds, f", 95% interval {vs['ci95'][0]:.3f}-{vs['ci95'][1]:.3f}"
             if vs["ci95"] else "", THROUGHPUT_GOAL, vs["verdict"])
    return out


def _sweep(spec: SweepSpec, trials: list[TrialSpec], runner: str
           ) -> tuple[list[dict[str, Any]], float]:
    """One side of a round: the trials as a sweep on `runner`; their rows and the sweep's
    wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        run_sweep(spec, trials, Path(tmp), runners.make(runner, spec, Path(tmp)))
        return _ok_rows(Path(tmp), len(trials)), time.monotonic() - t0


@dataclass
class _Rounds:
    """What `bench overhead`'s rounds gather, side by side, and what they come to."""

    bare: list[float] = field(default_factory=list)
    ray: list[float] = field(default_factory=list)  # samples/s, each round's median trial
    torchrun: list[float] = field(default_factory=list)
    sweep_s: list[float] = field(default_factory=list)  # the Ray side's sweeps
    measured: list[float] = field(default_factory=list)  # their measured windows, summed
    fixed: list[float] = field(default_factory=list)  # their time outside them, per trial
    first: list[float] = field(default_factory=list)  # each row's own overhead/fixed_s: the
    later: list[float] = field(default_factory=list)  # group's first trial, the ones after it
    torchrun_fixed: list[float] = field(default_factory=list)
    by_position: dict[int, list[float]] = field(default_factory=dict)  # samples/s by place
    phases: dict[str, list[float]] = field(default_factory=dict)
    host: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {"raybench": {}, "torchrun": {}})

    def add(self, bare: float | None, rows: list[dict[str, Any]], sweep_s: float,
            theirs: list[dict[str, Any]]) -> None:
        window = sum(r["train/measured_s"] for r in rows)
        if bare is not None:
            self.bare.append(bare)
        self.ray.append(statistics.median(r["train/samples_per_s"] for r in rows))
        self.torchrun.append(statistics.median(r["train/samples_per_s"] for r in theirs))
        self.sweep_s.append(sweep_s)
        self.measured.append(window)
        self.fixed.append((sweep_s - window) / len(rows))
        self.first.append(float(rows[0]["overhead/fixed_s"]))
        self.later += [float(r["overhead/fixed_s"]) for r in rows[1:]]
        self.torchrun_fixed += [float(r["overhead/fixed_s"]) for r in theirs]
        for r in rows:
            self.by_position.setdefault(int(r.get("trial/group_position") or 0), []).append(
                float(r["train/samples_per_s"]))
        for side, side_rows in (("raybench", rows), ("torchrun", theirs)):
            for k in HOST_FIGURES:
                self.host[side].setdefault(k, []).extend(
                    float(r[k]) for r in side_rows if present(r.get(k)))
        for name, value in breakdown(rows, sweep_s).items():
            self.phases.setdefault(name, []).append(value)

    def log_round(self, i: int, bare: float | None, per_round: int, sweep_s: float) -> None:
        log.info("round %d: bare %s, raybench %.1f, torchrun %.1f samples/s; sweep of %d "
                 "trial(s) %.1f s, measured windows %.2f s, %.2f s per trial outside them",
                 i, "-" if bare is None else f"{bare:.1f}", self.ray[-1], self.torchrun[-1],
                 per_round, sweep_s, self.measured[-1], self.fixed[-1])

    def summary(self, no_ray: list[float]) -> dict[str, Any]:
        med = statistics.median
        bare = bool(self.bare)  # none where the trial has no twin
        out: dict[str, Any] = {
            "bare_samples_per_s": self.bare, "raybench_samples_per_s": self.ray,
            "throughput_ratio": med(self.ray) / med(self.bare) if bare else None,
            "throughput_ratio_vs_no_ray": med(self.ray) / med(no_ray) if bare else None,
            # against torchrun, trial by trial as the rows measure it (overhead/fixed_s: the
            # trial's wall time outside its measured windows, from the runner's start of it)
            "torchrun_samples_per_s": self.torchrun,
            "throughput_ratio_vs_torchrun": med(self.ray) / med(self.torchrun),
            # the same, round by round (each round measures both back to back), and the verdict
            "throughput_vs_torchrun": paired_ratio(self.ray, self.torchrun, THROUGHPUT_GOAL),
            "throughput_vs_bare": paired_ratio(self.ray, self.bare, None) if bare else None,
            "raybench_trial_fixed_s_median": med(self.first + self.later),
            "torchrun_trial_fixed_s_median": med(self.torchrun_fixed),
            "sweep_wall_s": self.sweep_s, "measured_window_s": self.measured,
            # the sweep's time outside its measured windows, per trial
            "fixed_overhead_s_median": med(self.fixed),
            "fixed_cost_breakdown_s_median": {k: round(med(v), 3)
                                              for k, v in self.phases.items()},
            "window_host_median": {side: {k: round(med(v), 1) for k, v in figures.items() if v}
                                   for side, figures in self.host.items()},
        }
        if self.later:  # a group of several trials: its first's fixed cost, the ones after it
            limit = out["torchrun_trial_fixed_s_median"] + LATER_TRIAL_MARGIN_S
            out.update({
                "first_trial_fixed_s_median": med(self.first),
                "next_trials_fixed_s_median": med(self.later),
                "raybench_samples_per_s_by_group_position": {
                    k: med(v) for k, v in sorted(self.by_position.items())},
                "later_trial_fixed_cost": {
                    "limit_s": limit, "verdict": "met" if med(self.later) <= limit
                    else "missed", "goal": "a worker group's later trial costs at most "
                    f"torchrun's fixed cost per trial plus {LATER_TRIAL_MARGIN_S:g} s"}})
        return out


def paired_ratio(ours: list[float], theirs: list[float], goal: float | None) -> dict[str, Any]:
    """`ours / theirs` round by round, where each round measured both sides back to back: the
    machine's drift from one round to the next (which on a small VM moved the bare loop by more
    than the gap between runners, docs/journal/2026-11.md) cancels within a pair. The rounds'
    geometric mean with its 95% Student t interval on the logs (scipy: few rounds, ratios
    multiply); and, given a `goal`, the verdict: `met` when the interval lies at or above it,
    `missed` when wholly below, `undecided` when it straddles the goal (more rounds narrow it;
    one round has no interval and decides nothing)."""
    logs = np.log(np.asarray(ours, float) / np.asarray(theirs, float))
    out: dict[str, Any] = {"by_round": [float(x) for x in np.exp(logs)],
                           "geomean": float(np.exp(logs.mean())), "ci95": None}
    if len(logs) >= 2:
        if np.ptp(logs) == 0:  # identical rounds: t's interval is undefined, the point is it
            low = high = float(logs[0])
        else:
            ci = ttest_1samp(logs, 0.0).confidence_interval(0.95)
            low, high = float(ci.low), float(ci.high)
        out["ci95"] = [float(np.exp(low)), float(np.exp(high))]
    if goal is not None:
        out["goal"] = goal
        if out["ci95"] is None:
            out["verdict"] = "undecided"
            out["reason"] = "one round: no interval; run --rounds 3 or more"
        elif out["ci95"][0] >= goal:
            out["verdict"] = "met"
        elif out["ci95"][1] < goal:
            out["verdict"] = "missed"
        else:
            out["verdict"] = "undecided"
            out["reason"] = (f"the 95% interval {out['ci95'][0]:.3f}-{out['ci95'][1]:.3f} "
                             f"straddles {goal:g}; more rounds narrow it")
    return out


def breakdown(rows: list[dict[str, Any]], sweep_s: float) -> dict[str, float]:
    """One sweep's time outside its measured windows, by phase, per trial (seconds): the
    trials' own phases from their rows (`overhead/*`, metrics.overhead.fixed_cost) and
    `sweep_loop`, what the sweep spent around its trials (Tune's start and end, the run files,
    the report)."""
    n = len(rows)
    out: dict[str, float] = {}
    for row in rows:
        for k, v in row.items():
            if (k.startswith("overhead/") and k != "overhead/fixed_s" and v == v
                    and v is not None and k not in TRAIN_START_PARTS):
                name = k.split("/", 1)[1].removesuffix("_s")
                out[name] = out.get(name, 0.0) + float(v) / n
    driver = sum(_seconds(r["start_time"], r["end_time"])
                 + (r.get("overhead/report_s") or 0.0) for r in rows)
    out["sweep_loop"] = (sweep_s - driver) / n
    # what no stamp brackets (a rank's way from its record to its exit, clock steps)
    out["other"] = (sweep_s - sum(r["train/measured_s"] for r in rows)) / n - sum(out.values())
    # train_start's parts, shown beside it (not added again)
    for k in TRAIN_START_PARTS:
        values = [float(r[k]) for r in rows if k in r and r[k] == r[k] and r[k] is not None]
        if values:
            out["train_start." + k.split("/", 1)[1].removesuffix("_s")] = sum(values) / n
    return out


def _ok_rows(out: Path, n: int) -> list[dict[str, Any]]:
    rows = pd.read_parquet(out / "results.parquet").to_dict("records")
    if len(rows) != n or any(r["status"] != "ok" for r in rows):
        raise RuntimeError(f"raybench trials did not all succeed: {rows}")
    return sorted(rows, key=lambda r: r["trial_index"])


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()

"""Rows: what a trial, a preprocess stage or a batch search becomes in the results table.

Owns a row's making and completion: its identity columns and config, a trial's metrics with
the figures computed once for every runner (the fixed cost per phase from the runner's and
ranks' stamps, the windows' 95% interval), the run's `system/*` columns, MFU against this
system's measured peak, and the check that every metric column is declared. Pure: writing is
writer.py's, the files table.py's. Also the one-line and JSON-line views of a finished trial.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from raybench import columns, workloads
from raybench.metrics import with_interval
from raybench.metrics.overhead import fixed_cost
from raybench.records import Status, TrialOutcome, now, present
from raybench.results import peaks
from raybench.results.table import jsonable
from raybench.trials import SECTIONS, TrialSpec


def make_row(*, sweep: str, run_id: str, system: str, trial: TrialSpec, status: Status,
             error: str | None, start: str, end: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "sweep": sweep, "run_id": run_id, "stage": "benchmark", "trial_index": trial.index,
        "trial_key": trial.key,
        "system": system, "start_time": start, "end_time": end, "status": status,
        "error": error, **trial.config(), **metrics,
    }


def trial_row(trial: TrialSpec, outcome: TrialOutcome, sweep: str, run_id: str,
              system: str) -> dict[str, Any]:
    """A trial's row: its outcome's metrics, plus (for a trial that ran ranks) its fixed cost
    from the runner's and the ranks' stamps, computed here for every runner (inference trials'
    records are their replicas' calls, not ranks), and its windows' interval."""
    stamp = now()
    metrics = outcome.metrics
    if outcome.ok and trial.inference is None:
        metrics = {**metrics, **fixed_cost(outcome.records, outcome.stamps)}
    return make_row(sweep=sweep, run_id=run_id, system=system, trial=trial,
                    status=outcome.status, error=outcome.error, metrics=with_interval(metrics),
                    start=outcome.start_time or stamp, end=outcome.end_time or stamp)


def stage_row(key: str, outcome: TrialOutcome, start: str, sweep: str, run_id: str,
              system: str) -> dict[str, Any]:
    """A preprocess stage's row: `stage=preprocess`, its config and figures."""
    return {
        "sweep": sweep, "run_id": run_id, "stage": "preprocess", "trial_index": None,
        "trial_key": key, "system": system, "start_time": start, "end_time": now(),
        "status": outcome.status, "error": outcome.error, **(outcome.config or {}),
        **outcome.metrics,
    }


def search_row(group: TrialSpec, result: dict[str, Any], start: str, sweep: str, run_id: str,
               system: str) -> dict[str, Any]:
    """A largest-batch search's answer: `stage=search` (its probes are trials of their own)."""
    config = {k: v for k, v in group.config().items() if k != "workload.batch_size"}
    found = result["largest_batch"] > 0
    return {
        "sweep": sweep, "run_id": run_id, "stage": "search", "trial_index": None,
        "trial_key": group.key, "system": system, "start_time": start, "end_time": now(),
        "status": "ok" if found else "error",
        "error": None if found else "not even batch size 1 fits", **config,
        "search/largest_batch": result["largest_batch"],
        # what a step then trains: accumulation multiplies the batch that fits
        "search/largest_samples_per_step": result["largest_batch"]
        * group.hardware.grad_accum_steps,
        "search/first_failing_batch": result["first_failing_batch"],
        "search/probes": len(result["probes"]),
        "search/memory_budget_mb": result["memory_budget_mb"],
    }


def complete(row: dict[str, Any], system: dict[str, Any], measured_peaks: dict[str, float],
             where: str) -> dict[str, Any]:
    """The row as it is written: the run's `system/*` columns (fingerprint.of), MFU against
    this system's measured peak (peaks.latest), every metric column declared (`where` names
    the row in the error)."""
    row.update(system)
    row.update(peaks.mfu_measured(row, measured_peaks))
    if row.get("workload.name"):  # its module declares its own columns (on import)
        workloads.get(row["workload.name"])
    columns.check(list(row), where)
    return row


def finished(trial: TrialSpec, outcome: TrialOutcome) -> str:
    """A finished trial in a line: `trial 3 70ba71e0b3cc: ok, 119.8 samples/s`."""
    thr = headline(outcome.metrics)
    tokens = outcome.metrics.get("serve/output_tokens_per_s")
    rate = (f", {thr:.1f} samples/s" if thr else f", {tokens:.1f} output tokens/s"
            if present(tokens) else "")
    return (f"trial {trial.index} {trial.key}: {outcome.status}"
            + (rate or f" ({(outcome.error or '')[:200]})"))


def trial_line(row: dict[str, Any]) -> dict[str, Any]:
    """A finished trial for a pipeline, as the ResNet suite prints one: samples per second,
    samples measured, the trial's elapsed seconds, its configuration, then the whole row."""
    steps, gbs = row.get("train/measured_steps"), row.get("train/global_batch_size")
    elapsed = (datetime.fromisoformat(row["end_time"]) -
               datetime.fromisoformat(row["start_time"])).total_seconds()
    return jsonable({
        "trial_index": row["trial_index"], "trial_key": row["trial_key"],
        "status": row["status"], "error": row["error"],
        "samples_per_s": headline(row),
        "total_samples": steps * gbs if steps and gbs else row.get("infer/samples"),
        "elapsed_seconds": elapsed,
        "config": {k: v for k, v in row.items() if k.split(".", 1)[0] in SECTIONS},
        "row": row,
    })


def headline(metrics: dict[str, Any]) -> float | None:
    """A row's samples per second: training, offline inference, or the Server rate found."""
    for key in ("train/samples_per_s", "infer/samples_per_s", "server/samples_per_s"):
        if present(metrics.get(key)):
            return float(metrics[key])
    return None

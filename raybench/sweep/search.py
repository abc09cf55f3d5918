"""Largest batch that fits: for each grid point (tile, precision, mode, ...) a search over fresh
trials, doubling the batch until a trial fails or breaks the memory budget, then bisecting.

Owns the search itself (its `search:` section's model is in sections.py), written against a
`run(trial) -> outcome` callable so every runner shares it.
Every probe is an ordinary trial row; the answer is one more row with `stage=search`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raybench.columns import Metric, declare
from raybench.records import TrialOutcome, now
from raybench.sections import LargestBatchSpec
from raybench.trials import TrialSpec, derive

declare(  # the answer's row (results.rows.search_row)
    Metric("search/largest_batch", "count", "largest batch per rank that fitted (0: none)"),
    Metric("search/largest_samples_per_step", "count", "samples per rank of an optimizer step "
           "at the largest batch (x hardware.grad_accum_steps)"),
    Metric("search/first_failing_batch", "count", "smallest batch per rank that did not fit"),
    Metric("search/probes", "count", "batch sizes tried"),
    Metric("search/memory_budget_mb", "MB", "the budget a fitting batch stayed under"),
)


def fits(outcome: TrialOutcome, budget_mb: float | None) -> bool:
    """Ran, and (with a budget) peaked within it: device memory on GPU, process RSS on CPU."""
    if not outcome.ok:
        return False
    if budget_mb is None:
        return True
    m = outcome.metrics
    peak = m.get("mem/peak_allocated_mb") or m.get("host/rss_peak_mb")
    return peak is not None and peak <= budget_mb


def with_batch(trial: TrialSpec, batch: int, index: int) -> TrialSpec:
    return derive(trial, rekey=True, index=index, workload={"batch_size": batch},
                  overrides={**trial.overrides, "workload.batch_size": batch})


def largest_batch(group: TrialSpec, spec: LargestBatchSpec,
                  run: Callable[[TrialSpec], TrialOutcome], first_index: int) -> dict[str, Any]:
    """Double from 1, then bisect between the last batch that fit and the first that did not."""
    budget = group.hardware.memory_budget_mb
    probes: dict[int, bool] = {}

    def probe(batch: int) -> bool:
        if batch not in probes:
            trial = with_batch(group, batch, first_index + len(probes))
            probes[batch] = fits(run(trial), budget)
        return probes[batch]

    lo, hi, b = 0, None, 1
    while b <= spec.max_batch:
        if not probe(b):
            hi = b
            break
        lo, b = b, b * 2
    if hi is None:  # everything up to the cap's power of two fit: try the cap itself
        hi = spec.max_batch + 1
        if lo < spec.max_batch and probe(spec.max_batch):
            lo = spec.max_batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return {"largest_batch": lo, "first_failing_batch": hi if hi <= spec.max_batch else None,
            "probes": dict(sorted(probes.items())), "memory_budget_mb": budget}


def search_all(spec: LargestBatchSpec, groups: list[TrialSpec],
               run: Callable[[TrialSpec], TrialOutcome], writer: Any) -> None:
    """Search every grid point in turn; `run` executes a probe and records its row."""
    index = max((g.index for g in groups), default=-1) + 1
    for group in groups:
        start = now()
        result = largest_batch(group, spec, run, index)
        index += len(result["probes"])
        writer.write_search(group, result, start)


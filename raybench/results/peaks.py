"""The compute peak this machine measured, for MFU beside the datasheet's.

Owns the lookup: the latest validation of the same system (`python -m raybench.validate`, its
rows in the history) gives, per precision, the median matmul rate its GPUs reached (rows of a
workload that declares `Workload.measures_peak`, by their `perf/achieved_tflops_per_gpu`), and
a later row states `perf/mfu_measured_pct` against it: how much of what this very machine can
do the workload used, where the datasheet MFU mixes the workload's efficiency with the
machine's distance from its datasheet. Same system: the same `system/fingerprint` (GPU model
and count per node, nodes, CPU model). Read once per sweep; empty where no validation exists.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow.dataset as ds

from raybench.columns import Metric, declare
from raybench.results import history as store

log = logging.getLogger(__name__)

declare(
    Metric("perf/peak_probe", "bool", "the row measured a compute peak (the validate suite's "
           "matmul): later rows' perf/mfu_measured_pct is against it"),
    Metric("perf/measured_peak_tflops", "TFLOP/s", "this system's measured matmul peak at "
           "the row's precision: the median GPU of its latest validation (raybench.validate)"),
    Metric("perf/mfu_measured_pct", "%", "achieved TFLOP/s per GPU over the measured peak "
           "(empty where this system has no validation at this precision)"),
)

ACHIEVED, PRECISION, RUN = "perf/achieved_tflops_per_gpu", "hardware.precision", "run_id"


def latest(history: Any, fingerprint: str | None) -> dict[str, float]:
    """{precision: TFLOP/s} of the newest validation run of this system in the history."""
    if history is None or not fingerprint:
        return {}

    try:
        rows = store.read(history.root, (ds.field("system/fingerprint") == fingerprint)
                          & (ds.field("perf/peak_probe") == True),  # noqa: E712
                          [ACHIEVED, PRECISION, RUN, "status", "recorded_at"])
    except Exception as e:  # no such column yet, no history: no measured peak
        log.debug("no measured peak in the history (%s)", e)
        return {}
    return peaks(rows)


def peaks(rows: Any) -> dict[str, float]:
    """{precision: median TFLOP/s over the GPUs} of the newest run among `rows` (pure)."""
    if rows.empty or not {ACHIEVED, PRECISION, RUN, "status"} <= set(rows.columns):
        return {}
    rows = rows[(rows["status"] == "ok") & rows[ACHIEVED].notna()]
    if rows.empty:
        return {}
    newest = rows.sort_values("recorded_at")[RUN].iloc[-1]
    run = rows[rows[RUN] == newest]
    return {str(p): float(g[ACHIEVED].median()) for p, g in run.groupby(PRECISION)}


def mfu_measured(row: dict[str, Any], measured: dict[str, float]) -> dict[str, Any]:
    """The row's MFU against the measured peak at its precision, where both are known."""
    peak = measured.get(str(row.get(PRECISION)))
    achieved = row.get(ACHIEVED)
    if not peak or achieved is None or row.get("perf/peak_probe"):
        return {}
    return {"perf/measured_peak_tflops": peak, "perf/mfu_measured_pct": 100.0 * achieved / peak}

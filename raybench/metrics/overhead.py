"""A trial's fixed cost: where its wall time outside the measured window went, per phase.

Owns the `overhead/*` columns, from the runner's stamps and every rank's (records.RankRecord
.stamps). Pure. Does not measure anything itself; `bench overhead` prints their medians.
"""

from __future__ import annotations

from typing import Any

from raybench.columns import Metric, declare
from raybench.records import RankRecord

declare(
    Metric("overhead/trial_start_s", "s", "the runner's own start of the trial (Tune's "
           "function trial, the trainer object)"),
    Metric("overhead/train_start_s", "s", "fit start to the last rank's entry: controller, "
           "worker placement and processes, their imports, the process group"),
    Metric("overhead/worker_launch_s", "s", "part of train_start: fit start to the slowest "
           "rank's process starting (controller, placement, the process's launch; 0 for a "
           "process Ray had started before)"),
    Metric("overhead/worker_start_s", "s", "part of train_start: that process's start to the "
           "rank entering its loop (Python, Ray's worker, Ray Train's worker set-up with torch "
           "and the process group, the trial function and raybench loaded)"),
    Metric("overhead/rank_prep_s", "s", "a rank's device, threads and math mode (slowest rank)"),
    Metric("overhead/setup_s", "s", "the workload's model and data (slowest rank)"),
    Metric("overhead/warmup_s", "s", "unmeasured warmup steps (slowest rank)"),
    Metric("overhead/record_s", "s", "measured window's end to rank 0's exit: FLOP count, "
           "trace, gathering the records"),
    Metric("overhead/teardown_s", "s", "rank 0's exit to the fit's return: the worker group "
           "and controller ending"),
    Metric("overhead/handover_s", "s", "a trial after another in one process (a worker "
           "group's later trial): rank 0's exit from the last trial to the runner's word "
           "that its row is written (the outcome's trip, the row, the word's trip)"),
    Metric("overhead/release_s", "s", "that rank's release of the last trial (garbage "
           "collection, CUDA's cache given back) before it enters this one"),
    Metric("overhead/fixed_s", "s", "the trial's wall time minus its measured window"),
)


def fixed_cost(records: list[RankRecord] | list[dict[str, Any]],
               stamps: dict[str, float]) -> dict[str, Any]:
    """Where a trial's time outside its measured window went, in seconds, from the wall-clock
    stamps of the runner (`trial_start`, `fit_start`, `fit_end`) and of every rank. Phases:
    trial_start (the runner's own start of the trial: Tune's function trial, the trainer),
    train_start (Ray Train: controller actor, worker placement and processes, their imports,
    the process group; to the last rank's entry), rank_prep (device, threads, math mode),
    setup (the workload's model and data), warmup, record (FLOP count, trace, gathering the
    records), teardown (the worker group and controller ending). Empty without stamps."""
    records = [RankRecord.of(r) for r in records or []]
    st = [r.stamps for r in records]
    need = ("loop_entry", "setup_start", "setup_end", "measure_end")
    if not records or not all(all(k in s for k in need) for s in st):
        return {}
    rank0 = min(records, key=lambda r: r.rank).stamps
    entry = max(s["loop_entry"] for s in st)
    out: dict[str, Any] = {
        "overhead/rank_prep_s": max(s["setup_start"] - s["loop_entry"] for s in st),
        "overhead/setup_s": max(s["setup_end"] - s["setup_start"] for s in st),
        "overhead/warmup_s": float(max(sum(r.warmup_s) for r in records)),
    }
    if "loop_exit" in rank0:
        out["overhead/record_s"] = rank0["loop_exit"] - max(s["measure_end"] for s in st)
    if "last_exit" in rank0:  # on a GPU a worker group's second trial waited 4.19 s here
        out["overhead/handover_s"] = rank0["handed_over"] - rank0["last_exit"]
        out["overhead/release_s"] = rank0["loop_entry"] - rank0["handed_over"]
    if "fit_start" in stamps:
        out["overhead/train_start_s"] = entry - stamps["fit_start"]
        out.update(_train_start_parts(max(st, key=lambda s: s["loop_entry"]),
                                      stamps["fit_start"]))
        if "trial_start" in stamps:
            out["overhead/trial_start_s"] = stamps["fit_start"] - stamps["trial_start"]
    if "fit_end" in stamps and "loop_exit" in rank0:
        out["overhead/teardown_s"] = stamps["fit_end"] - rank0["loop_exit"]
    if "fit_end" in stamps:
        start = stamps.get("trial_start", stamps.get("fit_start", entry))
        measured = max(sum(r.windows_s) for r in records)
        out["overhead/fixed_s"] = stamps["fit_end"] - start - measured
    return out



TRAIN_START_PARTS = ("overhead/worker_launch_s", "overhead/worker_start_s")


def _train_start_parts(last: dict[str, float], fit_start: float) -> dict[str, float]:
    """train_start split at the slowest rank's process start; the parts add up to
    train_start. (raybench's own import stamp is no finer cut: Ray Train loads the trial
    function, and with it raybench, after the process group, just before the loop.) A process
    Ray started before the fit (a pooled worker) had no launch to wait for."""
    if not last.get("process_start"):
        return {}
    launched = max(last["process_start"], fit_start)
    return {"overhead/worker_launch_s": launched - fit_start,
            "overhead/worker_start_s": last["loop_entry"] - launched}

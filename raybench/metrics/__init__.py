"""Per-rank timings -> one flat dict of `namespace/quantity_unit` metrics for a results row.

Owns the statistics and their definitions: global throughput is the SUM of every rank's own
samples/s (never rank 0 times world size, never a mean), step-time percentiles pool every rank's
measured steps, CV% is std/mean of step time, skew compares the slowest and fastest rank. Pure.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from typing import Any

import numpy as np

from raybench import workloads
from raybench.columns import Metric, declare
from raybench.flops import mfu
from raybench.metrics.gpu import gpu_telemetry
from raybench.records import RankRecord, TrialOutcome

PERCENTILES = (50, 90, 95, 99)
INPUT_BOUND_PCT = 20.0  # waiting for data beyond this share of step time: the input is the limit
SLOW_RANK_PCT = 10.0  # a rank's own compute this far above the median rank's: a slow device
# With repeats, the headline is the mean over windows and its noise is the windows' spread; the
# report's validity check (report/assess.py) and measure.max_repeats's extra windows judge it.
REPEAT_CV_LIMIT_PCT = 5.0
# A row meant for comparison: enough windows for an exact Mann-Whitney test against another
# such row to reach p < 0.05 with a margin (4 is the least that can: compare.py), and windows
# that agreed. Fewer, or windows that never settled: a quick row.
CANONICAL_WINDOWS = 5

declare(
    Metric("train/samples_per_s", "samples/s", "every rank's own rate over its measured "
           "windows, summed"),
    Metric("train/samples_per_s_per_worker", "samples/s", "train/samples_per_s per rank"),
    Metric("train/global_batch_size", "count", "samples per optimizer step, all ranks (batch "
           "x grad_accum_steps x ranks)"),
    Metric("train/world_size", "count", "ranks"),
    Metric("train/step_time_mean_ms", "ms", "step time, every rank's measured steps pooled"),
    Metric("train/step_time_std_ms", "ms", "standard deviation of the pooled step times"),
    Metric("train/step_time_p{q}_ms", "ms", "percentile of the pooled step times (50, 90, 95, "
           "99)"),
    Metric("train/step_time_cv_pct", "%", "step-time std / mean (the validity check's)"),
    Metric("train/compute_time_mean_ms", "ms", "a step's part after its batch is on the device"),
    Metric("train/data_wait_mean_ms", "ms", "a step's wait for its batch"),
    Metric("train/data_wait_pct", "%", "share of step time spent waiting for data"),
    Metric("train/input_bound", "bool", f"data wait above {INPUT_BOUND_PCT:g}% of step time"),
    Metric("train/rank_skew_pct", "%", "slowest rank's mean step over the fastest's, minus 1"),
    Metric("train/repeat_cv_pct", "%", "throughput CV over measure.repeats windows"),
    Metric("train/window_samples_per_s", "samples/s", "each measured window's throughput (all "
           "ranks), a list: what a comparison tests (compare.py)"),
    Metric("train/samples_per_s_ci95_low", "samples/s", "95% confidence interval of the mean "
           "window throughput, lower end (percentile bootstrap over the windows, seeded; three "
           "windows or more)"),
    Metric("train/samples_per_s_ci95_high", "samples/s", "the same interval's upper end"),
    Metric("trial/category", "text", f"canonical: {CANONICAL_WINDOWS} windows or more that "
           f"agree within {REPEAT_CV_LIMIT_PCT:g}% (comparable); quick: fewer, or unsettled"),
    Metric("train/warmup_windows", "count", "windows run before the last measure.repeats, "
           "which agreed only then (measure.max_repeats): counted as warmup"),
    Metric("train/measured_steps", "count", "measured steps per rank"),
    Metric("train/measured_s", "s", "measured windows, longest rank"),
    Metric("train/warmup_s", "s", "warmup steps, longest rank"),
    Metric("train/setup_s", "s", "the workload's set-up, longest rank"),
    Metric("train/loss_final", "score", "rank 0's last loss"),
    Metric("train/loss_finite", "bool", "every rank's last loss is a number"),
    Metric("train/{phase}_mean_ms", "ms", "a step phase (forward, backward, optimizer), mean"),
    Metric("train/{phase}_std_ms", "ms", "a step phase, standard deviation"),
    Metric("train/{phase}_p50_ms", "ms", "a step phase, median"),
    Metric("train/own_compute_median_ms", "ms", "median rank's own forward + backward"),
    Metric("train/own_compute_skew_pct", "%", "slowest rank's own compute over the fastest's"),
    Metric("train/slow_ranks", "text", f"ranks {SLOW_RANK_PCT:g}% above the median's own compute"),
    Metric("train/epochs", "count", "epochs run"),
    Metric("train/train_time_s", "s", "training time of every epoch, evaluation excluded"),
    Metric("train/epoch_times_s", "s", "each epoch's training time (JSON list)"),
    Metric("eval/time_s", "s", "evaluation time of every epoch"),
    Metric("eval/accuracy_metric", "text", "the workload's accuracy column"),
    Metric("perf/headline_metric", "text", "the workload's headline rate column, which the "
           "report ranks by (empty: train/samples_per_s)"),
    Metric("perf/datasheet_metric", "text", "a hardware probe's column holding the datasheet "
           "figure for its headline rate (empty: none)"),
    Metric("perf/size_axis", "text", "the workload's size axis, a config column the report "
           "draws throughput and memory against"),
    Metric("mem/peak_allocated_mb", "MB", "device memory peak allocated by tensors, any rank"),
    Metric("mem/peak_reserved_mb", "MB", "device memory peak held by the allocator, any rank"),
    Metric("mem/allocated_mb", "MB", "device memory allocated at the window's end, any rank"),
    Metric("mem/reserved_mb", "MB", "device memory reserved at the window's end, any rank"),
    Metric("host/rss_peak_mb", "MB", "peak resident memory of a rank process"),
    Metric("host/cpu_util_pct", "%", "CPU time of a rank process over the window (100 = one "
           "core), mean of ranks"),
    Metric("host/minor_faults_per_s", "faults/s", "minor page faults of a rank process over the "
           "window, the most of any rank: memory the heap gave back to the OS and touched again "
           "(each costs a kernel entry and a zeroed page)"),
    Metric("host/run_wait_pct", "%", "time a rank process's threads were ready to run but "
           "waited for a core, over the window (100 = one thread the whole window; Linux "
           "schedstat), the most of any rank: other processes' work on the rank's cores, or "
           "more threads than cores"),
    Metric("host/heap", "text", "the ranks' malloc: fixed (glibc's trim and mmap thresholds "
           "fixed by raybench, memory.steady_heap), user (the environment tunes glibc's "
           "malloc), other (not glibc)"),
    Metric("host/niceness", "count", "the rank processes' nice value, the highest of any "
           "rank: above 0, a rank yields its cores to the machine's other processes (Ray "
           "starts its workers at 15 unless RAY_worker_niceness says otherwise)"),
    Metric("model/params_m", "M", "parameters, millions"),
    Metric("model/size_mb", "MB", "parameters and buffers"),
    Metric("cluster/nodes_used", "count", "distinct nodes the ranks ran on"),
    Metric("cluster/rank_nodes", "text", "each rank's node, in rank order"),
    Metric("cluster/rank_gpus", "text", "each rank's GPU ids, in rank order"),
    Metric("cluster/nccl_net", "text", "the network NCCL chose: IB, IB/RoCE, Socket (TCP), AWS "
           "Libfabric (EFA), ...; empty without NCCL"),
    Metric("perf/gflops_per_sample", "GFLOP", "work of one sample of a step (forward, plus "
           "backward when training)"),
    Metric("perf/achieved_tflops_per_gpu", "TFLOP/s", "FLOPs per second per GPU (per rank "
           "on CPU)"),
    Metric("perf/mfu_pct", "%", "achieved over the device's dense peak at this precision"),
)


Records = list[RankRecord] | list[dict[str, Any]]


def outcome(records: Records | None) -> TrialOutcome:
    """A finished trial's outcome from rank 0's gathered records."""
    if not records:
        return TrialOutcome.failed("error", "rank 0 returned no measurements")
    records = [RankRecord.of(r) for r in records]
    return TrialOutcome(status="ok", metrics=summarize(records), ranks=per_rank_table(records),
                        records=[r.to_dict() for r in records])


def summarize(records: Records) -> dict[str, Any]:
    """Metrics of one trial from every rank's record (see rank/loop.py)."""
    records = sorted((RankRecord.of(r) for r in records), key=lambda r: r.rank)
    out: dict[str, Any] = {"device": device_column(r.device_name for r in records),
                           **_timing(records), **_resources(records), **_phases(records)}
    out["train/input_bound"] = out["train/data_wait_pct"] > INPUT_BOUND_PCT
    out.update(_perf(records[0], out["train/samples_per_s_per_worker"]))
    out.update(gpu_telemetry(records))
    out.update(own_compute(records))
    out.update(epoch_metrics(records[0].epochs))
    if records[0].workload:  # the workload's own figures (records of older runs lack it)
        out.update(_workload_figures(records, out))
    return out


def _timing(records: list[RankRecord]) -> dict[str, Any]:
    """The steps' times and the trial's throughput, summed over its ranks."""
    step_ms = np.concatenate([_step_ms(r) for r in records])
    wait_ms = np.concatenate([np.asarray(r.wait_s) * 1e3 for r in records])
    compute_ms = np.concatenate([np.asarray(r.compute_s) * 1e3 for r in records])
    per_rank = [_rank_throughput(r) for r in records]
    repeats = _repeat_throughputs(records)
    rank_means = [float(_step_ms(r).mean()) for r in records]
    mean = float(step_ms.mean())
    std = float(step_ms.std(ddof=1)) if step_ms.size > 1 else 0.0
    first = records[0]
    return {
        "train/samples_per_s": float(sum(per_rank)),
        "train/samples_per_s_per_worker": float(sum(per_rank) / len(per_rank)),
        "train/global_batch_size": int(sum(r.samples_per_step for r in records)),
        "train/world_size": len(records),
        "train/step_time_mean_ms": mean,
        "train/step_time_std_ms": std,
        **{f"train/step_time_p{q}_ms": float(np.percentile(step_ms, q)) for q in PERCENTILES},
        "train/step_time_cv_pct": 100.0 * std / mean if mean > 0 else None,
        "train/compute_time_mean_ms": float(compute_ms.mean()),
        "train/data_wait_mean_ms": float(wait_ms.mean()),
        "train/data_wait_pct": 100.0 * float(wait_ms.sum() / step_ms.sum()),
        "train/rank_skew_pct": 100.0 * (max(rank_means) / min(rank_means) - 1.0),
        "train/repeat_cv_pct": cv_pct(repeats),
        "train/window_samples_per_s": [float(x) for x in repeats],
        "trial/category": category(repeats),  # the interval: with_interval, in the driver
        "train/warmup_windows": first.warmup_windows,
        "train/measured_steps": int(len(first.compute_s)),
        "train/measured_s": float(max(sum(r.windows_s) for r in records)),
        "train/warmup_s": float(max(sum(r.warmup_s) for r in records)),
        "train/setup_s": float(max(r.setup_s for r in records)),
        "train/loss_final": first.loss_final,
        "train/loss_finite": loss_finite(records),
    }


def _resources(records: list[RankRecord]) -> dict[str, Any]:
    """Memory, the host's figures, the model's size and where the ranks ran."""
    first = records[0]
    return {
        "mem/peak_allocated_mb": _max(records, "peak_allocated_mb"),
        "mem/peak_reserved_mb": _max(records, "peak_reserved_mb"),
        "mem/allocated_mb": _max(records, "allocated_mb"),
        "mem/reserved_mb": _max(records, "reserved_mb"),
        "host/rss_peak_mb": _max(records, "rss_peak_mb"),
        # 100 = one core busy, per rank process
        "host/cpu_util_pct": float(np.mean([r.cpu_util_pct for r in records]))
        if all(r.cpu_util_pct is not None for r in records) else None,
        "host/minor_faults_per_s": _max(records, "minor_faults_per_s"),
        "host/run_wait_pct": _max(records, "run_wait_pct"),
        "host/heap": ",".join(sorted({r.heap for r in records if r.heap})) or None,
        "host/niceness": _max(records, "niceness"),
        "model/params_m": first.params / 1e6,
        # where the ranks ran: distinct nodes, and each rank's node/GPU in rank order
        "cluster/nodes_used": len({r.node_id or r.hostname for r in records}),
        "cluster/rank_nodes": ",".join(str(r.node_ip or r.hostname) for r in records),
        "cluster/rank_gpus": ",".join("+".join(r.accelerator_ids or []) or "-"
                                      for r in records),
        "model/size_mb": first.model_size_mb,
        "cluster/nccl_net": first.nccl_net,
    }


def _phases(records: list[RankRecord]) -> dict[str, float]:
    """Each timed part of a step (clock.phase) over every rank's steps."""
    out = {}
    for name in sorted({n for r in records for n in r.phase_s}):
        ms = np.concatenate([np.asarray(r.phase_s.get(name, [])) * 1e3 for r in records])
        out[f"train/{name}_mean_ms"] = float(ms.mean())
        out[f"train/{name}_std_ms"] = float(ms.std(ddof=1)) if ms.size > 1 else 0.0
        out[f"train/{name}_p50_ms"] = float(np.median(ms))
    return out


def _perf(first: RankRecord, per_worker: float) -> dict[str, Any]:
    """FLOPs per sample, TFLOP/s per GPU and MFU against the datasheet's peak."""
    # per GPU: ranks sharing one (hardware.ranks_per_gpu) add up to its rate
    achieved, util = mfu(first.flops_per_sample, per_worker * first.ranks_per_gpu,
                         first.device_name, first.precision)
    return {
        "perf/gflops_per_sample": (first.flops_per_sample / 1e9
                                   if first.flops_per_sample else None),
        "perf/achieved_tflops_per_gpu": achieved,  # per GPU, or per rank on CPU
        "perf/mfu_pct": 100.0 * util if util is not None else None,
    }


def _workload_figures(records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
    """What the trial's workload declares of itself, and its own row metrics."""
    cls = workloads.get(records[0].workload)
    out = {"eval/accuracy_metric": cls.accuracy_metric,
           "perf/headline_metric": cls.headline_metric,
           "perf/datasheet_metric": cls.datasheet_metric}
    if cls.measures_peak:
        out["perf/peak_probe"] = True
    out["perf/size_axis"] = cls.size_axis
    out.update(cls.row_metrics(records, {**row, **out}))
    return out


def device_column(names: Iterable[str]) -> str:
    """What the row ran on, as the tile suites log it ("NVIDIA H100 80GB HBM3"; "cpu"): the
    distinct device names of its ranks or replicas, so a mixed-GPU trial shows as mixed."""
    return ",".join(sorted(set(names)))


def own_compute(records: Records) -> dict[str, Any]:
    """Each DDP rank's own forward + backward (median per step), apart from waiting for the
    others: DDP's all-reduce makes step times equal, so only this shows a slow device. Ranks
    more than SLOW_RANK_PCT above the median rank are named. Empty without DDP training."""
    records = [RankRecord.of(r) for r in records]
    own = {r.rank: float(np.median(r.own_s)) * 1e3 for r in records if r.own_s}
    if len(own) < 2 or len(own) != len(records):
        return {}
    median = float(np.median(list(own.values())))
    slow = [rank for rank, ms in sorted(own.items()) if ms > median * (1 + SLOW_RANK_PCT / 100)]
    return {"train/own_compute_median_ms": median,
            "train/own_compute_skew_pct": 100.0 * (max(own.values()) / min(own.values()) - 1),
            "train/slow_ranks": ",".join(map(str, slow))}


def loss_finite(records: Records) -> bool | None:
    """Whether every rank's last loss is a number (None: the workload has no loss). Kept as its
    own column because the results file stores nan/inf as null, which reads as "no loss"; a
    diverged run's step times are real, but they are not the times of a training run."""
    records = [RankRecord.of(r) for r in records]
    losses = [r.loss_final for r in records if r.loss_final is not None]
    epochs = [e["loss"] for r in records for e in r.epochs or []
              if e.get("loss") is not None]
    if not losses and not epochs:
        return None
    return all(math.isfinite(v) for v in losses + epochs)


def epoch_metrics(epochs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An epoch-based run: training time, epoch times, and the LAST epoch's accuracy figures
    (the honest ones: picking the best epoch on validation data flatters them; a workload may
    add its best epoch beside them through `row_metrics`)."""
    if not epochs:
        return {}
    last = epochs[-1]
    out: dict[str, Any] = {
        "train/epochs": len(epochs),
        "train/train_time_s": float(sum(e["train_s"] for e in epochs)),
        "train/epoch_times_s": json.dumps([round(e["train_s"], 3) for e in epochs]),
        "eval/time_s": float(sum(e["eval_s"] for e in epochs)),
    }
    out.update({k: v for k, v in last.items() if "/" in k and k != "eval/seconds"})
    return out


def per_rank_table(records: Records) -> list[dict[str, Any]]:
    """Where each rank ran and how fast: for spotting slow nodes and GPUs."""
    records = [RankRecord.of(r) for r in records]
    return [
        {
            "rank": r.rank, "node_rank": r.node_rank, "local_rank": r.local_rank,
            "hostname": r.hostname, "node_id": r.node_id, "node_ip": r.node_ip,
            "accelerator_ids": ",".join(r.accelerator_ids or []),
            "device": r.device, "device_name": r.device_name,
            "samples_per_s": _rank_throughput(r),
            "step_time_mean_ms": float(_step_ms(r).mean()),
            "data_wait_mean_ms": float(np.mean(r.wait_s) * 1e3),
            "own_compute_ms": float(np.median(r.own_s)) * 1e3 if r.own_s else None,
        }
        for r in sorted(records, key=lambda r: r.rank)
    ]


def _step_ms(r: RankRecord) -> np.ndarray:
    return (np.asarray(r.wait_s) + np.asarray(r.compute_s)) * 1e3


def _rank_throughput(r: RankRecord) -> float:
    """Samples this rank processed over the wall time of its measured windows."""
    samples = r.samples_per_step * len(r.compute_s)
    return samples / sum(r.windows_s)


def _repeat_throughputs(records: list[RankRecord]) -> list[float]:
    n = len(records[0].windows_s)
    return [
        sum(r.samples_per_step * (r.window_steps or [r.steps_per_window] * n)[i]
            / r.windows_s[i] for r in records)
        for i in range(n)
    ]


def category(windows: list[float]) -> str:
    """canonical or quick (CANONICAL_WINDOWS)."""
    cv = cv_pct(windows)
    settled = cv is not None and cv <= REPEAT_CV_LIMIT_PCT
    return "canonical" if len(windows) >= CANONICAL_WINDOWS and settled else "quick"


def with_interval(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` with the 95% interval of the mean window throughput, where it has windows.
    Computed where the row is made (the driver, once scipy is loaded there), not in the
    ranks: scipy.stats takes a second to import in every fresh rank process."""
    windows = metrics.get("train/window_samples_per_s")
    if windows is None or "train/samples_per_s_ci95_low" in metrics:
        return metrics
    low, high = ci95([float(w) for w in windows])
    return {**metrics, "train/samples_per_s_ci95_low": low,
            "train/samples_per_s_ci95_high": high}


def ci95(values: list[float]) -> tuple[float | None, float | None]:
    """95% percentile-bootstrap interval of the mean of `values` (seeded: a row's interval is
    reproducible); (None, None) below three values, where resampling has nothing to say."""
    if len(values) < 3 or len(set(values)) < 2:
        return (None, None) if len(values) < 3 else (float(values[0]), float(values[0]))
    from scipy.stats import bootstrap  # scipy.stats: only for rows with windows to bootstrap

    res = bootstrap((np.asarray(values),), np.mean, confidence_level=0.95, n_resamples=2000,
                    method="percentile", random_state=np.random.default_rng(0))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def cv_pct(values: list[float]) -> float | None:
    """Standard deviation over mean, in percent; None for fewer than two values."""
    if len(values) < 2:
        return None
    return 100.0 * statistics.stdev(values) / statistics.mean(values)


def _max(records: list[RankRecord], key: str) -> float | None:
    values = [getattr(r, key) for r in records if getattr(r, key) is not None]
    return float(max(values)) if values else None

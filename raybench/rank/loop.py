"""The per-rank timed loop: build the workload, discard warmup, time steps, return the record.

Owns measurement correctness: the device is synchronised inside the timed region, data wait
(next batch + host-to-device copy) is timed apart from compute, warmup is excluded by
construction, and every rank runs the same number of steps (a time window is turned into a step
count once, agreed across ranks). Two window loops, one per `measure.sync`: `step` synchronises
after each step's data and compute; `window` only at the window's ends, step times then coming
from marks (CUDA events) recorded between steps. The step clock (clock.py) is the loop's: made
here per trial, handed to the workload for its phases. Does not own process groups (the
runners) nor the statistics (metrics/). Ray-free, so it runs in-process on a GPU machine
without Ray.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raybench import process, workloads
from raybench.clock import StepClock
from raybench.context import WorkerContext, check_env
from raybench.memory import reset_peak_rss, steady_heap
from raybench.metrics import REPEAT_CV_LIMIT_PCT, cv_pct
from raybench.rank.epochs import run_epochs
from raybench.rank.record import memory, rank_record
from raybench.records import RankRecord
from raybench.telemetry import open_sampler
from raybench.trials import TrialSpec


def run_worker(trial: TrialSpec, ctx: WorkerContext) -> list[RankRecord] | None:
    """Run one trial on this rank; rank 0 returns every rank's record, other ranks None."""
    record = measure_rank(trial, ctx)
    return ctx.gather(record)


@dataclass(frozen=True)
class Steps:
    """What a trial's steps run with on this rank: its workload, the workload's endless
    batches, the loop's clock and the rank's context."""

    workload: workloads.Workload
    batches: Iterator[Any]
    clock: StepClock
    ctx: WorkerContext


def measure_rank(trial: TrialSpec, ctx: WorkerContext) -> RankRecord:
    """This rank's part of a trial: the workload built afresh, warmup, the measured windows (or
    epochs), then its record."""
    heap = _prepare(trial, ctx)
    clock = StepClock(ctx.device)
    workload = workloads.get(trial.workload_name)(trial.workload, ctx, clock)
    stamps = {**ctx.stamps, "setup_start": time.time()}
    t_setup = time.perf_counter()
    workload.setup()
    s = Steps(workload, workload.batches(), clock, ctx)
    setup_s = time.perf_counter() - t_setup
    stamps["setup_end"] = time.time()

    m = trial.measure
    sampler = open_sampler(ctx.device.index or 0) if ctx.is_cuda else None
    if workload.epoch_based:
        if sampler:
            sampler.start()  # the whole training run: epochs are the measurement
        before = process.usage()
        run = run_epochs(workload, ctx, clock, m.warmup_steps, lambda: _timed_step(s))
    else:
        warm = [_timed_step(s) for _ in range(m.warmup_steps)]
        steps = m.measure_steps or _steps_for_window(m.measure_seconds, warm, ctx)
        clock.clear()  # warmup's phase and own-compute times are not measurements
        if sampler:
            sampler.start()  # the measured window only: warmup and set-up are not steady state
        before = process.usage()
        run = _run_windows(s, steps, m.repeats, m.max_repeats, m.sync)
        run["warm"] = warm + run["warm"]  # windows that became warmup come after the steps
        if run["warmup_windows"]:  # CPU time, faults and telemetry of the kept windows only
            before = run["kept_from"]
    run["usage"] = process.window_usage(before, process.usage())
    stamps["measure_end"] = time.time()
    telemetry = sampler.stop() if sampler else []
    if run.get("warmup_windows"):
        telemetry = [t for t in telemetry if t["t"] >= run["kept_from"]["t"]]
    run.update(telemetry=telemetry, uuid=sampler.uuid if sampler else None, heap=heap,
               setup_s=setup_s)
    # the unmeasured extras, in this order: memory before tracing and FLOP counting (not the
    # workload's), the epochs' last own-compute marks, then the profiled steps
    run["memory"] = memory(ctx)
    clock.settle()
    run["phase_s"] = {k: list(v) for k, v in clock.phase_s.items()}
    run["own_s"] = list(clock.own_s)
    run["trace"] = _profile(s, trial.measure.profile_steps)
    return rank_record(trial, ctx, workload, run, stamps)


def _prepare(trial: TrialSpec, ctx: WorkerContext) -> str:
    """The rank's device, threads, heap and math mode, set for this trial whatever ran in this
    process before; returns the heap's kind (memory.steady_heap)."""
    check_env(trial.hardware.env)
    if not ctx.is_cuda:
        # As many intra-op threads as logical CPUs reserved: Ray's OMP_NUM_THREADS rule for
        # its workers, applied here too so the in-process runner measures the same thing.
        torch.set_num_threads(max(1, int(trial.hardware.cpus_per_worker)))
    if ctx.is_cuda:
        torch.cuda.set_device(ctx.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    heap = steady_heap()  # before the workload allocates: the same heap in every process
    reset_peak_rss()
    ctx.set_math_mode()
    if ctx.is_cuda:
        # the budget is a hard cap on GPU (allocations beyond it raise out-of-memory); set on
        # every trial, so a budget never outlives its trial in an in-process runner
        total = torch.cuda.get_device_properties(ctx.device).total_memory / 2**20
        budget = trial.hardware.memory_budget_mb
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, budget / total) if budget else 1.0, ctx.device)
    return heap


def _run_windows(s: Steps, steps: int, repeats: int, most: int | None = None,
                 sync: str = "step") -> dict[str, Any]:
    """`repeats` windows of `steps` timed steps each, timed by `sync`'s loop; with `most`
    (measure.max_repeats), more while the last `repeats` disagree by more than the validity
    limit, up to `most` windows in all. The windows before the last `repeats` are then warmup
    ("warm", as _timed_step's tuples): a slow start (a clock ramping up, a neighbour's burst)
    was not yet the steady state the row reports. Every rank runs the same windows: the
    decision is on the trial's throughput per window, summed over the ranks as the row's
    repeat CV sums it."""
    window = _mark_window if sync == "window" else _step_window
    most = max(most or 0, repeats) if repeats > 1 else 1  # one window agrees with nothing
    out: dict[str, Any] = {"wait_s": [], "compute_s": [], "windows_s": [], "loss": None}
    rates, kept, starts = [], [], []  # per window: throughput (all ranks), times kept before
    for _ in range(most):
        kept.append(s.clock.counts())
        s.ctx.barrier()  # ranks start each window together, so the windows overlap
        # its start on the clocks of CPU time, faults and GPU telemetry samples
        starts.append({**process.usage(), "t": time.monotonic()})
        waits, compute, seconds, out["loss"] = window(s, steps)
        out["wait_s"] += waits
        out["compute_s"] += compute
        out["windows_s"].append(seconds)
        s.clock.settle()  # phase and own-compute marks, read once the window is timed
        if most > repeats:
            rates.append(s.ctx.all_reduce_sum(s.workload.samples_per_step() * steps / seconds))
            if len(rates) >= repeats and cv_pct(rates[-repeats:]) <= REPEAT_CV_LIMIT_PCT:
                break
    return _keep_last(out, s.clock, steps, repeats, kept, starts)


def _step_window(s: Steps, steps: int) -> tuple[list[float], list[float], float, Any]:
    """`sync: step`: the device synchronised after each step's data and after its compute,
    each timed on its own, as `_timed_step` times a step (written out here so that a rank's
    way from its entry to the workload's step stays short). (waits, computes, seconds, loss)"""
    waits, compute, loss = [], [], None
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = s.workload.to_device(next(s.batches))
        s.clock.synchronize()
        t1 = time.perf_counter()
        loss = s.workload.step(batch)
        s.clock.synchronize()
        compute.append(time.perf_counter() - t1)
        waits.append(t1 - t0)
        s.clock.end_step()
    return waits, compute, time.perf_counter() - start, loss


def _mark_window(s: Steps, steps: int) -> tuple[list[float], list[float], float, Any]:
    """`sync: window`: the device synchronised once, at the window's end, so the host runs
    ahead as in a training job. A step's time is the timeline between its mark and the next
    (the device's, on a GPU: it holds the input copy, the compute and any wait for the host,
    so stalls still show), its data wait the host's time to get and enqueue the batch (at most
    the step), its compute the rest. On CPU both loops give the same."""
    marks, waits, loss = [], [], None
    start = time.perf_counter()
    with s.clock.marking():
        for _ in range(steps):
            marks.append(s.clock.mark())
            t0 = time.perf_counter()
            batch = s.workload.to_device(next(s.batches))
            t1 = time.perf_counter()
            loss = s.workload.step(batch)
            waits.append(t1 - t0)
            s.clock.end_step()
        marks.append(s.clock.mark())
        s.clock.synchronize()
    seconds = time.perf_counter() - start
    step_s = [s.clock.seconds(a, b) for a, b in zip(marks, marks[1:], strict=False)]
    waits = [min(w, t) for w, t in zip(waits, step_s, strict=True)]
    return waits, [t - w for t, w in zip(step_s, waits, strict=True)], seconds, loss


def _keep_last(out: dict[str, Any], clock: StepClock, steps: int, repeats: int,
               kept: list, starts: list[dict[str, float]]) -> dict[str, Any]:
    """The last `repeats` windows are the measurement; the steps of any before them become
    warmup, and their phase and own-compute times are dropped."""
    extra = len(out["windows_s"]) - repeats
    cut = extra * steps
    out["warm"] = list(zip(out["wait_s"][:cut], out["compute_s"][:cut], [None] * cut,
                           strict=True))
    del out["wait_s"][:cut], out["compute_s"][:cut], out["windows_s"][:extra]
    clock.drop(kept[extra])
    out["window_steps"] = [steps] * repeats
    out["warmup_windows"], out["kept_from"] = extra, starts[extra]
    return out


def _timed_step(s: Steps) -> tuple[float, float, Any]:
    """One step outside the measured windows (warmup, epochs, profiled steps), with the device
    synchronised around its data and its compute as `_step_window` does: (data wait, compute,
    loss)."""
    t0 = time.perf_counter()
    batch = s.workload.to_device(next(s.batches))
    s.clock.synchronize()
    t1 = time.perf_counter()
    loss = s.workload.step(batch)
    s.clock.synchronize()
    done = time.perf_counter()
    s.clock.end_step()
    return t1 - t0, done - t1, loss


def _profile(s: Steps, steps: int) -> str | None:
    """Extra steps after the measured windows, traced on rank 0: the trace costs time, so it
    never overlaps a measurement. Every rank runs them, as DDP steps are collective."""
    if not steps:
        return None
    ctx = s.ctx
    tracing = ctx.rank == 0 and ctx.trace_path is not None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) if tracing else contextlib.nullcontext() \
            as prof:
        for _ in range(steps):
            _timed_step(s)
    if not tracing:
        return None
    Path(ctx.trace_path).parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(ctx.trace_path)
    return ctx.trace_path


def _steps_for_window(seconds: float, warm: list, ctx: WorkerContext) -> int:
    """Turn a time window into a step count from the later warmup steps, the same on all ranks."""
    tail = sorted(w + c for w, c, _ in warm[len(warm) // 2:])
    median = tail[len(tail) // 2]
    return max(1, int(ctx.all_reduce_max(math.ceil(seconds / max(median, 1e-6)))))

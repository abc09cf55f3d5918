"""The per-rank timed loop: build the workload, discard warmup, time steps, gather every rank.

Owns measurement correctness: the device is synchronised inside the timed region, data wait
(next batch + host-to-device copy) is timed apart from compute, warmup is excluded by
construction, and every rank runs the same number of steps (a time window is turned into a step
count once, agreed across ranks). With `measure.sync: window` the device is synchronised only
at a window's ends and step times come from marks (CUDA events) recorded between steps. Does
not own process groups (trial.py, bench.py) nor the statistics (metrics.py). Ray-free, so it
runs in-process on a GPU machine without Ray.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from raybench import fabric, workloads
from raybench.context import WorkerContext
from raybench.memory import peak_rss_mb, reset_peak_rss, steady_heap
from raybench.metrics import REPEAT_CV_LIMIT_PCT, cv_pct
from raybench.records import RankRecord
from raybench.telemetry import aggregate, open_sampler
from raybench.trials import TrialSpec

log = logging.getLogger(__name__)


def run_worker(trial: TrialSpec, ctx: WorkerContext) -> list[RankRecord] | None:
    """Run one trial on this rank; rank 0 returns every rank's record, other ranks None."""
    record = measure_rank(trial, ctx)
    return ctx.gather(record)


def _nccl_network(ctx: WorkerContext) -> str | None:
    """The network NCCL chose, from this rank's NCCL debug file (removed once read)."""
    if not (ctx.is_cuda and ctx.distributed):
        return None
    net = fabric.read_network()
    path = fabric.own_log()
    if path is not None:
        path.unlink(missing_ok=True)
    return net


def check_env(env: dict[str, str]) -> None:
    """The trial's `hardware.env` must be this process's environment: the runner sets it when
    the process starts (CUDA and NCCL read it once), and a row must not claim a setting the
    run did not have."""
    wrong = {k: os.environ.get(k) for k, v in env.items() if os.environ.get(k) != v}
    if wrong:
        raise RuntimeError(f"hardware.env did not reach this worker: {wrong} instead of "
                           f"{ {k: env[k] for k in wrong} }")


def measure_rank(trial: TrialSpec, ctx: WorkerContext) -> RankRecord:
    """This rank's part of a trial: the workload built afresh, warmup, the measured windows (or
    epochs), then its record."""
    heap = _prepare(trial, ctx)
    workload = workloads.get(trial.workload_name)(trial.workload, ctx)
    stamps = {**ctx.stamps, "setup_start": time.time()}
    t_setup = time.perf_counter()
    workload.setup()
    batches = workload.batches()
    setup_s = time.perf_counter() - t_setup
    stamps["setup_end"] = time.time()

    m = trial.measure
    sampler = open_sampler(ctx.device.index or 0) if ctx.is_cuda else None
    if workload.epoch_based:
        if sampler:
            sampler.start()  # the whole training run: epochs are the measurement
        before = _usage()
        run = _run_epochs(workload, batches, ctx, m.warmup_steps)
    else:
        warm = [_timed_step(workload, batches, ctx) for _ in range(m.warmup_steps)]
        steps = m.measure_steps or _steps_for_window(m.measure_seconds, warm, ctx)
        ctx.clear_measurements()  # warmup's phase and own-compute times are not measurements
        if sampler:
            sampler.start()  # the measured window only: warmup and set-up are not steady state
        before = _usage()
        ctx.sync = m.sync  # warmup and the profiled steps after the windows stay per-step
        try:
            run = _run_windows(workload, batches, ctx, steps, m.repeats, m.max_repeats)
        finally:
            ctx.sync = "step"
        run["warm"] = warm + run["warm"]  # windows that became warmup come after the steps
        if run["warmup_windows"]:  # CPU time, faults and telemetry of the kept windows only
            before = run["kept_from"]
    run["usage"] = _window_usage(before, _usage())
    stamps["measure_end"] = time.time()
    telemetry = sampler.stop() if sampler else []
    if run.get("warmup_windows"):
        telemetry = [s for s in telemetry if s["t"] >= run["kept_from"]["t"]]
    run.update(telemetry=telemetry, uuid=sampler.uuid if sampler else None, heap=heap,
               setup_s=setup_s)
    return _record(trial, ctx, workload, batches, run, stamps)


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


def _record(trial: TrialSpec, ctx: WorkerContext, workload: workloads.Workload, batches: Any,
            run: dict[str, Any], stamps: dict[str, float]) -> RankRecord:
    """The rank's record of a measured trial (`run`: what measure_rank gathered), after the
    unmeasured extras: memory figures, the profiled steps, the FLOP count."""
    memory = _memory(ctx)  # before tracing and FLOP counting, which are not the workload's
    ctx.settle_marks()  # epochs: their steps' own-compute marks
    phases = {k: list(v) for k, v in ctx.phase_s.items()}  # ...nor are their phase times
    own = list(ctx.own_s)
    trace = _profile(workload, batches, ctx, trial.measure.profile_steps)
    model = workload.model
    size_b = sum(p.numel() * p.element_size() for p in model.parameters())
    size_b += sum(b.numel() * b.element_size() for b in model.buffers())
    warm, compute_s, loss = run["warm"], run["compute_s"], run["loss"]
    return RankRecord(
        workload=trial.workload_name,
        rank=ctx.rank,
        local_rank=ctx.local_rank,
        node_rank=ctx.node_rank,
        hostname=socket.gethostname(),
        node_id=ctx.node_id or socket.gethostname(),
        node_ip=ctx.node_ip,
        accelerator_ids=ctx.accelerator_ids,
        nccl_net=_nccl_network(ctx),
        pid=os.getpid(),
        device=str(ctx.device),
        device_name=torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu",
        steps_per_window=run["window_steps"][0],
        window_steps=run["window_steps"],
        warmup_windows=run.get("warmup_windows", 0),
        epochs=run.get("epochs"),
        samples_per_step=workload.samples_per_step(),
        warmup_s=[w + c for w, c, _ in warm],
        wait_s=run["wait_s"],
        compute_s=compute_s,
        windows_s=run["windows_s"],
        phase_s=phases,
        own_s=own,
        setup_s=run["setup_s"],
        loss_final=None if loss is None else float(loss.float().item()),
        params=sum(p.numel() for p in model.parameters()),
        model_size_mb=size_b / 2**20,
        **memory,
        describe=workload.describe(),
        precision=trial.hardware.precision,
        ranks_per_gpu=trial.hardware.ranks_per_gpu,
        **run["usage"],
        heap=run["heap"], niceness=os.nice(0),
        telemetry=run["telemetry"],
        trace=trace,
        gpu=aggregate(run["telemetry"], workload.samples_per_step() * len(compute_s),
                      run["uuid"]),
        flops_per_sample=_flops(workload) if ctx.rank == 0 else None,
        stamps={**stamps, "record_end": time.time()},
    )


def _run_windows(workload: workloads.Workload, batches: Any, ctx: WorkerContext, steps: int,
                 repeats: int, most: int | None = None) -> dict[str, Any]:
    """`repeats` windows of `steps` timed steps each; with `most` (measure.max_repeats), more
    while the last `repeats` disagree by more than the validity limit, up to `most` windows in
    all. The windows before the last `repeats` are then warmup ("warm", as _timed_step's
    tuples): a slow start (a clock ramping up, a neighbour's burst) was not yet the steady
    state the row reports. Every rank runs the same windows: the decision is on the trial's
    throughput per window, summed over the ranks as the row's repeat CV sums it.

    The steps are run here, not through a helper, so that a rank's way from its entry to the
    workload's step stays two functions deep (measure_rank, this). With `sync: step` each step
    is `_timed_step`'s timing. With `sync: window` the device syncs once, at the window's end,
    so the host runs ahead as in a training job: a step's time is the timeline between its
    mark and the next (the device's, on a GPU: it holds the input copy, the compute and any
    wait for the host, so stalls still show), its data wait the host's time to get and
    enqueue the batch (at most the step), its compute the rest. On CPU both give the same."""
    most = max(most or 0, repeats) if repeats > 1 else 1  # one window agrees with nothing
    out: dict[str, Any] = {"wait_s": [], "compute_s": [], "windows_s": [], "loss": None}
    rates, kept, starts = [], [], []  # per window: throughput (all ranks), times kept before
    per_step = ctx.sync == "step"
    for _ in range(most):
        kept.append(ctx.measured_counts())
        ctx.barrier()  # ranks start each window together, so the windows overlap
        # its start on the clocks of CPU time, faults and GPU telemetry samples, and the windows'
        starts.append({**_usage(), "t": time.monotonic()})
        start, marks, waits = starts[-1]["wall"], [], []
        for _ in range(steps):
            if not per_step:
                marks.append(ctx.mark())
            t0 = time.perf_counter()
            batch = workload.to_device(next(batches))
            if per_step:
                ctx.synchronize()
            t1 = time.perf_counter()
            out["loss"] = workload.step(batch)
            if per_step:
                ctx.synchronize()
                out["compute_s"].append(time.perf_counter() - t1)
            waits.append(t1 - t0)
            ctx.end_step()
        if not per_step:
            marks.append(ctx.mark())
            ctx.synchronize()
        out["windows_s"].append(time.perf_counter() - start)
        if not per_step:  # the marks are read once the window is timed
            step_s = [ctx.seconds(a, b) for a, b in zip(marks, marks[1:], strict=False)]
            waits = [min(w, s) for w, s in zip(waits, step_s, strict=True)]
            out["compute_s"] += [s - w for s, w in zip(step_s, waits, strict=True)]
        out["wait_s"] += waits
        ctx.settle_marks()  # phase and own-compute marks, read once the window is timed
        if most > repeats:
            rates.append(ctx.all_reduce_sum(workload.samples_per_step() * steps
                                            / out["windows_s"][-1]))
            if len(rates) >= repeats and cv_pct(rates[-repeats:]) <= REPEAT_CV_LIMIT_PCT:
                break
    return _keep_last(out, ctx, steps, repeats, kept, starts)


def _keep_last(out: dict[str, Any], ctx: WorkerContext, steps: int, repeats: int,
               kept: list, starts: list[dict[str, float]]) -> dict[str, Any]:
    """The last `repeats` windows are the measurement; the steps of any before them become
    warmup, and their phase and own-compute times are dropped."""
    extra = len(out["windows_s"]) - repeats
    cut = extra * steps
    out["warm"] = list(zip(out["wait_s"][:cut], out["compute_s"][:cut], [None] * cut,
                           strict=True))
    del out["wait_s"][:cut], out["compute_s"][:cut], out["windows_s"][:extra]
    ctx.drop_measured(kept[extra])
    out["window_steps"] = [steps] * repeats
    out["warmup_windows"], out["kept_from"] = extra, starts[extra]
    return out


def _run_epochs(workload: workloads.Workload, batches: Any, ctx: WorkerContext,
                warmup: int) -> dict[str, Any]:
    """Every epoch of an epoch-based workload: each epoch is one window (the first one without
    its `warmup` steps, which train but are not measured), then `end_epoch` outside the timing."""
    epochs = workload.params.epochs
    steps = workload.epoch_steps()
    if steps <= warmup:
        raise ValueError(f"an epoch has {steps} steps per rank, not more than warmup_steps "
                         f"({warmup}): lower measure.warmup_steps or batch_size, or add data")
    out: dict[str, Any] = {"wait_s": [], "compute_s": [], "windows_s": [], "loss": None,
                           "window_steps": [], "warm": [], "epochs": []}
    for e in range(epochs):
        ctx.barrier()
        start = window_start = time.perf_counter()
        for i in range(steps):
            w, c, out["loss"] = _timed_step(workload, batches, ctx)
            if e == 0 and i < warmup:
                out["warm"].append((w, c, out["loss"]))
                ctx.clear_measurements()
                window_start = time.perf_counter()
                continue
            out["wait_s"].append(w)
            out["compute_s"].append(c)
        end = time.perf_counter()
        out["windows_s"].append(end - window_start)
        out["window_steps"].append(steps - (warmup if e == 0 else 0))
        scores = workload.end_epoch(e)
        out["epochs"].append({"epoch": e + 1, "train_s": end - start,
                              "eval_s": time.perf_counter() - end,
                              "loss": float(out["loss"].float().item()), **scores})
        _log_epoch(ctx, out["epochs"][-1], out["window_steps"][-1] * workload.samples_per_step()
                   / out["windows_s"][-1])
    return out


def _log_epoch(ctx: WorkerContext, epoch: dict[str, Any], samples_per_s: float) -> None:
    """Rank 0 appends the epoch to `<trial dir>/metrics_epoch.jsonl` as it ends (the training
    suite's per-run log): a run cut short keeps the epochs it finished."""
    if ctx.rank != 0 or not ctx.artifact_dir:
        return
    path = Path(ctx.artifact_dir) / "metrics_epoch.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"epoch": epoch["epoch"], "time": datetime.now(timezone.utc).isoformat(),
            "world_size": ctx.world_size, "rank0_samples_per_s": samples_per_s,
            **{k: v for k, v in epoch.items() if k != "epoch"}}
    line = {k: None if isinstance(v, float) and not math.isfinite(v) else v  # JSON has no nan
            for k, v in line.items()}
    with path.open("a") as f:
        f.write(json.dumps(line, default=float) + "\n")


def _timed_step(workload: workloads.Workload, batches: Any, ctx: WorkerContext):
    """One step outside the measured windows (warmup, epochs, profiled steps), with the device
    synchronised around its data and its compute as `_run_windows` does under `sync: step`:
    (data wait, compute, loss)."""
    t0 = time.perf_counter()
    batch = workload.to_device(next(batches))
    ctx.synchronize()
    t1 = time.perf_counter()
    loss = workload.step(batch)
    ctx.synchronize()
    done = time.perf_counter()
    ctx.end_step()
    return t1 - t0, done - t1, loss


def _usage() -> dict[str, float | None]:
    """This process's counters at a window's edge: CPU time of it and its finished children
    (DataLoader workers count once they exit; live ones are measured by the OS, not here), its
    minor page faults (heap pages handed back to the OS and touched again: glibc's malloc,
    memory.steady_heap), its threads' time ready to run but waiting for a core (another
    process's work, or more threads than cores), and the clock."""
    t = os.times()
    return {"cpu": t.user + t.system + t.children_user + t.children_system,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
            "wait": _run_wait_s(), "wall": time.perf_counter()}


def _window_usage(before: dict[str, float | None], after: dict[str, float | None]
                  ) -> dict[str, float | None]:
    """The process's figures over a window from `_usage()` at its edges."""
    s = after["wall"] - before["wall"]
    wait = (None if after["wait"] is None or before["wait"] is None
            else 100.0 * max(0.0, after["wait"] - before["wait"]) / s)
    return {"cpu_util_pct": 100.0 * (after["cpu"] - before["cpu"]) / s,
            "minor_faults_per_s": (after["faults"] - before["faults"]) / s,
            "run_wait_pct": wait}


def _run_wait_s() -> float | None:
    """Seconds this process's threads have spent runnable but not running (Linux schedstat,
    summed over threads; None where the kernel keeps no such count). A thread that ended
    between two readings takes its wait with it: the window's threads are the rank's own."""
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
    except OSError:
        return None
    return total / 1e9


def _profile(workload: workloads.Workload, batches: Any, ctx: WorkerContext,
             steps: int) -> str | None:
    """Extra steps after the measured windows, traced on rank 0: the trace costs time, so it
    never overlaps a measurement. Every rank runs them, as DDP steps are collective."""
    if not steps:
        return None
    tracing = ctx.rank == 0 and ctx.trace_path is not None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) if tracing else contextlib.nullcontext() \
            as prof:
        for _ in range(steps):
            _timed_step(workload, batches, ctx)
    if not tracing:
        return None
    Path(ctx.trace_path).parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(ctx.trace_path)
    return ctx.trace_path


def _flops(workload: workloads.Workload) -> float | None:
    """FLOPs per sample for MFU, counted once after the windows; None if it cannot be."""
    try:
        return workload.flops_per_sample()
    except Exception as e:  # an op the counter cannot trace: MFU stays unknown, not wrong
        log.info("FLOP count unavailable (%s: %s)", type(e).__name__, e)
        return None


def _steps_for_window(seconds: float, warm: list, ctx: WorkerContext) -> int:
    """Turn a time window into a step count from the later warmup steps, the same on all ranks."""
    tail = sorted(w + c for w, c, _ in warm[len(warm) // 2:])
    median = tail[len(tail) // 2]
    return max(1, int(ctx.all_reduce_max(math.ceil(seconds / max(median, 1e-6)))))


def _memory(ctx: WorkerContext) -> dict[str, float | None]:
    out = {"rss_peak_mb": peak_rss_mb(), "peak_allocated_mb": None, "peak_reserved_mb": None,
           "allocated_mb": None, "reserved_mb": None}
    if ctx.is_cuda:
        out["allocated_mb"] = torch.cuda.memory_allocated(ctx.device) / 2**20
        out["reserved_mb"] = torch.cuda.memory_reserved(ctx.device) / 2**20
        out["peak_allocated_mb"] = torch.cuda.max_memory_allocated(ctx.device) / 2**20
        out["peak_reserved_mb"] = torch.cuda.max_memory_reserved(ctx.device) / 2**20
    return out

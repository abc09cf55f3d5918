"""The all-reduce probe on gloo with two CPU ranks, and nccl-tests' bandwidth definitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from raybench.grid import expand
from raybench.metrics import summarize
from raybench.runners.local import run_local
from raybench.spec import load_sweep
from tests.conftest import gloo_group, spawn_ranks
from tests.test_metrics import record

PROBE = """
name: ar
system: {label: test-cpu}
workload: {name: allreduce, message_mb: 4, batch_size: 2}
hardware: {cpu_workers: 2}
measure: {warmup_steps: 2, measure_steps: 5}
"""


def test_bus_bandwidth_definition():
    recs = [record(r, 0.01, n=5, bs=2) for r in range(4)]  # 2 ops per 10 ms step
    assert "comm/busbw_gb_s" not in summarize(recs)  # another workload's row has no bandwidth
    recs = [{**r, "workload": "allreduce", "describe": {"message_bytes": 8 * 10**6}}
            for r in recs]
    bw = summarize(recs)
    assert bw["comm/time_per_op_us"] == pytest.approx(5000.0)
    assert bw["comm/algbw_gb_s"] == pytest.approx(1.6)  # 8 MB / 5 ms
    assert bw["comm/busbw_gb_s"] == pytest.approx(1.6 * 2 * 3 / 4)


def test_allreduce_on_gloo_with_two_ranks(write_sweep):
    (trial,) = expand(load_sweep(write_sweep(PROBE)))
    out = run_local(trial)
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["comm/message_mb"] == pytest.approx(4.0)
    assert m["comm/algbw_gb_s"] > 0
    assert m["comm/busbw_gb_s"] == pytest.approx(m["comm/algbw_gb_s"])  # 2(n-1)/n = 1 for n=2
    assert m["train/world_size"] == 2


def _rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: the ops the workload's step runs, and its time per all-reduce
    against dist.all_reduce timed alone on a buffer of the same size, interleaved."""
    import json
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from raybench import workloads
    from raybench.context import WorkerContext
    from raybench.rank.loop import Steps, _timed_step
    from raybench.spec import HardwareSpec

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    with gloo_group(rank, port):
        cls = workloads.get("allreduce")
        ctx = WorkerContext(rank, rank, 2, 0, torch.device("cpu"), HardwareSpec(cpu_workers=2))
        w = cls(cls.Params(message_mb=8, batch_size=2), ctx)
        w.setup()
        batches = w.batches()
        with Ops() as ops:
            w.step(next(batches))
        plain = torch.zeros_like(w.buffer)
        steps = Steps(w, batches, w.clock, ctx)
        ours, alone = [], []
        for _ in range(15):
            ours.append(_timed_step(steps)[1] / 2)  # compute time per operation
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(plain)
            alone.append(time.perf_counter() - t0)
            dist.barrier()
        if rank == 0:
            Path(out).write_text(json.dumps({
                "ops": ops.names, "ours": statistics.median(ours[3:]),
                "alone": statistics.median(alone[3:])}))


def test_the_timed_step_is_the_collectives_alone(tmp_path):
    import json

    out = tmp_path / "rank0.json"
    spawn_ranks(_rank, str(out))
    r = json.loads(out.read_text())
    # only the two all-reduces: nothing else runs inside the timing
    assert r["ops"] and all(op.startswith("c10d.allreduce_") for op in r["ops"]), r["ops"]
    assert len(r["ops"]) == 2
    # and the time per operation is dist.all_reduce's own, timed independently. The bounds
    # catch real faults, not noise: timing more than the collectives (or a sync per op) lands
    # well above 1.4, timing only the launch of an op that has not finished well below 0.5.
    # Medians of 12 operations of ~7 ms on 2 cores move either way: 1.251 seen here, 0.795 in
    # CI (2026-11-24, the plain all-reduce the slower one).
    assert 0.5 < r["ours"] / r["alone"] < 1.4, r

"""The all-reduce probe on gloo with two CPU ranks, and nccl-tests' bandwidth definitions."""

from __future__ import annotations

import pytest

from raybench.bench import run_local
from raybench.grid import expand
from raybench.metrics import bandwidth
from raybench.spec import load_sweep
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
    bw = bandwidth(8 * 10**6, recs)
    assert bw["comm/time_per_op_us"] == pytest.approx(5000.0)
    assert bw["comm/algbw_gb_s"] == pytest.approx(1.6)  # 8 MB / 5 ms
    assert bw["comm/busbw_gb_s"] == pytest.approx(1.6 * 2 * 3 / 4)
    assert bandwidth(None, recs) == {}


def test_allreduce_on_gloo_with_two_ranks(write_sweep):
    (trial,) = expand(load_sweep(write_sweep(PROBE)))
    out = run_local(trial)
    assert out["status"] == "ok", out.get("error")
    m = out["metrics"]
    assert m["comm/message_mb"] == pytest.approx(4.0)
    assert m["comm/algbw_gb_s"] > 0
    assert m["comm/busbw_gb_s"] == pytest.approx(m["comm/algbw_gb_s"])  # 2(n-1)/n = 1 for n=2
    assert m["train/world_size"] == 2

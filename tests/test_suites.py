"""The validation suites shipped with raybench (raybench/validate/suites/): every file loads and expands
into trials with what `validate` sets in it, for a GPU cluster of two nodes and for CPU nodes;
the GPU probes' windows are long enough for NVML's figures."""

from __future__ import annotations

import pytest

from raybench import telemetry
from raybench.grid import expand
from raybench.runners.on_ray import plan
from raybench.spec import load_sweep
from raybench.validate import command as validate

GPU_NODES = [{"GPU": 8.0, "CPU": 96.0}, {"GPU": 8.0, "CPU": 96.0}]
# as Ray lists them: each node with its own node:<ip> resource
CPU_NODES = [{"CPU": 2.0, "node:10.0.0.1": 1.0}, {"CPU": 2.0, "node:10.0.0.2": 1.0}]


def _trials(nodes):
    gpus = int(sum(n.get("GPU", 0) for n in nodes))
    return {path.stem: expand(load_sweep(path, sets)) for path, sets in validate.suite(gpus, nodes)}


def test_the_gpu_suite_has_a_trial_per_gpu_and_both_all_reduce_widths():
    trials = _trials(GPU_NODES)
    assert sorted(trials) == ["allreduce", "matmul", "membw", "transfer"]
    assert len(trials["membw"]) == 16
    assert len(trials["matmul"]) == 16 * 4  # fp32, tf32, bf16, fp16 on every GPU
    assert len(trials["transfer"]) == 16 * 4  # both ways, pinned and pageable
    assert sorted(t.hardware.num_gpus for t in trials["allreduce"]) == [8, 16]


@pytest.mark.parametrize("probe", ["matmul", "membw", "transfer", "allreduce"])
def test_gpu_probe_windows_outlast_nvml_sampling(probe):
    """On the lent H200 (2026-11-26) the suite's windows were 10-20 steps: 0.08 s of memory
    copies, 0.26 s of bf16 matmul, under NVML's one-second averages, so most rows had no power,
    energy or utilisation, and a power cap that sets in over seconds would not show. Windows
    are timed now."""
    for t in _trials(GPU_NODES)[probe]:
        assert t.measure.measure_seconds is not None
        assert t.measure.measure_seconds >= 2 * telemetry.MIN_WINDOW_S


def test_the_cpu_suite_has_a_trial_per_node():
    trials = _trials(CPU_NODES)
    assert sorted(trials) == ["allreduce", "matmul", "membw"]
    assert len(trials["matmul"]) == len(trials["membw"]) == 2
    # each pinned to its own node
    assert sorted(t.hardware.node for t in trials["membw"]) == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize(("probe", "settings"), [("matmul", 4), ("transfer", 4)])
def test_each_gpu_runs_every_setting_of_a_probe_on_one_worker_group(probe, settings):
    """One worker group per GPU, all running at once, each through every precision (matmul) or
    way and memory kind (transfer) of one seed: every GPU measures every setting, and Ray
    Train starts once per GPU and probe (about 10 s on the H200) instead of once per trial."""
    path, sets = next(s for s in validate.suite(16, GPU_NODES) if s[0].stem == probe)
    spec = load_sweep(path, sets)
    trials = expand(spec)
    limit, _ = plan.concurrency_limit(trials, GPU_NODES, spec.execution.concurrency)
    strategies = {t.key: plan.strategy(t, GPU_NODES, spec.execution.placement,
                                       spec.execution.concurrency) for t in trials}
    groups = plan.worker_groups(trials, strategies, spec.execution.isolation, limit)
    assert limit == len(groups) == 16
    for group in groups:
        assert len({trials[i].workload.seed for i in group}) == 1
        assert len({tuple(sorted(trials[i].overrides.items())) for i in group}) == settings

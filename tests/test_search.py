"""Largest batch that fits: the search logic on a known boundary, and a real CPU memory budget."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from raybench.bench.command import main as bench_main
from raybench.grid import expand
from raybench.records import TrialOutcome
from raybench.runners.local import run_local
from raybench.spec import SpecError, load_sweep
from raybench.sweep.search import LargestBatchSpec, largest_batch

SEARCH = """
name: search
system: {label: test-cpu}
workload: {name: vit_tiles, size: tiny, tile: 128, mode: train}
hardware: {cpus_per_worker: 2}
measure: {warmup_steps: 1, measure_steps: 2}
"""


def fake_run(limit: int, calls: list[int]):
    def run(trial):
        b = trial.workload.batch_size
        calls.append(b)
        return TrialOutcome(status="ok" if b <= limit else "oom")
    return run


@pytest.mark.parametrize("limit,cap,expected", [(13, 64, 13), (1, 64, 1), (0, 64, 0),
                                                (100, 48, 48), (64, 64, 64)])
def test_search_finds_the_boundary(write_sweep, limit, cap, expected):
    (group,) = expand(load_sweep(write_sweep(SEARCH)))
    calls: list[int] = []
    result = largest_batch(group, LargestBatchSpec(max_batch=cap), fake_run(limit, calls), 10)
    assert result["largest_batch"] == expected
    assert len(calls) == len(set(calls))  # no batch size is tried twice
    if expected < cap:
        assert result["first_failing_batch"] == expected + 1


def test_probe_trials_get_their_own_keys(write_sweep):
    (group,) = expand(load_sweep(write_sweep(SEARCH)))
    seen = []
    largest_batch(group, LargestBatchSpec(max_batch=4), lambda t: seen.append(t) or
                  TrialOutcome(status="ok"), 5)
    assert [t.workload.batch_size for t in seen] == [1, 2, 4]
    assert [t.index for t in seen] == [5, 6, 7]
    assert len({t.key for t in seen}) == 3


def test_batch_axis_conflicts_with_search(write_sweep):
    spec = load_sweep(write_sweep(SEARCH + "search: {largest_batch: {max_batch: 8}}\n"
                                  "grid: {batch_size: [1, 2]}\n"))
    with pytest.raises(SpecError, match="chooses the batch size itself"):
        expand(spec)


# local trials (two to calibrate, then the search's probes: 25 s in the parallel part); it
# judges memory peaks, never a time: background
@pytest.mark.background
def test_search_against_a_cpu_memory_budget(write_sweep, tmp_path, capsys):
    path = write_sweep(SEARCH + "search: {largest_batch: {max_batch: 32}}\n")
    # calibrate on this machine: a budget halfway between the peaks of batch 2 and batch 16
    peaks = {}
    for b in (2, 16):
        (t,) = expand(load_sweep(path, [f"workload.batch_size={b}", "search=null"]))
        peaks[b] = run_local(t).metrics["host/rss_peak_mb"]
    assert peaks[16] > peaks[2] + 100  # training activations grow with the batch
    budget = (peaks[2] + peaks[16]) / 2
    code = bench_main(["run", str(path), "--output", str(tmp_path / "run"),
                       "--set", f"hardware.memory_budget_mb={budget}"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["raybench"]
    assert code == 0
    df = pd.read_parquet(tmp_path / "run" / "results.parquet")
    found = df[df.stage == "search"].iloc[0]
    largest = int(found["search/largest_batch"])
    assert 2 <= largest < 16
    assert found["search/largest_samples_per_step"] == largest  # one micro-batch per step
    probes = df[df.stage == "benchmark"].set_index("workload.batch_size")["host/rss_peak_mb"]
    assert probes[largest] <= budget < probes[largest + 1]  # the boundary, both sides measured
    assert summary["largest_batch"][0]["largest_batch"] == largest

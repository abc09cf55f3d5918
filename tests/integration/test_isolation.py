"""`execution.isolation: worker` on a real Ray: trials share a worker group (the widest first, then
narrower ones on its first ranks), and each still builds everything afresh and measures as on
fresh processes, in every position a trial can take in a group. (A failed trial ending its
group, the next starting fresh workers: tests/reliability/test_faults_ray.py, whose sweep runs
under worker isolation.)

This 2-core VM's own speed drifts by 10-20% over tens of seconds with nothing else running
(docs/journal/2026-11.md, issue 45), so the group and the fresh processes are measured in
alternating sweeps, round after round, and compared round by round: a drift then moves both
sides of a pair alike, and the median of the rounds' ratios is what is bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import LocalCluster

# Rounds of one group sweep and one fresh sweep, alternating which goes first. RAYBENCH_ROUNDS
# raises it to measure the spread the bounds below come from.
ROUNDS = int(os.environ.get("RAYBENCH_ROUNDS", "2"))

# the rounds run in the first test's set-up: about 60 s each here (269 s for 4 rounds). They
# compare speeds, so the module runs alone, after the parallel part of `make test` (serial)
pytestmark = [pytest.mark.ray, pytest.mark.timeout(120 + 150 * ROUNDS), pytest.mark.serial]

SWEEP = """
name: isolation
system: {label: local-cpu}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8,
           synthetic_samples: 512}
# two ranks: the group's gloo process group carries the second trial's fresh DDP model too;
# then one-rank trials on its first rank, the second rank gone
hardware: {num_gpus: 0, cpu_workers: 2, cpus_per_worker: 1, dataloader_workers: 0}
# a time window, so the one-rank trials measure as long as the two-rank ones (40 steps were
# 2.4 s for one rank here, where a hiccup of the VM moves a ratio by a fifth)
measure: {warmup_steps: 3, measure_steps: null, measure_seconds: 4}
execution: {isolation: %(isolation)s}
grid: %(grid)s
"""
GROUP = "{cpu_workers: [1, 2], seed: [1, 2]}"  # group positions 0-3: (2, 1) (2, 2) (1, 1) (1, 2)
# A trial on processes of its own: the one-rank shape. The two-rank shape on fresh processes is
# the group's own first trial, which started the group's workers, seconds before the group's
# second trial in the same sweep: a closer pair than one from another sweep, and one Ray Train
# start less a round.
FRESH = "{cpu_workers: [1], seed: [1]}"
# group position -> (its trial, what it is compared with: the sweep and trial)
POSITIONS = {"later": ((2, 2), ("worker", (2, 1))),
             "after the group narrowed": ((1, 1), ("process", (1, 1))),
             "later after it narrowed": ((1, 2), ("process", (1, 1)))}


def pairs(runs: dict) -> Iterator[tuple[str, pd.Series, pd.Series]]:
    """A round's positions: the name, the group's row, the fresh row it is compared with."""
    for position, (shared, (sweep_of, fresh)) in POSITIONS.items():
        yield position, runs["worker"][0].loc[shared], runs[sweep_of][0].loc[fresh]


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster()
    try:
        c.start_head("--num-cpus=3")  # two ranks and Tune's trial
        c.wait_for_nodes(1)
        yield c
    finally:
        c.stop()


def sweep(cluster, tmp: Path, name: str, isolation: str, grid: str) -> tuple[pd.DataFrame, dict]:
    path = tmp / f"{name}.yaml"
    path.write_text(SWEEP % {"isolation": isolation, "grid": grid})
    out = tmp / name
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(path), "--address",
                           cluster.address, "--output", str(out)], cwd=ROOT, env=cluster.env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    df = pd.read_parquet(out / "results.parquet").set_index(
        ["hardware.cpu_workers", "workload.seed"])
    pids = {}
    for f in sorted((out / "trials").glob("*.json")):
        detail = json.loads(f.read_text())
        cfg = detail["trial"]
        pids[cfg["hardware"]["cpu_workers"], cfg["workload"]["seed"]] = [
            r["pid"] for r in detail.get("records") or []]
    return df, pids


@pytest.fixture(scope="module")
def rounds(cluster, tmp_path_factory) -> list[dict]:
    """ROUNDS x (the group sweep, the fresh sweep), alternating which runs first."""
    tmp = tmp_path_factory.mktemp("isolation")
    out = []
    for n in range(ROUNDS):
        runs = {}
        for isolation in ("worker", "process")[::1 if n % 2 == 0 else -1]:
            runs[isolation] = sweep(cluster, tmp, f"{isolation}{n}", isolation,
                                    GROUP if isolation == "worker" else FRESH)
        out.append(runs)
    return out


def test_a_worker_group_runs_trials_of_one_shape_on_the_same_processes(rounds):
    df, pids = rounds[0]["worker"]
    assert (df["trial/isolation"] == "worker").all()
    assert (df["status"] == "ok").all(), df["error"]
    # one group of two ranks: its two-rank trials first, then the one-rank trials on its first
    # rank; only the first paid the start-up
    order = df.sort_values("trial/group_position")
    assert list(order.index) == [(2, 1), (2, 2), (1, 1), (1, 2)]
    assert list(order["trial/group_position"]) == [0, 1, 2, 3]
    assert (df["trial/group_ranks"] == 2).all()
    assert list(order["train/world_size"]) == [2, 2, 1, 1]
    group = pids[2, 1]
    assert len(group) == 2 and all(group) and pids[2, 2] == group
    assert pids[1, 1] == pids[1, 2] == group[:1]
    first = df.loc[(2, 1)]
    assert first["overhead/train_start_s"] > 0
    later = order.iloc[1:]
    assert later["overhead/train_start_s"].isna().all()  # no workers started for them
    assert (later["overhead/fixed_s"] < first["overhead/fixed_s"] / 2).all()
    # the way from the last trial's exit to this one's entry, inside the fixed cost
    assert pd.isna(first["overhead/handover_s"])
    between = later["overhead/handover_s"] + later["overhead/release_s"]
    assert (later["overhead/handover_s"] > 0).all() and (later["overhead/release_s"] >= 0).all()
    assert (between < later["overhead/fixed_s"]).all()
    alone, alone_pids = rounds[0]["process"]
    assert (alone["status"] == "ok").all() and (alone["trial/isolation"] == "process").all()
    assert (alone["trial/group_ranks"] == alone["train/world_size"]).all()
    assert alone_pids[1, 1] != group[:1]
    for position, shared, fresh in pairs(rounds[0]):
        assert shared["host/rss_peak_mb"] == pytest.approx(fresh["host/rss_peak_mb"],
                                                           rel=0.1), position


def test_every_group_position_measures_as_fresh_processes(rounds):
    """Per position, the group's samples/s over that of the same shape on fresh processes in
    the same round (the two-rank shape: the group's own first trial; the one-rank shape: the
    fresh sweep's trial); some round within 25% below and some round within 25% above: a
    fault of the group shows in every round, one side only, while a neighbour's burst slows
    one trial of one round (a clean clone's CI read 0.46 and 1.06 for one position, the 0.46
    trial waiting for a core 19% of its window against 5-6% for every other trial: the median
    of the two failed). The bound comes
    from the measured spread (docs/journal/2026-11.md, issue 45): over 22 rounds on this VM,
    quiet, with a busy process per core, and with busy processes competing thread for thread,
    the per-round ratios spread with a standard deviation (of their logarithm) of 0.05-0.15
    and ran 0.79-1.26; the median of any 2 of those rounds (CI runs 2) stayed within
    0.82-1.20 for every position. With 4 s windows and the pairs above (2026-11-27, 6 rounds
    here) single rounds ran 0.81-1.19. What this guards against is larger and one-sided: the
    ratios of 1.34-1.48 the issue found, the driver's row writing inside a window (26-34%
    slower), a departed rank that spins.

    The cause of those ratios is checked directly, as it is a mechanism and not a noisy
    figure: every trial's heap is raybench's (memory.steady_heap), and none page-faults at
    the rate of a glibc heap that unmaps and maps its memory every step (7-42 thousand
    faults/s in the default sweep's trials before the fix, at most about 1,000 after)."""
    ratios = {p: [] for p in POSITIONS}
    waits = {p: [] for p in POSITIONS}
    for runs in rounds:
        (group, _), (fresh, _) = runs["worker"], runs["process"]
        for df in (group, fresh):
            assert (df["status"] == "ok").all(), df["error"]
        for position, shared, ref in pairs(runs):
            ratios[position].append(shared["train/samples_per_s"] / ref["train/samples_per_s"])
            waits[position].append((shared["host/run_wait_pct"], ref["host/run_wait_pct"]))
    print(json.dumps({"ratios": ratios, "run_wait": waits, "faults": [
        [runs[k][0]["host/minor_faults_per_s"].round().tolist() for k in ("worker", "process")]
        for runs in rounds]}))
    for runs in rounds:
        for df, _ in runs.values():
            assert (df["host/heap"] == "fixed").all()
            assert (df["host/minor_faults_per_s"] < 5000).all(), df["host/minor_faults_per_s"]
    for position, values in ratios.items():
        assert max(values) > 1 / 1.25 and min(values) < 1.25, (position, values)

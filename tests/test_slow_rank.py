"""A slow device must show: two gloo ranks of a DDP ResNet where a test-only hook slows rank
1's forward. DDP makes their step times equal; their own compute is not, and the row names
rank 1. (Two equal ranks on a busy 2-core machine differ by up to ~30% on their own, so the
control is relative: far less skew than the slowed pair.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raybench.metrics import own_compute
from tests.conftest import TINY_SWEEP, gloo_group, spawn_ranks
from tests.test_metrics import record

# one rank's own compute against the others': alone, after the parallel part (serial)
pytestmark = pytest.mark.serial


def _rank(rank: int, port: int, sweep: str, slow_s: float, out: str) -> None:
    import time

    import torch

    from raybench.context import WorkerContext
    from raybench.grid import expand
    from raybench.metrics import summarize
    from raybench.rank.loop import run_worker
    from raybench.spec import load_sweep

    with gloo_group(rank, port):
        (trial,) = expand(load_sweep(Path(sweep), ["grid={}", "hardware.cpu_workers=2",
                                                   "measure.measure_steps=6"]))
        ctx = WorkerContext(rank, rank, 2, 0, torch.device("cpu"), trial.hardware)
        if rank == 1 and slow_s:
            prepare = ctx.prepare_model

            def slowed(model, clock=None):  # the test-only hook: this rank's forward is slower
                model.register_forward_hook(lambda *_: time.sleep(slow_s))
                return prepare(model, clock)

            ctx.prepare_model = slowed
        records = run_worker(trial, ctx)
        if rank == 0:
            m = summarize(records)
            Path(out).write_text(json.dumps({k: m[k] for k in m if k.startswith("train/")}))


def run_two_ranks(tmp_path, slow_s: float) -> dict:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(TINY_SWEEP)
    out = tmp_path / f"row_{slow_s}.json"
    spawn_ranks(_rank, str(sweep), slow_s, str(out))
    return json.loads(out.read_text())


def test_a_slow_rank_is_named_though_ddp_equalises_step_times(tmp_path):
    row = run_two_ranks(tmp_path, slow_s=0.2)
    assert row["train/slow_ranks"] == "1", row
    assert row["train/own_compute_skew_pct"] > 80
    assert row["train/rank_skew_pct"] < 20  # the step times DDP equalised do not show it
    even = run_two_ranks(tmp_path, slow_s=0.0)
    assert even["train/own_compute_skew_pct"] < row["train/own_compute_skew_pct"] / 2, even


def test_own_compute_figures():
    recs = [record(r, 0.1) for r in range(4)]
    for r, ms in zip(recs, [10.0, 10.5, 9.8, 12.0], strict=True):
        r["own_s"] = [ms / 1e3] * 10
    m = own_compute(recs)
    assert m["train/own_compute_median_ms"] == pytest.approx(10.25)
    assert m["train/slow_ranks"] == "3"  # 12.0 > 1.1 x 10.25; 10.5 is within 10%
    assert m["train/own_compute_skew_pct"] == pytest.approx(100 * (12.0 / 9.8 - 1))
    assert own_compute([record(0, 0.1)]) == {}  # one rank, or no DDP: nothing to compare

"""`--runner torchrun`: a trial's ranks started by torch.distributed.run, no Ray (issue 42)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from raybench.grid import expand
from raybench.runners.torchrun import run_torchrun
from raybench.spec import load_sweep
from tests.integration.ray_nodes import free_port

TWO_RANKS = """
name: torchrun_two
system: {label: cpu}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8,
           synthetic_samples: 512}
hardware: {num_gpus: 0, cpu_workers: 2, cpus_per_worker: 1, dataloader_workers: 0}
measure: {warmup_steps: 2, measure_steps: 6}
"""


# In each rank (torchrun sets RANK for its ranks, not for itself): the interpreter's teardown
# aborts, as gloo's threads sometimes made it do there ("terminate called without an active
# exception", a clean clone's make test, 2026-12-06). A rank whose records are written ends
# before its teardown (rank.launched.leave_rank), so the trial is still a result.
ABORT_AT_TEARDOWN = """
import atexit, os
if "RANK" in os.environ:
    atexit.register(os.abort)
"""


def test_a_sweep_runs_its_ranks_under_torchrun(write_sweep, tmp_path):
    from raybench.sweep.command import main

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ABORT_AT_TEARDOWN)
    out = tmp_path / "run"
    rc = main([str(write_sweep(TWO_RANKS)), "--runner", "torchrun", "--output", str(out),
               "--set", f"hardware.env.PYTHONPATH={site}"])
    row = pd.read_parquet(out / "results.parquet").iloc[0]
    assert rc == 0 and row["status"] == "ok", row["error"]  # the row says why, if it failed
    assert row["train/world_size"] == 2
    assert row["train/samples_per_s"] > 0 and len(row["cluster/rank_nodes"].split(",")) == 2
    # the same fixed-cost phases as every runner's rows, from the ranks' own stamps
    assert row["overhead/fixed_s"] > row["overhead/setup_s"] > 0
    assert json.loads((out / "system_info.json").read_text())["cluster"]["mode"].startswith(
        "torchrun")


def test_a_ranks_failure_is_the_rows_reason(write_sweep, tmp_path, monkeypatch):
    """A rank that raises writes its reason before torchrun exits, and the driver makes it the
    row's: both sides here in this process (the launcher replaced by the rank's own call)."""
    from raybench.runners import torchrun

    path = write_sweep("name: t\nsystem: {label: cpu}\n"
                       "workload: {name: vit_tiles, size: tiny, tile: 64, batch_size: 2, "
                       "mode: inference, cuda_graphs: true}\n"
                       "hardware: {num_gpus: 0, cpu_workers: 1}\n")
    trial = expand(load_sweep(path))[0]

    def launcher(cmd, **kw):  # as torchrun would: the rank's variables, then the rank
        work, trace_dir = Path(cmd[-2]), cmd[-1]
        for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(ValueError, match="cuda_graphs needs a GPU trial"):
            torchrun._rank(work, trace_dir)
        return subprocess.CompletedProcess(cmd, 1, "", "ValueError ...")

    monkeypatch.setattr(torchrun.subprocess, "run", launcher)
    out = run_torchrun(trial, str(tmp_path / "trials"), 300)
    assert out.status == "error" and "cuda_graphs needs a GPU trial" in out.error

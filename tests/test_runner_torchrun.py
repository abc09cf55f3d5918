"""`--runner torchrun`: a trial's ranks started by torch.distributed.run, no Ray (issue 42)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd

from raybench.grid import expand
from raybench.runners.torchrun import run_torchrun
from raybench.spec import load_sweep
from tests.conftest import ROOT

TWO_RANKS = """
name: torchrun_two
system: {label: cpu}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8,
           synthetic_samples: 512}
hardware: {num_gpus: 0, cpu_workers: 2, cpus_per_worker: 1, dataloader_workers: 0}
measure: {warmup_steps: 2, measure_steps: 6}
"""


def test_a_sweep_runs_its_ranks_under_torchrun(write_sweep, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "raybench.sweep", str(write_sweep(TWO_RANKS)),
                           "--runner", "torchrun", "--output", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = pd.read_parquet(out / "results.parquet").iloc[0]
    assert row["status"] == "ok" and row["train/world_size"] == 2
    assert row["train/samples_per_s"] > 0 and len(row["cluster/rank_nodes"].split(",")) == 2
    # the same fixed-cost phases as every runner's rows, from the ranks' own stamps
    assert row["overhead/fixed_s"] > row["overhead/setup_s"] > 0
    assert json.loads((out / "system_info.json").read_text())["cluster"]["mode"].startswith(
        "torchrun")


def test_a_ranks_failure_is_the_rows_reason(write_sweep):
    """A rank that raises writes its failure before torchrun's exit: the row says why."""
    path = write_sweep("name: t\nsystem: {label: cpu}\n"
                       "workload: {name: vit_tiles, size: tiny, tile: 64, batch_size: 2, "
                       "mode: inference, cuda_graphs: true}\n"
                       "hardware: {num_gpus: 0, cpu_workers: 2}\n")
    out = run_torchrun(expand(load_sweep(path))[0], str(path.parent / "trials"), 300)
    assert out.status == "error" and "cuda_graphs needs a GPU trial" in out.error

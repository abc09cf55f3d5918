"""Shared fixtures: sweep files written on the fly, and the GPU skip."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# Every row any test writes (here or in a sweep it starts) has each metric column declared
# with its unit (raybench/columns.py): a new figure without its declaration fails a test.
os.environ["RAYBENCH_STRICT_COLUMNS"] = "1"

TINY_SWEEP = """
name: tiny
system: {label: test-cpu, nodes: 1, gpus_per_node: 0}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 4,
           synthetic_samples: 256}
hardware: {num_gpus: 0, cpu_workers: 1, dataloader_workers: 0}
grid: {batch_size: [4, 8]}
measure: {warmup_steps: 1, measure_steps: 3}
"""


@pytest.fixture
def write_sweep(tmp_path: Path):
    """Write YAML text (dedented) to a file and return its path."""

    def _write(text: str = TINY_SWEEP, name: str = "sweep.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; this machine has no GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

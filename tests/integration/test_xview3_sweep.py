"""The xView3 CPU sweep on a real embedded Ray, shortened to one epoch of one 2-rank trial on
three small scenes with the two-node test's small detector (whether the recipe learns is the
detector test's question, tests/test_xview3_workload.py; the epoch took 3.1 s here instead of
9.6 s): the preprocess stage hands its chips to the workload, evaluation is gathered across DDP
ranks, the row carries the accuracy columns, and the best epoch becomes a Ray Train checkpoint. Its data
paths are relative, as in the shipped sweeps: they mean the directory the sweep started in, even
inside Ray Train workers (Tune moves trial processes into trial directories)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.ray

ACCURACY = ["xview3/aggregate", "xview3/detection_f1", "xview3/shore_f1", "xview3/vessel_f1",
            "xview3/fishing_f1", "xview3/length_score", "det/map50", "train/train_time_s",
            "train/epoch_times_s"]


def test_xview3_cpu_sweep_rows_carry_accuracy(tmp_path):
    data = "synth"
    sets = {
        "preprocess.scenes": f"{data}/train", "preprocess.labels": f"{data}/labels/train.csv",
        "preprocess.out": "chips", "preprocess.generate.size": "512x512",
        "preprocess.generate.scenes": "3", "workload.batch_size": "2",
        "workload.rpn_proposals_train": "100", "workload.rpn_proposals_test": "100",
        "workload.roi_samples": "32", "workload.box_head_dim": "64",
        "workload.scenes": f"{data}/train", "workload.labels": f"{data}/labels/train.csv",
        "workload.val_scenes": f"{data}/validation",
        "workload.val_labels": f"{data}/labels/validation.csv",
        "workload.shoreline": f"{data}/shoreline/validation",
        "workload.chips_cache": "chips", "workload.epochs": "1",
        "workload.save_checkpoints": "true", "grid.cpu_workers": "[2]",
    }
    cmd = [sys.executable, "-m", "raybench.sweep", str(ROOT / "sweeps" / "xview3_cpu.yaml"),
           "--output", str(tmp_path / "run")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["raybench"]
    df = pd.read_parquet(tmp_path / "run" / "results.parquet")
    stage = df[df["stage"] == "preprocess"].iloc[0]
    trial = df[df["stage"] != "preprocess"].iloc[0]
    assert stage["status"] == "ok" and trial["status"] == "ok", trial["error"]
    assert summary["trials"] == 1
    assert trial["train/world_size"] == 2 and trial["train/epochs"] == 1
    for col in ACCURACY:
        assert col in df.columns and pd.notna(trial[col]), col
    assert 0 <= trial["xview3/aggregate"] <= 1
    # the workload read the stage's chips, not a second cut of its own
    assert trial["workload.chips"].startswith("chips/")
    assert (tmp_path / trial["workload.chips"] / "chip_params.json").is_file()
    ckpt = Path(trial["train/checkpoint"])
    assert (ckpt / "model.pt").is_file() and (ckpt / "scores.json").is_file()
    assert list((tmp_path / "run" / "trials").glob("*/best_model.pt"))  # beside the trial
    preds = list((tmp_path / "run" / "trials").glob("*/predictions.csv"))
    assert len(preds) == 1

"""The vessel-detection workload: chips as detection samples, its parameters, the epoch loop, and
(slow, but run in CI) that it learns on synthetic scenes far beyond an untrained model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from raybench import workloads
from raybench.clock import StepClock
from raybench.context import WorkerContext
from raybench.data import xview3 as x3
from raybench.data.chip import chip_scenes
from raybench.data.chipread import ChipParams
from raybench.data.chipset import MIN_BOX_PX, ChipSet
from raybench.data.synth_xview3 import generate
from raybench.grid import expand
from raybench.rank.epochs import run_epochs
from raybench.rank.loop import Steps, _timed_step
from raybench.runners.local import run_local
from raybench.spec import HardwareSpec, SpecError, load_sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("x3")
    generate(root, n=2, rows=400, cols=400, seed=4, density=40)
    return root


def test_chipset_items_are_detection_samples(scenes, tmp_path):
    params = ChipParams(chip_size=128, overlap=0, channels=("vh", "vv"))
    summary = chip_scenes(scenes / "train", scenes / "labels" / "train.csv", tmp_path, params,
                          select="all", runner="local")
    ds = ChipSet(tmp_path, 128, 2)
    assert len(ds) == summary["chips_total"] == 16  # 400 px -> 4 x 4 chips of 128
    labels = pd.read_csv(scenes / "labels" / "train.csv")
    boxes = [ds[i][1]["boxes"] for i in range(len(ds))]
    assert sum(len(b) for b in boxes) == len(labels)  # no overlap: each label in one chip
    image, target, meta = ds[5]
    assert image.shape == (2, 128, 128) and image.dtype == torch.float32
    assert set(meta) == {"scene_id", "chip_index", "row_off", "col_off"}
    allb = torch.cat(boxes)
    assert (allb[:, 2] - allb[:, 0] >= MIN_BOX_PX - 1e-4).all()
    assert ((allb >= 0) & (allb <= 128)).all()
    assert set(torch.cat([ds[i][1]["labels"] for i in range(len(ds))]).tolist()) <= {1, 2, 3}


def test_anchor_count_must_match_the_backbone():
    cls = workloads.get("xview3_frcnn")
    with pytest.raises(ValueError, match="mobilenet_v3_fpn has 3 feature levels"):
        cls.Params(backbone="mobilenet_v3_fpn")
    assert cls.Params(backbone="mobilenet_v3_fpn", anchor_sizes=[8, 32, 128]).epochs == 5
    with pytest.raises(ValueError, match="checkpoint '/nowhere/model.pt' is not a file"):
        cls.Params(checkpoint="/nowhere/model.pt")


@pytest.mark.parametrize("backbone, anchors", [("resnet18_fpn", [8, 16, 32, 64, 128]),
                                               ("mobilenet_v3_fpn", [8, 32, 128])])
def test_models_take_any_channel_count(backbone, anchors):
    from raybench.workloads.xview3_frcnn import build_model

    p = workloads.get("xview3_frcnn").Params(backbone=backbone, anchor_sizes=anchors,
                                             chip_size=64, box_head_dim=32, roi_samples=16,
                                             rpn_proposals_train=50, rpn_proposals_test=50)
    model = build_model(p, 5)
    target = {"boxes": torch.tensor([[10.0, 10, 20, 20]]), "labels": torch.tensor([1])}
    losses = model([torch.randn(5, 64, 64)], [target])
    assert set(losses) >= {"loss_classifier", "loss_box_reg", "loss_objectness"}
    model.eval()
    out = model([torch.randn(5, 64, 64)])[0]
    assert set(out) == {"boxes", "scores", "labels"}


def test_objectness_scores_a_region_whose_class_call_is_split():
    from raybench.workloads.xview3_frcnn import build_model

    cls = workloads.get("xview3_frcnn")
    kw = dict(chip_size=64, box_head_dim=32, roi_samples=16, rpn_proposals_train=50,
              rpn_proposals_test=50)
    # one region: background 0.30, fishing 0.36, non-fishing 0.34, non-vessel 0.00
    logits = torch.log(torch.tensor([[0.30, 0.36, 0.34, 1e-9]]))
    regression = torch.zeros(1, 4 * 4)
    proposals = [torch.tensor([[10.0, 10, 20, 20]])]
    found = {}
    for mode in ("objectness", "class"):
        heads = build_model(cls.Params(detection_score=mode, **kw), 2).roi_heads
        boxes, scores, labels = heads.postprocess_detections(logits, regression, proposals,
                                                             [(64, 64)])
        found[mode] = (scores[0].tolist(), labels[0].tolist(), boxes[0].tolist())
    scores, labels, boxes = found["objectness"]
    assert scores == pytest.approx([0.70]) and labels == [1] and boxes == [[10, 10, 20, 20]]
    scores, labels, _ = found["class"]  # one detection per class, each under 0.4
    assert sorted(scores) == pytest.approx([0.34, 0.36]) and sorted(labels) == [1, 2]


def test_detector_flops_are_counted_on_a_real_batch_leaving_the_model_as_it_was(scenes, tmp_path):
    from raybench import flops

    cls = workloads.get("xview3_frcnn")
    p = cls.Params(backbone="resnet18_fpn", chip_size=128, batch_size=2, channels=["vh", "vv"],
                   scenes=str(scenes / "train"), labels=str(scenes / "labels" / "train.csv"),
                   val_scenes=str(scenes / "validation"),
                   val_labels=str(scenes / "labels" / "validation.csv"), shoreline=None,
                   chips_cache=str(tmp_path / "chips"), box_head_dim=32, roi_samples=16,
                   rpn_proposals_train=50, rpn_proposals_test=50)
    w = cls(p, WorkerContext(0, 0, 1, 0, torch.device("cpu"), HardwareSpec()))
    w.setup()
    before = {k: v.clone() for k, v in w.model.state_dict().items()}
    counted = w.flops_per_sample()

    class Summed(torch.nn.Module):  # the FPN's feature maps as one output to backpropagate
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return sum(v.sum() for v in self.m(x).values())

    backbone = flops.flops_per_sample(Summed(w.model.backbone), torch.zeros(1, 2, 128, 128),
                                      True)
    assert counted > backbone > 1e8  # the whole training step holds the backbone's
    after = w.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm stats too
    assert all(q.grad is None for q in w.model.parameters())


def test_a_step_window_is_an_error_for_an_epoch_workload(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: xview3_frcnn}\n"
                       "measure: {measure_steps: 50}\n")
    with pytest.raises(SpecError, match="measure.measure_steps.*measures whole epochs"):
        expand(load_sweep(path))


class _Epochs:
    """An epoch workload stand-in: records what the loop calls, in order."""

    epoch_based = True

    def __init__(self, epochs, steps):
        self.params = SimpleNamespace(epochs=epochs)
        self.steps, self.calls = steps, []

    def epoch_steps(self):
        return self.steps

    def samples_per_step(self):
        return 4

    def to_device(self, batch):
        return batch

    def step(self, batch):
        self.calls.append(("step", batch))
        time.sleep(0.001)
        return torch.tensor(float(batch))

    def end_epoch(self, epoch):
        self.calls.append(("eval", epoch))
        return {"xview3/aggregate": 0.1 * (epoch + 1)}


def _epochs(w, batches, ctx, warmup):
    s = Steps(w, batches, StepClock(ctx.device), ctx)
    return run_epochs(w, ctx, s.clock, warmup, lambda: _timed_step(s))


def test_epoch_loop_measures_all_but_warmup_and_evaluates_outside_the_timing():
    w = _Epochs(epochs=3, steps=5)
    ctx = WorkerContext(0, 0, 1, 0, torch.device("cpu"), HardwareSpec())
    run = _epochs(w, iter(range(100)), ctx, 2)
    assert [c for c in w.calls if c[0] == "eval"] == [("eval", 0), ("eval", 1), ("eval", 2)]
    assert w.calls.index(("eval", 0)) == 5 and w.calls.index(("eval", 1)) == 11
    assert len(run["warm"]) == 2 and len(run["compute_s"]) == 3 + 5 + 5
    assert run["window_steps"] == [3, 5, 5] and len(run["windows_s"]) == 3
    assert [e["xview3/aggregate"] for e in run["epochs"]] == [0.1, 0.2, pytest.approx(0.3)]
    assert all(e["train_s"] > 0 and e["eval_s"] >= 0 for e in run["epochs"])
    with pytest.raises(ValueError, match="not more than warmup_steps"):
        _epochs(_Epochs(1, 2), iter(range(9)), ctx, 2)


def test_each_epoch_is_a_line_of_metrics_epoch_jsonl_as_it_ends(tmp_path):
    class Diverging(_Epochs):
        def end_epoch(self, epoch):
            path = tmp_path / "metrics_epoch.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            assert len(lines) == epoch  # the earlier epochs are on disk before this one ends
            return {"xview3/aggregate": 0.1 * (epoch + 1), "det/map50": float("nan")}

    ctx = WorkerContext(0, 0, 1, 0, torch.device("cpu"), HardwareSpec(),
                        artifact_dir=str(tmp_path))
    run = _epochs(Diverging(epochs=3, steps=5), iter(range(100)), ctx, 2)
    lines = [json.loads(x) for x in (tmp_path / "metrics_epoch.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2, 3]
    assert [x["xview3/aggregate"] for x in lines] == [0.1, 0.2, pytest.approx(0.3)]
    assert lines[0]["det/map50"] is None  # nan is not JSON: written as null
    assert lines[1]["rank0_samples_per_s"] == pytest.approx(5 * 4 / run["windows_s"][1])
    assert lines[2]["train_s"] == run["epochs"][2]["train_s"] and "time" in lines[2]
    other = WorkerContext(1, 1, 2, 0, torch.device("cpu"), HardwareSpec(),
                          artifact_dir=str(tmp_path / "rank1"))
    with pytest.MonkeyPatch.context() as mp:  # a rank other than 0 writes nothing
        mp.setattr(other, "barrier", lambda: None)
        _epochs(_Epochs(epochs=1, steps=3), iter(range(9)), other, 1)
    assert not (tmp_path / "rank1").exists()


@pytest.mark.slow
# both cores for two minutes and nothing timed: beside another test it took 434 s, so `make test`
# runs it at the lowest CPU priority beside the other parts, on the CPU they leave (background;
# its timeout: conftest.BACKGROUND_TIMEOUT_S). 113-182 s alone on 2 cores, 262 s on a slower VM
@pytest.mark.background
def test_detector_learns_on_synthetic_chips(tmp_path):
    """The CPU sweep's model, on its own synthetic recipe, in-process: validation detection F1
    of at least 0.5 after three epochs, where the same model untrained finds nothing.

    The bound has a margin below what the recipe reaches wherever it runs: detection F1 at the
    sweep's threshold 0.3 (scored by objectness) measured 0.74-0.86 over model seeds 0 and 2,
    a second data seed, and AVX-512 vs AVX2 CPU kernels (2 cores, torch 2.15.0), with eight
    scenes; six (for CI's time: 113 s instead of 145 s) gave 0.82 on AVX-512. Scored per
    class (torchvision's rule), the same recipe gave 0.29 on AVX-512 and 0.84 on AVX2: the
    scores of true vessels sat on the threshold, and the CPU's numerics decided the test."""
    data = tmp_path / "synth"
    generate(data, n=6, rows=1024, cols=1024, seed=1, density=30)
    sets = [f"workload.scenes={data}/train", f"workload.labels={data}/labels/train.csv",
            f"workload.val_scenes={data}/validation",
            f"workload.val_labels={data}/labels/validation.csv",
            f"workload.shoreline={data}/shoreline/validation",
            f"workload.chips_cache={tmp_path}/chips", "grid.cpu_workers=[1]",
            "workload.epochs=3", "workload.eval_every=3",  # only the final model is judged
            "workload.save_checkpoints=true", "hardware.cpus_per_worker=2"]
    spec = load_sweep(ROOT / "sweeps" / "xview3_cpu.yaml", sets)
    trial = expand(spec)[0]

    ctx = WorkerContext(0, 0, 1, 0, torch.device("cpu"), trial.hardware)
    torch.set_num_threads(2)
    untrained = workloads.get("xview3_frcnn")(trial.workload, ctx)
    untrained.setup()
    before = untrained.end_epoch(trial.workload.epochs - 1)  # the last epoch: always scored

    out = run_local(trial, str(tmp_path / "trials"))
    assert out.status == "ok", out.error
    m = out.metrics
    print({k: v for k, v in m.items() if k.startswith(("xview3/", "det/", "train/epoch"))},
          "untrained:", before)
    assert m["xview3/detection_f1"] >= 0.5
    assert m["xview3/detection_f1"] - before["xview3/detection_f1"] >= 0.4
    assert m["det/map50"] > before["det/map50"]
    for key in ("xview3/aggregate", "xview3/shore_f1", "xview3/vessel_f1", "xview3/fishing_f1",
                "xview3/length_score"):
        assert 0.0 <= m[key] <= 1.0
    assert np.isfinite(m["train/train_time_s"]) and m["train/epochs"] == trial.workload.epochs
    preds = pd.read_csv(next((tmp_path / "trials").glob("*/predictions.csv")))
    assert list(preds.columns) == ["detect_scene_row", "detect_scene_column", "scene_id",
                                   "is_vessel", "is_fishing", "vessel_length_m"]

    # Served: the kept weights through the Offline scenario, gated on the xView3 aggregate of
    # a pass over every validation chip; it is the figure training's evaluation gave them.
    val_chips = out.records[0]["describe"]["val_chips"]
    ckpt = next((tmp_path / "trials").glob("*/checkpoint/model.pt"))
    target = (before["xview3/aggregate"] + m["xview3/aggregate"]) / 2
    served = expand(load_sweep(ROOT / "sweeps" / "xview3_cpu.yaml", [
        *sets, f"workload.checkpoint={ckpt}", "inference.samples=32",
        "inference.project_samples=13368", f"inference.accuracy_target={target}"]))[0]
    out = run_local(served, str(tmp_path / "served"))
    assert out.status == "ok", out.error
    s = out.metrics
    print({k: v for k, v in s.items() if k.startswith("infer/")})
    assert s["infer/accuracy_metric"] == "xview3/aggregate" and s["infer/accuracy_ok"] is True
    assert s["infer/accuracy"] == pytest.approx(m["xview3/aggregate"], abs=1e-9)
    assert s["infer/score/xview3/detection_f1"] == pytest.approx(m["xview3/detection_f1"])
    assert s["infer/accuracy_compared"] == val_chips
    assert s["infer/samples"] == 32 and s["infer/samples_per_s"] > 0


@pytest.mark.parametrize("save", [True, "every_epoch"])
def test_checkpoints_best_model_beside_the_trial_and_every_epoch(tmp_path, save):
    """best_model.pt follows the best aggregate (and is the runner's checkpoint/model.pt);
    every_epoch adds epochs/epoch_NNN.pt for each epoch, evaluated or not."""
    cls = workloads.get("xview3_frcnn")
    w = cls.__new__(cls)
    w.params = cls.Params(save_checkpoints=save, epochs=3, eval_every=2)
    w.ctx = WorkerContext(0, 0, 1, 0, torch.device("cpu"), HardwareSpec(),
                          artifact_dir=str(tmp_path))
    w._model, w.best = torch.nn.Linear(2, 1), None
    preds = pd.DataFrame({c: [] for c in x3.PREDICTION_COLUMNS})
    for epoch, aggregate in [(0, 0.2), (1, 0.5), (2, 0.3)]:
        with torch.no_grad():
            w._model.weight.fill_(epoch)
        if save == "every_epoch":
            w._save_epoch(epoch)
        w._keep_best({"xview3/aggregate": aggregate, "epoch": epoch + 1}, preds)
    best = torch.load(tmp_path / "best_model.pt", weights_only=True)
    assert float(best["weight"][0, 0]) == 1.0  # the epoch with 0.5
    assert (tmp_path / "checkpoint" / "model.pt").samefile(tmp_path / "best_model.pt")
    epochs = sorted(p.name for p in (tmp_path / "epochs").glob("*.pt"))
    assert epochs == ([] if save is True else ["epoch_001.pt", "epoch_002.pt", "epoch_003.pt"])
    assert cls.saves_checkpoint(w.params)

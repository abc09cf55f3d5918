"""EfficientNet B0-B7: each variant at torchvision's native resolution unless set, the same
network torchvision builds, and a trial through the local runner with its FLOPs counted."""

from __future__ import annotations

import pytest
import torch
import torchvision

from raybench.context import WorkerContext
from raybench.grid import expand
from raybench.runners.local import run_local
from raybench.sections import HardwareSpec
from raybench.spec import SpecError, load_sweep
from raybench.workloads.efficientnet import Efficientnet, EfficientnetParams, native_resolution
from tests.conftest import ROOT


def test_native_resolutions_and_their_grid(write_sweep):
    assert [native_resolution(f"b{i}") for i in range(8)] == [224, 240, 288, 300, 380, 456,
                                                              528, 600]
    trials = expand(load_sweep(ROOT / "sweeps" / "efficientnet_cpu.yaml"))
    assert [(t.workload.variant, t.workload.image_size) for t in trials] == [("b0", 224),
                                                                             ("b1", 240)]
    path = write_sweep("name: e\nsystem: {label: a}\nworkload: {name: efficientnet, "
                       "image_size: 128}\ngrid: {variant: [b0, b7]}\n")
    assert {t.workload.image_size for t in expand(load_sweep(path))} == {128}  # as set
    with pytest.raises(SpecError, match="workload.variant"):
        load_sweep(write_sweep("name: e\nsystem: {label: a}\n"
                               "workload: {name: efficientnet, variant: b8}\n"))


@pytest.mark.parametrize("variant", ["b0", "b4"])
def test_the_network_is_torchvisions(variant):
    w = Efficientnet(EfficientnetParams(variant=variant, synthetic_samples=4),
                     WorkerContext(0, 0, 1, 0, torch.device("cpu"), HardwareSpec()))
    mine = w.build()
    theirs = getattr(torchvision.models, f"efficientnet_{variant}")(num_classes=1000)
    assert [tuple(p.shape) for p in mine.parameters()] == [tuple(p.shape)
                                                           for p in theirs.parameters()]
    assert mine.classifier[0].p == theirs.classifier[0].p  # the variant's own dropout


def test_a_trial_runs_and_counts_its_flops(write_sweep):
    path = write_sweep("name: e\nsystem: {label: a}\nworkload: {name: efficientnet, "
                       "image_size: 64, num_classes: 10, batch_size: 4, synthetic_samples: 64}\n"
                       "hardware: {dataloader_workers: 0}\n"
                       "measure: {warmup_steps: 1, measure_steps: 3}\n")
    (trial,) = expand(load_sweep(path))
    out = run_local(trial)
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["train/samples_per_s"] > 0 and m["train/measured_steps"] == 3
    # B0 at 64 px: (64/224)^2 of the 2.29 GFLOPs a 224 px training step counts, give or take
    # the resolution-independent classifier and the padding of small feature maps
    assert 0.15 < m["perf/gflops_per_sample"] < 0.25
    assert m["model/params_m"] == pytest.approx(4.02, abs=0.01)  # 10 classes, not 1000


def test_bench_overhead_names_a_workload_without_a_bare_twin(write_sweep):
    """A bare twin is a workload's own (bench/twins.TWINS): EfficientNet, a member of the
    ResNet family, has none, and bench overhead says so and sets Ray against torchrun alone."""
    from raybench.bench.twins import bare_loop, without_twin

    path = write_sweep("name: e\nsystem: {label: cpu}\n"
                       "workload: {name: efficientnet, variant: b0, image_size: 32}\n")
    (trial,) = expand(load_sweep(path))
    assert "efficientnet has no bare twin" in without_twin(trial)
    with pytest.raises(ValueError, match="efficientnet has no bare twin"):
        bare_loop(trial)

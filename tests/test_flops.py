"""FLOP counts against published figures, the peak table and MFU's unknowns."""

from __future__ import annotations

import pytest
import torch
import torchvision

from raybench.flops import flops_per_sample, mfu, peak_memory_gb_s, peak_tflops
from raybench.metrics import summarize
from tests.test_metrics import record


def test_resnet50_224_matches_published_count():
    model = torchvision.models.resnet50()
    x = torch.zeros(1, 3, 224, 224)
    forward = flops_per_sample(model, x, train=False)
    # published "4.1 GFLOPs" are multiply-adds; the counter counts 2 FLOPs per multiply-add
    assert forward / 2 == pytest.approx(4.1e9, rel=0.02)
    step = flops_per_sample(model, x, train=True)
    assert step / forward == pytest.approx(3.0, rel=0.03)  # backward ~ 2x forward
    assert next(model.parameters()).device.type == "cpu"  # counted on a copy


@pytest.mark.parametrize("groups", [1, 4, 64])
def test_convolution_backward_costs_twice_its_forward_whatever_the_groups(groups):
    """torch 2.15's formula counted the weight gradient of a grouped convolution as a dense
    one (65x the forward for a depthwise 3x3 over 64 channels)."""
    conv = torch.nn.Sequential(torch.nn.Conv2d(8, 64, 1),  # so the grouped one has an input grad
                               torch.nn.Conv2d(64, 64, 3, padding=1, groups=groups, bias=False))
    x = torch.zeros(1, 8, 28, 28)
    first = 2 * 8 * 64 * 28 * 28  # 1x1: forward; its backward computes no input gradient
    grouped = 2 * 64 * (64 // groups) * 9 * 28 * 28
    assert flops_per_sample(conv, x, train=False) == first + grouped
    assert flops_per_sample(conv, x, train=True) == (first + grouped) + first + 2 * grouped


def test_depthwise_network_counts_three_forwards_per_training_step():
    """EfficientNet-B0 at 224 px: torchvision publishes 0.386 G multiply-adds per image."""
    model = torchvision.models.efficientnet_b0()
    x = torch.zeros(1, 3, 224, 224)
    forward = flops_per_sample(model, x, train=False)
    assert forward / 2e9 == pytest.approx(0.386, rel=0.01)
    assert 2.9 < flops_per_sample(model, x, train=True) / forward < 3.0


def test_peak_table_and_unknowns():
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 67.0
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.5
    assert peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.5
    assert peak_tflops("NVIDIA B200", "bf16") == 2250.0
    assert peak_tflops("NVIDIA GB200", "bf16") == 2500.0  # longest key, not "B200"
    # Blackwell Ultra and the FP8 tensor cores (half the datasheets' sparse figures)
    assert peak_tflops("NVIDIA B300 SXM6 AC", "bf16") == 2250.0
    assert peak_tflops("NVIDIA GB300", "fp8") == 5000.0  # not the B300's 4,500
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1979.0
    assert peak_tflops("NVIDIA H200", "fp8") == 1979.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None  # Ampere has no FP8 cores
    assert peak_memory_gb_s("NVIDIA GB300") == 8000.0
    assert peak_tflops("NVIDIA GeForce RTX 3080 Ti Laptop GPU", "amp_fp16") == 47.2
    assert peak_tflops("NVIDIA GeForce RTX 3080 Ti", "bf16") is None  # the desktop card differs
    # the device names these GPUs report, each matched as a whole word
    assert peak_tflops("Tesla V100-SXM2-16GB", "amp_fp16") == 125.0
    assert peak_tflops("Tesla V100-PCIE-32GB", "fp32") == 14.0
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None  # no BF16 tensor cores
    assert peak_tflops("Tesla T4", "amp_fp16") == 65.0
    assert peak_tflops("NVIDIA L4", "bf16") == 121.0
    assert peak_tflops("NVIDIA L40S", "bf16") == 362.05  # not the L4's
    assert peak_tflops("NVIDIA L40", "bf16") is None  # another card, not in the table
    assert peak_tflops("NVIDIA H100 NVL", "tf32") == 417.5
    assert peak_tflops("NVIDIA RTX A4000", "fp32") is None  # "T4"/"A4" are not inside words
    assert peak_tflops("cpu", "fp32") is None
    assert peak_tflops(None, "bf16") is None
    achieved, util = mfu(8e9, 10_000.0, "NVIDIA H100 80GB HBM3", "bf16")
    assert achieved == pytest.approx(80.0) and util == pytest.approx(80.0 / 989.5)
    assert mfu(8e9, 10_000.0, "Some Future GPU", "bf16") == (pytest.approx(80.0), None)
    assert mfu(None, 10.0, "NVIDIA A100", "bf16") == (None, None)


def test_metrics_carry_mfu_and_input_bound():
    r = record(0, 0.1, wait_s=0.03)
    r.update(flops_per_sample=24e9, device_name="NVIDIA A100-SXM4-40GB", precision="bf16")
    m = summarize([r])
    assert m["perf/gflops_per_sample"] == pytest.approx(24.0)
    assert m["perf/achieved_tflops_per_gpu"] == pytest.approx(24e9 * 320 / 1e12)
    assert m["perf/mfu_pct"] == pytest.approx(100 * 24e9 * 320 / 1e12 / 312.0)
    assert m["train/input_bound"] is True  # 30% of the step waiting for data
    assert summarize([record(0, 0.1)])["perf/mfu_pct"] is None

"""FLOPs per sample and model FLOPs utilisation (MFU) against a peak table.

Owns counting (torch.utils.flop_counter, once per model and input shape, on the meta device so
it costs no compute) and the peak table. Conventions: a multiply-add counts as 2 FLOPs, as
torch's counter and the GPU datasheets do (papers that quote ResNet-50 at "4.1 GFLOPs" count
multiply-adds); a training step is forward + backward as counted, not a 3x rule of thumb. MFU is
None, never 0, when the GPU or the precision is not in the table.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense (no sparsity) peak TFLOP/s per GPU by precision. "fp32" means plain FP32 (no TF32);
# amp_fp16 and bf16 use the tensor-core FP16/BF16 figure.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5, BF16/FP16 tensor 312 (dense).
    "A100": {"fp32": 19.5, "amp_fp16": 312.0, "bf16": 312.0},
    # NVIDIA H100 datasheet, SXM5: FP32 67, BF16/FP16 tensor 989 (dense; 1,979 with sparsity).
    "H100 80GB HBM3": {"fp32": 67.0, "amp_fp16": 989.0, "bf16": 989.0},
    "H100 SXM": {"fp32": 67.0, "amp_fp16": 989.0, "bf16": 989.0},
    # NVIDIA H100 datasheet, PCIe: FP32 51, BF16/FP16 tensor 756 (dense).
    "H100 PCIe": {"fp32": 51.0, "amp_fp16": 756.0, "bf16": 756.0},
    # NVIDIA H200 datasheet, SXM: same compute as H100 SXM (FP32 67, BF16/FP16 989 dense).
    "H200": {"fp32": 67.0, "amp_fp16": 989.0, "bf16": 989.0},
}


def peak_tflops(gpu_name: str | None, precision: str) -> float | None:
    """The table's figure for the longest key contained in the device name, else None."""
    if not gpu_name:
        return None
    matches = [k for k in PEAK_TFLOPS if k.lower() in gpu_name.lower()]
    if not matches:
        return None
    return PEAK_TFLOPS[max(matches, key=len)].get(precision)


def flops_per_sample(model: torch.nn.Module, example: torch.Tensor, train: bool) -> float:
    """FLOPs of one sample (forward, plus backward when `train`), counted on the meta device.

    The copy is made with every parameter and buffer pre-mapped to a meta tensor, so counting
    never duplicates the weights on the GPU or in host memory (a 600M-parameter ViT would)."""
    memo: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    meta_model = copy.deepcopy(model, memo)
    x = example[:1].detach().to("meta")
    counter = FlopCounterMode(display=False)
    with counter:
        if train:
            meta_model(x).sum().backward()
        else:
            with torch.no_grad():
                meta_model(x)
    return float(counter.get_total_flops())


def mfu(flops_per_sample_: float | None, samples_per_s_per_gpu: float | None,
        gpu_name: str | None, precision: str) -> tuple[float | None, float | None]:
    """(achieved TFLOP/s per GPU, MFU fraction); MFU None when the peak is unknown."""
    if not flops_per_sample_ or not samples_per_s_per_gpu:
        return None, None
    achieved = flops_per_sample_ * samples_per_s_per_gpu / 1e12
    peak = peak_tflops(gpu_name, precision)
    return achieved, (achieved / peak if peak else None)

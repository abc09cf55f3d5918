"""FLOPs per sample and model FLOPs utilisation (MFU) against a peak table.

Owns counting (torch.utils.flop_counter, once per model and input shape, on the meta device so
it costs no compute, or on one real call for models whose work depends on the data) and the
peak table. Conventions: a multiply-add counts as 2 FLOPs, as
torch's counter and the GPU datasheets do (papers that quote ResNet-50 at "4.1 GFLOPs" count
multiply-adds); a training step is forward + backward as counted, not a 3x rule of thumb. MFU is
None, never 0, when the GPU or the precision is not in the table. One formula of torch's is
replaced: its convolution backward ignores `groups` (see _conv_backward_flop). torch is imported
where counting runs: the peak table and `mfu` are read where torch is never loaded (Tune's trial
process, through metrics).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

# Dense (no sparsity) peak TFLOP/s per GPU by precision, from NVIDIA's datasheets, which quote
# tensor-core figures "with sparsity": the dense figure is half of it. "fp32" is plain FP32 on the
# CUDA cores (raybench turns TF32 off for it, see context.set_math_mode), "tf32" the TF32 tensor
# cores, amp_fp16 and bf16 the FP16/BF16 tensor cores, "fp8" the FP8 tensor cores (a trial's
# fp8 matmuls, `workload.fp8` of the llama workload; not a `hardware.precision`). Clock
# convention: every datasheet figure is at the GPU's maximum boost clock; a GPU its power or
# thermal limit holds below that reads a lower MFU than its silicon at full clock (the report's
# SM clock column shows it; GB200's MFU moves by about 12% with the clock assumed).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # A100 Tensor Core GPU datasheet (SXM and PCIe alike): FP32 19.5, TF32 156, BF16/FP16 312.
    "A100": {"fp32": 19.5, "tf32": 156.0, "amp_fp16": 312.0, "bf16": 312.0},
    # H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67, TF32 989*, BF16/FP16 1,979*
    # (* with sparsity). The SXM part names itself "NVIDIA H100 80GB HBM3".
    # FP8 3,958*.
    "H100 80GB HBM3": {"fp32": 67.0, "tf32": 494.5, "amp_fp16": 989.5, "bf16": 989.5,
                       "fp8": 1979.0},
    "H100 SXM": {"fp32": 67.0, "tf32": 494.5, "amp_fp16": 989.5, "bf16": 989.5, "fp8": 1979.0},
    # Same datasheet, H100 PCIe column: FP32 51, TF32 756*, BF16/FP16 1,513*, FP8 3,026*.
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "amp_fp16": 756.5, "bf16": 756.5, "fp8": 1513.0},
    # Same datasheet, H100 NVL column (per GPU): FP32 60, TF32 835*, BF16/FP16 1,671*, FP8
    # 3,341*.
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "amp_fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
    # H200 Tensor Core GPU datasheet, H200 SXM column: FP32 67, TF32 989*, BF16/FP16 1,979*,
    # FP8 3,958*.
    "H200": {"fp32": 67.0, "tf32": 494.5, "amp_fp16": 989.5, "bf16": 989.5, "fp8": 1979.0},
    # NVIDIA's GB200 NVL72 / HGX B200 specifications, "individual Blackwell GPU" rows (tensor
    # figures with sparsity). HGX B200: FP32 75, TF32 2.2 PF*, FP16/BF16 4.5 PF*, FP8 9 PF*.
    "B200": {"fp32": 75.0, "tf32": 1100.0, "amp_fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
    # GB200 NVL72 (the GPU at up to 1,200 W): FP32 80, TF32 2.5 PF*, FP16/BF16 5 PF*, FP8 10
    # PF*. The device names itself "NVIDIA GB200", and the longest matching key wins over "B200".
    "GB200": {"fp32": 80.0, "tf32": 1250.0, "amp_fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0},
    # Blackwell Ultra. NVIDIA's HGX B300 specifications, per GPU (the 8-GPU board's figures over
    # 8): FP32 75 (600 TF), TF32 2.25 PF* (18 PF*), FP16/BF16 4.5 PF* (36 PF*), FP8 9 PF*
    # (72 PF*): no faster than B200 but for FP4, which raybench does not train in.
    "B300": {"fp32": 75.0, "tf32": 1125.0, "amp_fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
    # GB300 NVL72 specifications, the rack's dense figures over its 72 GPUs (the GPU at up to
    # 1,400 W): FP16/BF16 2.5 PF (180 PF dense), FP8 5 PF (360 PF dense), TF32 1.25 PF; FP32
    # 80, the per-GPU figure of the Blackwell Ultra tables (not a training precision here).
    "GB300": {"fp32": 80.0, "tf32": 1250.0, "amp_fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0},
    # Tesla V100 datasheet: single precision 15.7 (SXM2) / 14 (PCIe), tensor performance
    # (FP16 multiply, FP32 accumulate) 125 / 112, no sparsity. Volta has no TF32 or BF16 tensor
    # cores: "tf32" runs in FP32, and bf16 has no peak to compare with (MFU None).
    "V100-SXM2": {"fp32": 15.7, "tf32": 15.7, "amp_fp16": 125.0},
    "V100-PCIE": {"fp32": 14.0, "tf32": 14.0, "amp_fp16": 112.0},
    # NVIDIA T4 datasheet: single precision 8.1, mixed precision (FP16/FP32) 65; Turing has no
    # TF32 or BF16 tensor cores either.
    "T4": {"fp32": 8.1, "tf32": 8.1, "amp_fp16": 65.0},
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* (* with sparsity).
    "L4": {"fp32": 30.3, "tf32": 60.0, "amp_fp16": 121.0, "bf16": 121.0, "fp8": 242.5},
    # NVIDIA L40S datasheet: FP32 91.6, TF32 366*, BF16/FP16 733*, FP8 1,466* (dense: half).
    "L40S": {"fp32": 91.6, "tf32": 183.0, "amp_fp16": 362.05, "bf16": 362.05, "fp8": 733.0},
    # GeForce RTX 3080 Ti Laptop GPU: no datasheet gives TFLOP/s, so the figure is derived: 58 SMs
    # (7,424 CUDA cores) at the top of NVIDIA's published boost range (1,590 MHz; laptops ship
    # 1,125-1,590 by power limit) times the GA10x per-SM rates of the NVIDIA Ampere GA102
    # architecture whitepaper (FP32 256, TF32 256, FP16/BF16 with FP32 accumulate 512 FLOP per
    # clock, dense). A laptop held to a lower power limit runs below this peak, so its MFU reads
    # lower than the silicon's at full clock.
    "RTX 3080 Ti Laptop": {"fp32": 23.6, "tf32": 23.6, "amp_fp16": 47.2, "bf16": 47.2},
}


# Device memory bandwidth per GPU in GB/s (10^9 bytes/s), from NVIDIA's datasheets: the
# figure a device copy (workloads/membw.py) is held against. The longest key found in the device
# name wins, as for PEAK_TFLOPS (A100 names its memory: "NVIDIA A100-SXM4-80GB").
PEAK_MEMORY_GB_S: dict[str, float] = {
    # NVIDIA A100 Tensor Core GPU datasheet: 40GB PCIe and SXM 1,555 GB/s; 80GB PCIe 1,935 GB/s;
    # 80GB SXM 2,039 GB/s.
    "A100": 1555.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    # H100 Tensor Core GPU datasheet: SXM 3.35 TB/s, PCIe 2 TB/s, NVL 3.9 TB/s.
    "H100 80GB HBM3": 3350.0,
    "H100 SXM": 3350.0,
    "H100 PCIe": 2000.0,
    "H100 NVL": 3900.0,
    # H200 Tensor Core GPU datasheet, H200 SXM column: 4.8 TB/s.
    "H200": 4800.0,
    # HGX B200 and GB200 NVL72 specifications, per GPU: 8 TB/s; HGX B300 and GB300 NVL72 the
    # same (GB300 NVL72: 576 TB/s over 72 GPUs).
    "B200": 8000.0,
    "GB200": 8000.0,
    "B300": 8000.0,
    "GB300": 8000.0,
    # Tesla V100 datasheet (SXM2 and PCIe): 900 GB/s.
    "V100": 900.0,
    # NVIDIA T4 datasheet: 320+ GB/s; L4 datasheet: 300 GB/s; L40S datasheet: 864 GB/s.
    "T4": 320.0,
    "L4": 300.0,
    "L40S": 864.0,
}


def peak_memory_gb_s(gpu_name: str | None) -> float | None:
    """PEAK_MEMORY_GB_S's figure for the device, as peak_tflops finds it, else None."""
    key = _table_key(PEAK_MEMORY_GB_S, gpu_name)
    return PEAK_MEMORY_GB_S[key] if key else None


def names_gpu(device_name: str, key: str) -> bool:
    """Whether the device name holds `key` as a whole word, case aside ("NVIDIA L40S" holds
    "L40S", not "L4")."""
    return re.search(rf"(?<![a-z0-9]){re.escape(key.lower())}(?![a-z0-9])",
                     device_name.lower()) is not None


def peak_tflops(gpu_name: str | None, precision: str) -> float | None:
    """The table's figure for the device at this precision, else None."""
    key = _table_key(PEAK_TFLOPS, gpu_name)
    return PEAK_TFLOPS[key].get(precision) if key else None


def _table_key(table: dict[str, Any], gpu_name: str | None) -> str | None:
    """The longest key of a datasheet table found in the device name as a whole word ("L4"
    names "NVIDIA L4", not "NVIDIA L40S"; "B200" not "NVIDIA GB200"), else None."""
    matches = [k for k in table if gpu_name and names_gpu(gpu_name, k)]
    return max(matches, key=len) if matches else None


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation,
                        transposed, _output_padding, _groups, output_mask, out_shape,
                        **kwargs) -> int:
    """A convolution's backward: the input gradient and the weight gradient each cost what
    the forward costs (the same multiply-adds, rearranged). torch's own formula (2.15) counts
    the weight gradient as a dense convolution of the transposed input and gradient, ignoring
    groups: a depthwise 3x3 over 64 channels counted 65x its forward, EfficientNet-B0's
    training step 32.2 GFLOPs instead of 2.3."""
    # torch: flops is imported where torch is not (the loader, the report)
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _counter() -> FlopCounterMode:
    import torch  # torch: flops is imported where torch is not (the loader, the report)
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.convolution_backward: _conv_backward_flop})


def flops_per_sample(model: torch.nn.Module, example: torch.Tensor, train: bool) -> float:
    """FLOPs of one sample (forward, plus backward when `train`), counted on the meta device.

    The copy is made with every parameter and buffer pre-mapped to a meta tensor, so counting
    never duplicates the weights on the GPU or in host memory (a 600M-parameter ViT would)."""
    import torch  # torch: flops is imported where torch is not (the loader, the report)

    memo: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    meta_model = copy.deepcopy(model, memo)
    x = example[:1].detach().to("meta")
    counter = _counter()
    with counter:
        if train:
            meta_model(x).sum().backward()
        else:
            with torch.no_grad():
                meta_model(x)
    return float(counter.get_total_flops())


def counted(call: Callable[[], Any], samples: int) -> float | None:
    """FLOPs per sample of one real `call` on its own device; None when it counts none.

    For models whose work depends on the data, which the meta device cannot run: a detector's
    proposals and sampled regions, a decoder's growing cache. The caller keeps the call off
    every timing and free of side effects on the measured model."""
    counter = _counter()
    with counter:
        call()
    total = counter.get_total_flops()
    return float(total) / samples if total and samples else None


def mfu(flops_per_sample_: float | None, samples_per_s_per_gpu: float | None,
        gpu_name: str | None, precision: str) -> tuple[float | None, float | None]:
    """(achieved TFLOP/s per GPU, MFU fraction); MFU None when the peak is unknown."""
    if not flops_per_sample_ or not samples_per_s_per_gpu:
        return None, None
    achieved = flops_per_sample_ * samples_per_s_per_gpu / 1e12
    peak = peak_tflops(gpu_name, precision)
    return achieved, (achieved / peak if peak else None)

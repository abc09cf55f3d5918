"""Compute probe: dense matrix multiplication, the device's own limit at a precision (TFLOP/s).

Owns the step (`batch_size` products C = A @ B of n x n matrices into a preallocated C, the
GEMM cuBLAS or the CPU's BLAS runs) and its exact work, 2n^3 FLOPs a product, so the row's
`perf/achieved_tflops` is the rate a rank reached and `perf/mfu_pct` its share of the
datasheet's dense peak (flops.PEAK_TFLOPS) for the trial's `hardware.precision`: fp32 and tf32
multiply float32 operands (IEEE or TF32 by the context's math mode), bf16 and amp_fp16 multiply
bfloat16 and float16 operands, as a mixed-precision model's matmuls run. On CPU the same GEMM
gives GFLOP/s. Inputs are random normal (zeros would let a sparsity-aware unit skip work), the
same on every rank; the product is never read, and the timed step synchronises the device.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from raybench.columns import Metric
from raybench.flops import peak_tflops
from raybench.records import RankRecord
from raybench.workloads import Probe, WorkloadParams, register

# the operands' type per hardware.precision (fp32 and tf32 differ in the math mode only)
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "amp_fp16": torch.float16}


class MatmulParams(WorkloadParams):
    batch_size: int = Field(8, ge=1, description="products per step")
    size: int = Field(8192, ge=16, description="n: each product is (n x n) @ (n x n); "
                      "8192 fills a data-centre GPU, a few hundred suit a CPU")


@register
class Matmul(Probe):
    name = "matmul"
    Params = MatmulParams
    params: MatmulParams
    headline_metric = "probe/matmul_tflops"
    datasheet_metric = "probe/matmul_datasheet_tflops"
    measures_peak = True

    def setup(self) -> None:
        n = self.params.size
        dtype = DTYPES[self.ctx.hardware.precision]
        gen = torch.Generator().manual_seed(self.params.seed)
        self.a = torch.randn(n, n, generator=gen).to(self.ctx.device, dtype)
        self.b = torch.randn(n, n, generator=gen).to(self.ctx.device, dtype)
        self.c = torch.empty(n, n, dtype=dtype, device=self.ctx.device)

    def step(self, batch: Any) -> torch.Tensor | None:
        for _ in range(self.params.batch_size):
            torch.mm(self.a, self.b, out=self.c)
        return None

    def flops_per_sample(self) -> float:
        return 2.0 * self.params.size ** 3  # a sample is one product

    def describe(self) -> dict[str, Any]:
        return {"matmul_n": self.params.size, "matmul_dtype": str(self.a.dtype)}

    @classmethod
    def unsupported(cls, params: WorkloadParams, hardware: Any) -> tuple[str, str] | None:
        if hardware.precision in ("bf16", "amp_fp16") and not hardware.use_gpu:
            # CPUs emulate most half-precision GEMMs: a rate, but no limit of the hardware's
            return "hardware.precision", (f"{hardware.precision} products are a GPU probe; on "
                                          "CPU measure fp32")
        return super().unsupported(params, hardware)

    columns = (
        Metric("probe/matmul_tflops", "TFLOP/s", "dense matmul rate per rank: 2n^3 FLOPs a "
               "product over the median step time"),
        Metric("probe/matmul_n", "count", "n of the (n x n) @ (n x n) products"),
        Metric("probe/matmul_datasheet_tflops", "TFLOP/s", "the device's dense peak at the "
               "trial's precision on its datasheet (flops.PEAK_TFLOPS), where known"),
        Metric("probe/matmul_of_datasheet_pct", "%", "matmul rate over the datasheet's peak"),
    )

    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        """Per rank, over the median step (the mean rate is perf/achieved_tflops)."""
        first = records[0]
        n = first.describe["matmul_n"]
        step_s = cls.median_step_s(records)
        rate = 2.0 * n ** 3 * first.samples_per_step / step_s / 1e12
        sheet = peak_tflops(first.device_name, first.precision)
        return {"probe/matmul_tflops": rate, "probe/matmul_n": n,
                "probe/matmul_datasheet_tflops": sheet,
                "probe/matmul_of_datasheet_pct": 100.0 * rate / sheet if sheet else None}

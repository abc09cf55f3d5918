"""Interconnect probe: all-reduce over a sweep of message sizes, with nccl-tests' bandwidths.

Owns the step (one all-reduce of a float32 buffer across every rank, through the process
group: NCCL on GPUs, gloo on CPUs) and the definitions from nccl-tests: algorithm bandwidth =
bytes / time, bus bandwidth = algorithm bandwidth x 2(n-1)/n, the traffic each link of a ring
carries, so figures compare across rank counts and against link speeds (NVLink, InfiniBand).
The timed step is the collectives and nothing else, as nccl-tests times them. Message size is a
workload parameter, so a sweep's grid gives the size curve.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from pydantic import Field

from raybench.columns import Metric
from raybench.records import RankRecord
from raybench.workloads import Probe, WorkloadParams, register


class AllreduceParams(WorkloadParams):
    batch_size: int = Field(1, ge=1, description="all-reduces per step")
    message_mb: float = Field(64.0, gt=0, description="buffer size in MiB (float32)")


@register
class Allreduce(Probe):
    name = "allreduce"
    Params = AllreduceParams
    params: AllreduceParams

    def setup(self) -> None:
        n = self.floats_in(self.params.message_mb)
        # Zeros sum to zeros: values stay bounded over any number of all-reduces with no
        # rescaling between them (a div_ after each one was timed with it: bus bandwidth low).
        # Neither NCCL nor gloo looks at the values, so the traffic is the same.
        self.buffer = torch.zeros(n, dtype=torch.float32, device=self.ctx.device)

    def step(self, batch: Any) -> torch.Tensor | None:
        if self.ctx.distributed:
            for _ in range(self.params.batch_size):
                dist.all_reduce(self.buffer)
        return None

    def describe(self) -> dict[str, Any]:
        return {"message_bytes": self.buffer.numel() * 4}

    columns = (
        Metric("comm/message_mb", "MB", "size of the all-reduced buffer"),
        Metric("comm/time_per_op_us", "us", "median time of one all-reduce"),
        Metric("comm/algbw_gb_s", "GB/s", "algorithm bandwidth: bytes / time per operation"),
        Metric("comm/busbw_gb_s", "GB/s", "bus bandwidth: algbw x 2(n-1)/n (nccl-tests)"),
    )

    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        """nccl-tests' definitions: algbw = bytes / time per operation, busbw = algbw x
        2(n-1)/n. Time is the median compute time of a step over its operations."""
        message_bytes = records[0].describe["message_bytes"]
        n = len(records)
        ops = records[0].samples_per_step
        step_s = cls.median_step_s(records)
        algbw = message_bytes / (step_s / ops) / 1e9
        return {"comm/message_mb": message_bytes / 2**20,
                "comm/time_per_op_us": step_s / ops * 1e6,
                "comm/algbw_gb_s": algbw, "comm/busbw_gb_s": algbw * 2 * (n - 1) / n}

"""Transfer probe: copies between host and device memory (GB/s), pinned or pageable.

Owns the step (`batch_size` copies of `size_mb` MiB host -> device, `h2d`, or device -> host,
`d2h`) and its bytes (each copy moves `size_mb`). Pinned host memory is what DMA reads and
writes directly, the PCIe (or NVLink-C2C) link's rate; pageable memory is staged through a
driver buffer first, what a DataLoader without `pin_memory` gets. A card on a degraded link
(fewer lanes, an older generation) shows here first (`python -m raybench.validate` holds it
against the link NVML reports). Needs a GPU: on CPU there is no device memory to copy to.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from raybench.columns import Metric
from raybench.records import RankRecord
from raybench.workloads import Probe, WorkloadParams, register


class TransferParams(WorkloadParams):
    batch_size: int = Field(8, ge=1, description="copies per step")
    size_mb: float = Field(256.0, gt=0, description="MiB each copy moves")
    direction: Literal["h2d", "d2h"] = Field("h2d", description="host to device, or back")
    pinned: bool = Field(True, description="page-locked host memory (DMA), else pageable")


@register
class Transfer(Probe):
    name = "transfer"
    Params = TransferParams
    params: TransferParams
    headline_metric = "probe/transfer_gb_s"

    def setup(self) -> None:
        n = self.floats_in(self.params.size_mb)
        host = torch.ones(n, dtype=torch.float32, pin_memory=self.params.pinned)
        device = torch.zeros(n, dtype=torch.float32, device=self.ctx.device)
        self.src, self.dst = (host, device) if self.params.direction == "h2d" else (device, host)

    def step(self, batch: Any) -> torch.Tensor | None:
        for _ in range(self.params.batch_size):
            # asynchronous from pinned memory, as a DataLoader's copy is; the step's timer
            # synchronises the device before it stops
            self.dst.copy_(self.src, non_blocking=self.params.pinned)
        return None

    def describe(self) -> dict[str, Any]:
        return {"transfer_bytes": self.src.numel() * 4}

    @classmethod
    def unsupported(cls, params: WorkloadParams, hardware: Any) -> tuple[str, str] | None:
        if not hardware.use_gpu:
            return "hardware.num_gpus", "host-device copies need a GPU (set num_gpus >= 1)"
        return super().unsupported(params, hardware)

    columns = (
        Metric("probe/transfer_gb_s", "GB/s", "host-device copy bandwidth per rank: bytes "
               "over the median step time"),
    )

    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        moved = records[0].describe["transfer_bytes"] * records[0].samples_per_step
        step_s = cls.median_step_s(records)
        return {"probe/transfer_gb_s": moved / step_s / 1e9}

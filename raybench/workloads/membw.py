"""Memory probe: a device copy, the bandwidth of the device's own memory (GB/s), against the
datasheet where flops.PEAK_MEMORY_GB_S knows the device.

Owns the step (`batch_size` copies of one buffer into another on the rank's device, each
reading and writing `size_mb` MiB) and STREAM's rule for its bytes: a copy moves what it reads
plus what it writes, 2 x size. The buffers are far larger than any cache on a GPU (the default
1 GiB; an H100's L2 is 50 MB) so the rate is the memory's; on CPU the same copy measures the
host's memory (keep `size_mb` well above the last-level cache there too).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field

from raybench.columns import Metric
from raybench.flops import peak_memory_gb_s
from raybench.records import RankRecord
from raybench.workloads import Probe, WorkloadParams, register


class MembwParams(WorkloadParams):
    batch_size: int = Field(8, ge=1, description="copies per step")
    size_mb: float = Field(1024.0, gt=0, description="MiB each copy reads (and writes)")


@register
class Membw(Probe):
    name = "membw"
    Params = MembwParams
    params: MembwParams
    headline_metric = "probe/copy_gb_s"
    datasheet_metric = "probe/memory_datasheet_gb_s"

    def setup(self) -> None:
        n = self.floats_in(self.params.size_mb)
        # written once so that every page is backed before the timing (a first touch would be
        # the OS's work, not the memory's)
        if self.ctx.device.type == "cpu":
            # From numpy, which asks Linux for transparent huge pages on arrays of 4 MiB and more
            # (madvise; torch's CPU allocator does not): on 4 KiB pages a copy also measures its
            # page walks. Here, one thread, 128 MiB: torch's copy 15.9-17.5 GB/s on its own
            # pages, 18.6-19.3 on numpy's (docs/journal/2026-11.md, 2026-11-28).
            self.src = torch.from_numpy(np.full(n, 1.0, dtype=np.float32))
            self.dst = torch.from_numpy(np.full(n, 0.0, dtype=np.float32))
        else:
            self.src = torch.ones(n, dtype=torch.float32, device=self.ctx.device)
            self.dst = torch.zeros_like(self.src)

    def step(self, batch: Any) -> torch.Tensor | None:
        for _ in range(self.params.batch_size):
            self.dst.copy_(self.src)
        return None

    def describe(self) -> dict[str, Any]:
        return {"copy_bytes": self.src.numel() * 4}

    columns = (
        Metric("probe/copy_gb_s", "GB/s", "device copy bandwidth per rank: bytes read plus "
               "bytes written over the median step time (STREAM's copy)"),
        Metric("probe/memory_datasheet_gb_s", "GB/s", "the device's memory bandwidth on its "
               "datasheet (flops.PEAK_MEMORY_GB_S), where known"),
        Metric("probe/copy_of_datasheet_pct", "%", "copy bandwidth over the datasheet's"),
    )

    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        moved = 2 * records[0].describe["copy_bytes"] * records[0].samples_per_step
        step_s = cls.median_step_s(records)
        rate = moved / step_s / 1e9
        sheet = peak_memory_gb_s(records[0].device_name)
        return {"probe/copy_gb_s": rate, "probe/memory_datasheet_gb_s": sheet,
                "probe/copy_of_datasheet_pct": 100.0 * rate / sheet if sheet else None}

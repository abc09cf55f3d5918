"""A replica with a fixed, known service time: the calibration load for the inference scenarios.

Each call takes `service_ms` plus `per_sample_ms` per sample and does no other work, so queueing
theory says what the scenarios must measure (an offline throughput of replicas x batch /
service time; the Server rate at which a latency percentile crosses its bound, known in closed
form for one replica: an M/D/1 queue). Tests and users check the load generator against it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from pydantic import Field

from raybench.workloads import Servable, WorkloadParams, register


class FixedServiceParams(WorkloadParams):
    batch_size: int = Field(1, ge=1)
    service_ms: float = Field(10.0, ge=0, description="time of every call")
    per_sample_ms: float = Field(0.0, ge=0, description="added per sample in the call")


@register
class FixedService(Servable):
    name = "fixed_service"
    Params = FixedServiceParams
    params: FixedServiceParams

    def setup(self) -> None:
        self._model = torch.nn.Identity()

    setup_serving = setup

    def _work(self, n: int) -> None:
        # A sleep, not a spin: it overshoots by ~0.1 ms (the replica measures what it took),
        # but a spinning thread would hold the GIL for up to 5 ms and stall the in-process
        # load generator's thread, whose delays then show as latency.
        time.sleep((self.params.service_ms + n * self.params.per_sample_ms) / 1e3)

    def batches(self) -> Iterator[Any]:
        while True:
            yield self.params.batch_size

    def to_device(self, batch: Any) -> Any:
        return batch

    def step(self, batch: Any) -> None:
        self._work(batch)
        return None

    @classmethod
    def serving_inputs(cls, params: WorkloadParams, ids: np.ndarray) -> dict[str, np.ndarray]:
        return {"id": np.asarray(ids, dtype=np.int64)}

    def serve(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        self._work(len(inputs["id"]))
        return {"pred": inputs["id"] % 7}

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def trains(self) -> bool:
        return False

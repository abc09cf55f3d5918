"""Inference scenarios: a model served by replicas, measured the MLPerf Inference way.

`offline`: a dataset of `samples` pushed through `replicas` model copies as fast as they go
(Ray Data `map_batches` over a fixed actor pool; threads in-process): total, per-replica and
per-node throughput and the projected time of a dataset of `project_samples`. `server`: queries
with Poisson arrivals sent to the replicas; latency percentiles, and without a fixed `rate_qps`
a search for the highest rate whose percentile stays under `latency_bound_ms` (the MLPerf Server
rule). Either scenario checks accuracy against an fp32 reference pass when `accuracy_target` is
set. This module owns the `inference:` section; replica.py, offline.py, server.py and run.py the
rest. Nothing here imports Ray at module level.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from raybench.sections import STRICT


class InferenceSpec(BaseModel):
    model_config = STRICT
    scenario: Literal["offline", "server"] = "offline"
    replicas: int = Field(1, ge=1, description="model replicas, each with hardware.num_gpus "
                          "(0 or 1) GPUs and hardware.cpus_per_worker CPUs")
    samples: int = Field(512, ge=1, description="offline: samples pushed through the replicas")
    project_samples: int | None = Field(
        None, ge=1, description="offline: dataset size whose processing time is projected "
        "from the measured throughput (e.g. 13368)")
    warmup_batches: int = Field(2, ge=0, description="untimed batches per replica at start")
    query_samples: int = Field(1, ge=1, description="server: samples per query")
    max_batch_queries: int = Field(
        1, ge=1, description="server: a free replica takes up to this many waiting queries in "
        "one call (dynamic batching, no waiting for more); 1: one query per call")
    latency_bound_ms: float | None = Field(
        None, gt=0, description="server: the latency the percentile must stay under")
    latency_percentile: float = Field(99.0, gt=0, lt=100)
    rate_qps: float | None = Field(
        None, gt=0, description="server: one run at this Poisson arrival rate; unset: search "
        "the highest rate that keeps the latency percentile under latency_bound_ms")
    rate_max_qps: float | None = Field(
        None, gt=0, description="server: highest rate the search tries (default: 1.5x the "
        "replicas' measured capacity)")
    probe_seconds: float = Field(10.0, gt=0, description="server: length of each rate's run")
    min_queries: int = Field(200, ge=1, description="server: fewest queries a rate's run sends")
    search_seconds: float = Field(
        600.0, gt=0, description="server: no new rate is tried after this long; the row "
        "then says server/search_truncated")
    rate_tolerance_pct: float = Field(
        5.0, gt=0, description="server: the search stops when its bracket is this narrow")
    accuracy_target: float | None = Field(
        None, ge=0, le=1, description="agreement with an fp32 reference pass on the same "
        "inputs below which the run is invalid (top-1 for classifiers, per pixel for tiles, "
        "per token for the language model)")
    accuracy_samples: int = Field(64, ge=1, description="samples the agreement is measured on")
    seed: int = Field(0, description="seed of the Poisson arrivals")
    cuda_graphs: bool = Field(
        False, description="GPU replicas replay their forward as CUDA graphs, one captured per "
        "batch size (powers of two up to the largest call), each call padded to the next, as "
        "deployed inference does; an eager forward of a small batch is bound by the host's "
        "kernel launches. Workloads resnet and efficientnet")

    @model_validator(mode="after")
    def _server(self) -> InferenceSpec:
        if self.scenario == "server" and self.rate_qps is None and self.latency_bound_ms is None:
            raise ValueError("the server scenario needs latency_bound_ms to search a rate "
                             "under (or rate_qps for one run at a fixed rate)")
        return self

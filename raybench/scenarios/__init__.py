"""Inference scenarios: a model served by replicas, measured the MLPerf Inference way.

`offline`: a dataset of `samples` pushed through `replicas` model copies as fast as they go
(Ray Data `map_batches` over a fixed actor pool; threads in-process): total, per-replica and
per-node throughput and the projected time of a dataset of `project_samples`. `server`: queries
with Poisson arrivals sent to the replicas; latency percentiles, and without a fixed `rate_qps`
a search for the highest rate whose percentile stays under `latency_bound_ms` (the MLPerf Server
rule). Either scenario checks accuracy against an fp32 reference pass when `accuracy_target` is
set. The `inference:` section is sections.InferenceSpec; replica.py, offline.py, server.py and
run.py are the rest. Nothing here imports Ray at module level.
"""

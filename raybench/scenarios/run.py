"""One inference trial, on Ray (replica actors, Ray Data) or in this process (threads).

Owns starting the replicas and handing them to the scenario, the row metrics of the Server
scenario, and turning any failure into a row. the Ray runner calls `run_trial(...,
runner="ray")` from the driver, the local and torchrun runners `runner="local"`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from raybench import workloads
from raybench.columns import Metric, declare
from raybench.failures import failure
from raybench.records import TrialOutcome
from raybench.scenarios import dispatch, loadgen, mlperf, offline, rate_search, server
from raybench.scenarios.replica import Replica, local_devices
from raybench.trials import TrialSpec, derive

QUERY_POOL = 64  # distinct query inputs a Server run cycles through (made once, sent many times)

declare(
    Metric("server/rate_qps", "queries/s", "highest Poisson rate that met the latency bound"),
    Metric("server/met_bound", "bool", "a rate met the bound"),
    Metric("server/latency_bound_ms", "ms", "inference.latency_bound_ms"),
    Metric("server/latency_percentile", "%", "the percentile the bound applies to"),
    Metric("server/capacity_estimate_qps", "queries/s", "the search's start, from service times"),
    Metric("server/probes", "count", "rates tried"),
    Metric("server/search_truncated", "bool", "a probe ended at its query limit"),
    Metric("server/queries", "count", "queries of the rate shown"),
    Metric("server/max_batch_queries", "count", "inference.max_batch_queries"),
    Metric("server/queries_per_call", "score", "queries batched per replica call, mean"),
    Metric("server/samples_per_s", "samples/s", "server/rate_qps x samples per query"),
    Metric("server/p{q}_ms", "ms", "query latency percentile at the rate shown"),
    Metric("server/service_mean_ms", "ms", "a replica call's service time, mean"),
    Metric("server/dispatch_delay_p{q}_ms", "ms", "raybench's hand-off of a call, percentile: "
           "from when it could have begun (its first query arrived and its replica was free) "
           "to when the replica's thread began it"),
    Metric("server/call_overhead_ms", "ms", "a call's time on the dispatcher's clock beyond "
           "the replica's own service time, mean: the harness's share of every call (the "
           "way to and from a Ray actor included)"),
    Metric("server/ttft_p{q}_ms", "ms", "time to first token, percentile"),
    Metric("server/tpot_p{q}_ms", "ms", "time per output token after the first, percentile"),
    Metric("server/search", "text", "every probe (JSON list)"),
    Metric("server/ttft_bound_ms", "ms", "inference.ttft_bound_ms"),
    Metric("server/tpot_bound_ms", "ms", "inference.tpot_bound_ms"),
    Metric("server/late", "count", "queries of the rate shown over their bound (the most "
           "over any bound judged: latency, TTFT, TPOT)"),
    Metric("server/early_stopping", "text", "LoadGen's early-stopping verdict on the rate "
           "shown, per bound judged (met / not met): at most so many late of so many queries "
           "certifies the percentile with 99% confidence"),
    Metric("server/queries_needed", "count", "queries early stopping needs with the rate "
           "shown's late queries (the most over any bound)"),
    Metric("server/run_s", "s", "the rate shown's run: its last query's scheduled arrival"),
    Metric("server/mlperf_min_duration_met", "bool", "the run lasted MLPerf's 600 s"),
    Metric("server/mlperf_min_queries_met", "bool", "the run sent LoadGen's 100 queries"),
    Metric("server/rule", "text", "what a rate had to pass: mlperf (each percentile under its "
           "bound and certified by LoadGen's early stopping) or percentile (the percentile "
           "alone: inference.early_stopping false)"),
    Metric("server/confirm_runs", "count", "fresh arrival sequences the rate found had to "
           "pass too (inference.confirm_runs)"),
    Metric("server/confirm_steps", "count", "times the search's answer was lowered by its "
           "tolerance because a certifying or confirming run failed it"),
    Metric("server/certify_s", "s", "the length of each run that certified the rate by "
           "MLPerf's rule (inference.certify_seconds; empty where certify_queries fixed it)"),
    Metric("server/certify_queries", "count", "queries each certifying run sent "
           "(inference.certify_queries, else certify_seconds at the bracket's answer, rounded)"),
    Metric("server/certified_qps", "queries/s", "the highest rate every sequence passed; the "
           "rate reported is inference.rate_margin_pct under it (server/margin_pct)"),
    Metric("server/margin_pct", "%", "how far the rate reported sits under the highest "
           "certified (inference.rate_margin_pct)"),
)


def run_trial(trial: TrialSpec, runner: str, start_timeout_s: float = 30.0,
              logical_gpus: bool = False, artifacts: str | None = None) -> TrialOutcome:
    """`logical_gpus` (Ray only): GPUs are placement tokens, replicas compute on CPU.
    `artifacts`: the trial's own folder (LoadGen's logs go there)."""
    try:
        with _local_env(trial, runner):
            if workloads.get(trial.workload_name).generates:
                # token streams and their engines: only for a token workload's trials
                from raybench.scenarios.llm.run import run_trial as run_llm

                return run_llm(trial, runner, start_timeout_s, logical_gpus, artifacts)
            if trial.inference.scenario == "offline" and not trial.inference.loadgen:
                if runner == "ray":
                    records, stats = offline.run_ray(trial, start_timeout_s, logical_gpus)
                else:
                    records, stats = offline.run_local(trial, local_devices(trial))
                metrics = offline.summarize(records, stats, trial)
                return TrialOutcome(status="ok", metrics=metrics, records=records, ranks=stats)
            if runner == "ray":
                return _server_ray(trial, start_timeout_s, logical_gpus, artifacts)
            return _server_local(trial, artifacts)
    except Exception as e:  # a failed trial is a row
        return failure(e, trial.resources())


@contextmanager
def _local_env(trial: TrialSpec, runner: str) -> Iterator[None]:
    """Local replicas are threads of this process: the trial's `hardware.env` is set here for
    the trial's length. CUDA reads its variables once, so not after it has started here."""
    env = trial.hardware.env
    if runner == "ray" or not env:
        yield
        return
    if torch.cuda.is_initialized():
        raise RuntimeError("infeasible: hardware.env must be set before CUDA starts, and CUDA "
                           "already runs in this process (an earlier local trial); run the "
                           "sweep with --runner ray, where each trial has fresh processes")
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def query_ids(trial: TrialSpec, k: int) -> np.ndarray:
    """The samples of query k: queries cycle through QUERY_POOL distinct inputs."""
    q = trial.inference.query_samples
    return np.arange((k % QUERY_POOL) * q, (k % QUERY_POOL + 1) * q)


def server_outcome(trial: TrialSpec, best: dict[str, Any] | None, probes: list[dict[str, Any]],
                   stats: list[dict[str, Any]], capacity: float) -> TrialOutcome:
    """Row metrics of a Server run (pure): the rate found (or run) and its latencies."""
    inf = trial.inference
    shown = best or probes[-1]
    metrics: dict[str, Any] = {
        "server/rate_qps": best["rate_qps"] if best else None,
        "server/certified_qps": best.get("certified_qps") if best else None,
        "server/met_bound": best is not None,
        "server/latency_bound_ms": inf.latency_bound_ms,
        "server/latency_percentile": inf.latency_percentile,
        "server/capacity_estimate_qps": capacity,
        "server/probes": len(probes),
        "server/search_truncated": any(p.get("truncated") for p in probes),
        "server/queries": shown["queries"],
        "server/max_batch_queries": inf.max_batch_queries,
        "server/queries_per_call": shown.get("queries_per_call"),
        "server/samples_per_s": best["rate_qps"] * inf.query_samples if best else None,
        "server/ttft_bound_ms": inf.ttft_bound_ms, "server/tpot_bound_ms": inf.tpot_bound_ms,
        **mlperf.columns(shown), **rate_search.rule_columns(inf, probes),
    }
    for k in ("p50_ms", "p90_ms", "p99_ms", "service_mean_ms", "ttft_p50_ms", "ttft_p99_ms",
              "tpot_p50_ms", "tpot_p99_ms", "dispatch_delay_p50_ms", "dispatch_delay_p99_ms",
              "call_overhead_ms", f"p{inf.latency_percentile:g}_ms"):
        if k in shown:
            metrics[f"server/{k}"] = shown[k]
    metrics["server/search"] = json.dumps([
        {"rate_qps": round(p["rate_qps"], 4), f"p{inf.latency_percentile:g}_ms":
         p.get(f"p{inf.latency_percentile:g}_ms"), "passed": p["passed"],
         "queries": p["queries"], "sequence": p.get("sequence", 0),
         "confirming": p.get("confirming", False), "margin": p.get("margin", False),
         "early_stopping": {k: v.get("early_stopping") for k, v in
                            p.get("mlperf", {}).items()}}
        for p in probes])
    every = server.distinct_calls([r for p in probes for r in p["_run"]["records"]])
    metrics.update(offline.accuracy(every, stats, trial))
    metrics.update(offline.replica_facts(stats, metrics["server/samples_per_s"],
                                         trial.hardware.precision))
    lat = shown["_run"]["latency_s"]
    records = [{"probe": [_plain(p) for p in probes],
                "latency_ms": [None if not np.isfinite(x) else round(float(x) * 1e3, 4)
                               for x in lat]}]
    return TrialOutcome(status="ok", metrics=metrics, records=records, ranks=stats)


def _plain(probe: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in probe.items() if k != "_run"}


def _capacity(trial: TrialSpec, stats: list[dict[str, Any]],
              per_call: int | None = None) -> float:
    """Queries per second the replicas can answer back to back, from their warmup calls (of
    the largest batch of queries a call may take, `per_call` queries; default
    max_batch_queries); 0 where the sweep fixes the rate."""
    inf = trial.inference
    if inf.rate_qps is not None and per_call is None:
        return 0.0
    times = [s["warmup_service_s"] for s in stats if s.get("warmup_service_s")]
    if not times:
        raise ValueError("the server search needs inference.warmup_batches >= 1 to estimate "
                         "the replicas' capacity (or set rate_qps / rate_max_qps)")
    return sum((per_call or inf.max_batch_queries) / t for t in times)


def batch_ids(trial: TrialSpec, ks: list[int]) -> np.ndarray:
    """The sample ids of the queries `ks`, in order: one batched call's ids."""
    return np.concatenate([query_ids(trial, k) for k in ks])


def _query_inputs(trial: TrialSpec) -> list[dict[str, np.ndarray]]:
    cls = workloads.get(trial.workload_name)
    return [cls.serving_inputs(trial.workload, query_ids(trial, k)) for k in range(QUERY_POOL)]


def _server_local(trial: TrialSpec, artifacts: str | None) -> TrialOutcome:
    # Warmup calls carry batch_size samples; a query carries query_samples.
    trial = _query_sized(trial)
    replicas = [Replica(trial, i, d) for i, d in enumerate(local_devices(trial))]
    inputs = _query_inputs(trial)

    def serve_of(i: int) -> dispatch.Serve:
        def serve(ks: list[int]) -> dict[str, Any]:  # on the dispatcher's thread of replica i
            return replicas[i].serve_queries(batch_ids(trial, ks),
                                             *[inputs[k % QUERY_POOL] for k in ks])
        return serve

    return _serve(trial, [serve_of(i) for i in range(len(replicas))],
                  [r.stats() for r in replicas], lambda: [r.stats() for r in replicas],
                  artifacts)


def _serve(trial: TrialSpec, calls: list[dispatch.Serve], stats: list[dict[str, Any]],
           stats_of: Callable[[], list[dict[str, Any]]], artifacts: str | None
           ) -> TrialOutcome:
    """The scenario over ready replicas' calls (`stats`: their facts at start, `stats_of`
    asks them again after the run): the Server search (then, with inference.loadgen,
    LoadGen's run at the rate found), or LoadGen's Offline."""
    inf = trial.inference
    folder, shown = loadgen.log_folder(trial.key, artifacts) if inf.loadgen else (None, None)
    if inf.scenario == "offline":  # only with loadgen: raybench's own pass is offline.py's
        per_call = _offline_queries_per_call(trial)
        run = loadgen.run(calls, inf, "offline", _capacity(trial, stats, per_call), folder,
                          per_call, QUERY_POOL)
        stats = stats_of()
        metrics = {**offline.summarize(run["records"], stats, trial),
                   **loadgen.columns(run, shown)}
        return TrialOutcome(status="ok", metrics=metrics, records=run["records"], ranks=stats)
    capacity = _capacity(trial, stats)
    best, probes = rate_search.run_search(calls, inf, capacity)
    confirmed = None
    if inf.loadgen and best is not None:  # as a submitter works: the rate found, confirmed
        # as many queries as the certifying runs sent: at a rate certified by those, a shorter
        # run (LoadGen's minimum duration at a low rate) might not be certifiable at all
        confirmed = loadgen.run(calls, inf, "server", best["rate_qps"], folder,
                                inf.max_batch_queries, QUERY_POOL, min_queries=best["queries"])
    outcome = server_outcome(trial, best, probes, stats_of(), capacity)
    if confirmed is not None:
        outcome.metrics.update(loadgen.columns(confirmed, shown))
    return outcome


def _offline_queries_per_call(trial: TrialSpec) -> int:
    """LoadGen's Offline: a free replica takes up to a batch of waiting samples."""
    return max(1, trial.workload.batch_size // trial.inference.query_samples)


def _query_sized(trial: TrialSpec) -> TrialSpec:
    """The trial whose warmup batch is the largest call a replica takes (one query, or
    max_batch_queries of them), so the measured warmup time is that call's. LoadGen's
    Offline keeps the workload's batch, its largest call."""
    if trial.inference.scenario == "offline":
        return trial
    b = trial.inference.query_samples * trial.inference.max_batch_queries
    return derive(trial, rekey=False, workload={"batch_size": b})


class _RayServerReplica(Replica):
    def __init__(self, trial: TrialSpec, index: int, logical_gpus: bool):
        import ray  # Ray: only on its path; the local runner runs where Ray is not installed

        super().__init__(trial, index, node=ray.util.get_node_ip_address(),
                         logical_gpus=logical_gpus)


def _server_ray(trial: TrialSpec, start_timeout_s: float, logical_gpus: bool,
                artifacts: str | None) -> TrialOutcome:
    import ray  # Ray: only on its path; the local runner runs where Ray is not installed

    trial = _query_sized(trial)
    hw = trial.hardware
    actor = ray.remote(num_cpus=hw.cpus_per_worker, num_gpus=1 if hw.use_gpu else 0,
                       max_restarts=0, **offline.env_option(hw.env))(_RayServerReplica)
    replicas = [actor.remote(trial, i, logical_gpus) for i in range(trial.inference.replicas)]
    try:
        # Ready when their start-up (model, reference pass, warmup) is done; placement was
        # checked before, so the limit only bounds a start-up that never ends.
        stats = ray.get([r.stats.remote() for r in replicas], timeout=start_timeout_s + 300)
        refs = [ray.put(x) for x in _query_inputs(trial)]

        def serve_of(r: Any) -> dispatch.Serve:
            def serve(ks: list[int]) -> dict[str, Any]:  # on the dispatcher's thread of r
                # refs as arguments of their own: Ray resolves those, not refs inside a list
                return ray.get(r.serve_queries.remote(batch_ids(trial, ks),
                                                      *[refs[k % QUERY_POOL] for k in ks]))
            return serve

        return _serve(trial, [serve_of(r) for r in replicas], stats,
                      lambda: ray.get([r.stats.remote() for r in replicas], timeout=60),
                      artifacts)
    finally:
        for r in replicas:
            ray.kill(r)

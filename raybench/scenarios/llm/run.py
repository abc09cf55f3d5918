"""One LLM serving trial, on Ray (a threaded actor per replica, tokens streamed back as a Ray
streaming generator) or in this process (the engines' threads, the client on an event loop).

Owns starting the replicas (each request queued by a call, every request's tokens back on one
stream per replica), the three loads' runs (Offline, Server with its rate search,
closed-loop users), the row metrics, and turning any failure into a row.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import torch

from raybench import workloads
from raybench.columns import Metric, declare
from raybench.failures import failure
from raybench.records import TrialOutcome
from raybench.scenarios import loadgen, mlperf, offline, rate_search, server
from raybench.scenarios.llm import figures, lengths, load
from raybench.scenarios.llm.host import EngineHost
from raybench.scenarios.replica import local_devices
from raybench.trials import TrialSpec

# A replica actor's threads: its token stream holds one for the run; the rest take the calls
# (a request's submit, a failed probe's cancel, the window's measure), each a moment's work.
ACTOR_THREADS = 4

declare(
    Metric("serve/replica_requests", "text", "requests each replica served (JSON list): the "
           "router's balance"),
    Metric("serve/engine", "text", "what the engine was sized to (JSON: KV cache blocks, "
           "tokens per step)"),
    Metric("serve/client_lag_p99_ms", "ms", "a token's client stamp less its engine stamp, "
           "p99: what the way back to the client adds (one machine's clock: replicas on "
           "other nodes leave it empty)"),
)


def run_trial(trial: TrialSpec, runner: str, start_timeout_s: float = 30.0,
              logical_gpus: bool = False, artifacts: str | None = None) -> TrialOutcome:
    """`artifacts`: the trial's own folder (LoadGen's logs go there)."""
    try:
        if runner == "ray":
            return _on_ray(trial, start_timeout_s, logical_gpus, artifacts)
        return _local(trial, artifacts)
    except Exception as e:  # a failed trial is a row
        return failure(e, trial.resources())


def _local(trial: TrialSpec, artifacts: str | None) -> TrialOutcome:
    devices = local_devices(trial)
    threads = torch.get_num_threads()
    if not trial.hardware.use_gpu:
        # the intra-op threads Ray gives its CPU actors (OMP_NUM_THREADS: the CPUs reserved),
        # for the replicas together here, as rank/loop.py does for a training rank; on two
        # cores torch's default of two threads beside the client made the tiny Llama's
        # in-process engine 0.66 as fast as the same engine behind a one-CPU Ray actor
        torch.set_num_threads(max(1, int(trial.hardware.cpus_per_worker * len(devices))))
    hosts: list[EngineHost] = []
    try:
        for i, d in enumerate(devices):
            hosts.append(EngineHost(trial, i, d))
    except BaseException:  # the replicas already started stop with the one that failed
        for h in hosts:
            h.close()
        torch.set_num_threads(threads)
        raise
    try:
        def replica(h: EngineHost) -> load.Replica:
            async def submit(rid: str, prompt: list[int], n: int) -> None:
                h.submit(rid, prompt, n)

            async def end() -> None:
                h.end()

            async def cancel(rids: list[str]) -> None:
                h.cancel(rids)
            return load.Replica(submit, h.events, end, cancel)

        def measure(on: bool) -> list[dict[str, Any]]:
            return [h.measure(on) for h in hosts]

        return _scenario(trial, [replica(h) for h in hosts], measure,
                         lambda: [h.stats() for h in hosts], artifacts)
    finally:
        for h in hosts:
            h.close()
        torch.set_num_threads(threads)


def _on_ray(trial: TrialSpec, start_timeout_s: float, logical_gpus: bool,
            artifacts: str | None) -> TrialOutcome:
    import ray  # Ray: only on its path; the local runner runs where Ray is not installed

    hw = trial.hardware

    class RayHost:
        """A replica behind a threaded actor: its calls run on a few threads of the actor,
        the token stream (`EngineHost.stream`) holding one of them for the run."""

        def __init__(self, trial: TrialSpec, index: int, logical_gpus: bool):
            self.host = EngineHost(trial, index, node=ray.util.get_node_ip_address(),
                                   logical_gpus=logical_gpus)

        def submit(self, rid: str, prompt: list[int], n: int) -> None:
            self.host.submit(rid, prompt, n)

        def events(self) -> Iterator[list[tuple]]:
            yield from self.host.stream()

        def end(self) -> None:
            self.host.end()

        def cancel(self, rids: list[str]) -> None:
            self.host.cancel(rids)

        def stats(self) -> dict[str, Any]:
            return self.host.stats()

        def measure(self, on: bool) -> dict[str, Any]:
            return self.host.measure(on)

        def close(self) -> None:
            self.host.close()

    # the stream, a request's submit, a Server probe's cancel and the window's measure at once
    actor = ray.remote(num_cpus=hw.cpus_per_worker, num_gpus=1 if hw.use_gpu else 0,
                       max_restarts=0, max_concurrency=ACTOR_THREADS,
                       **offline.env_option(hw.env))(RayHost)
    actors = [actor.remote(trial, i, logical_gpus) for i in range(trial.inference.replicas)]
    try:
        # ready when start-up (engine, warmup, the accuracy check) is done; placement was
        # checked before, so the limit only bounds a start-up that never ends
        ray.get([a.stats.remote() for a in actors], timeout=start_timeout_s + 600)

        def replica(a: Any) -> load.Replica:
            async def submit(rid: str, prompt: list[int], n: int) -> None:
                await a.submit.remote(rid, prompt, n)

            async def events() -> AsyncIterator[list[tuple]]:
                async for ref in a.events.options(num_returns="streaming").remote():
                    yield await ref

            async def end() -> None:
                await a.end.remote()

            async def cancel(rids: list[str]) -> None:
                await a.cancel.remote(rids)
            return load.Replica(submit, events, end, cancel)

        def measure(on: bool) -> list[dict[str, Any]]:
            return ray.get([a.measure.remote(on) for a in actors], timeout=60)

        outcome = _scenario(trial, [replica(a) for a in actors], measure,
                            lambda: ray.get([a.stats.remote() for a in actors],
                                            timeout=60), artifacts)
        ray.get([a.close.remote() for a in actors], timeout=60)
        return outcome
    finally:
        for a in actors:
            ray.kill(a)


def _scenario(trial: TrialSpec, replicas: list[load.Replica], measure, stats_of,
              artifacts: str | None = None) -> TrialOutcome:
    inf = trial.inference
    cls = workloads.get(trial.workload_name)

    def prompt(k: int, n: int) -> list[int]:
        return cls.prompt(trial.workload, k, n)

    def go(spec: load.Load) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        measure(True)
        limit = (float(spec.arrivals[-1]) * 4 if spec.arrivals is not None and
                 len(spec.arrivals) else 0.0) + 600.0
        run = load.run_sync(replicas, spec, limit)
        return run, measure(False)

    extra: dict[str, Any] = {}
    if inf.scenario == "server":
        # the search starts from the replicas' warmup; one run at a fixed rate needs none
        capacity = _capacity(stats_of()) if inf.rate_qps is None else 0.0
        run, windows, extra = _server(trial, capacity, go, prompt)
    else:
        spec = load.Load(inf.samples, lengths.requests(inf, inf.samples), prompt,
                         users=inf.concurrency if inf.scenario == "concurrency" else None)
        run, windows = go(spec)
    records = run["records"]
    stats = stats_of()  # after the run: its peak memory
    metrics = figures.summarize(records, inf.replicas, *inf.token_bounds_s,
                                windowed=inf.scenario != "server")
    metrics.update(extra)
    metrics.update(_facts(trial, records, stats, windows))
    failed = [r["error"] for r in records if r["error"]]
    if failed and inf.scenario != "server":  # a Server probe past its limit cancels requests
        raise RuntimeError(f"{len(failed)} of {len(records)} requests failed: {failed[0]}")
    if inf.loadgen and (inf.scenario == "offline" or metrics.get("server/rate_qps")):
        # as a submitter works: LoadGen's own run, at the rate found (Offline: expecting the
        # rate just measured), judging TTFT and TPOT in its token-latency mode
        rate = (metrics["server/rate_qps"] if inf.scenario == "server"
                else metrics["serve/requests_per_s"])
        folder, shown = loadgen.log_folder(trial.key, artifacts)
        queries = metrics.get("server/queries") if inf.scenario == "server" else None
        log = loadgen.run_tokens(replicas, inf, inf.scenario, rate, folder,
                                 lengths.requests(inf, max(inf.min_queries, 64)), prompt,
                                 min_queries=queries)
        metrics.update(loadgen.columns(log, shown))
    return TrialOutcome(status="ok", metrics=metrics, records=[_kept(records)], ranks=stats)


def _server(trial: TrialSpec, capacity: float, go: Any, prompt: Any
            ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The Server scenario: one run at `rate_qps`, or the search from the replicas' capacity;
    the run shown (the best passing, else the last), its windows and the server columns."""
    inf = trial.inference
    ttft, tpot = inf.token_bounds_s
    count = [0]

    length = rate_search.RunLength(inf)

    def probe(rate: float, sequence: int = 0, certify: bool = False,
              rule: bool = False) -> dict[str, Any]:
        # a search probe judged by the percentile; a certifying run (or, with `rule`, a
        # fixed-rate run) by MLPerf's rule (scenarios/server.py)
        count[0] += 1
        gaps = server.unit_gaps(inf.seed, length(rate, certify), sequence)
        spec = load.Load(len(gaps), lengths.requests(inf, len(gaps)), prompt,
                         arrivals=np.cumsum(gaps) / rate, ttft_bound_s=ttft,
                         percentile=inf.latency_percentile, early_stopping=certify or rule,
                         tag=f"p{count[0]}")
        run, windows = go(spec)
        verdicts = figures.verdicts(run["records"], inf.latency_percentile, ttft, tpot,
                                    run["run_s"])
        out = {"rate_qps": rate, "queries": len(gaps), "run_s": run["run_s"],
               "mlperf": verdicts, "stopped_early": run["stopped_early"],
               "passed": server.passes(verdicts, run["stopped_early"], certify or rule),
               "_run": run, "_windows": windows}
        rate_search.say(out, certify, sequence, inf.latency_percentile)
        return out

    best, probes = rate_search.run_or_search(probe, inf, capacity)
    shown = best or probes[-1]
    return (shown["_run"], shown["_windows"],
            _server_columns(trial, best, probes, shown, capacity))


def _capacity(stats: list[dict[str, Any]]) -> float:
    """Requests per second the replicas finished in their warmup (a few at once each): where
    the Server search starts."""
    times = [(s["warmup_requests"], s["warmup_service_s"]) for s in stats
             if s.get("warmup_service_s")]
    if not times:
        raise ValueError("the server search needs inference.warmup_batches >= 1 to estimate "
                         "the replicas' capacity (or set rate_qps / rate_max_qps)")
    return sum(n / t for n, t in times)


def _server_columns(trial: TrialSpec, best: dict[str, Any] | None,
                    probes: list[dict[str, Any]], shown: dict[str, Any], capacity: float
                    ) -> dict[str, Any]:
    inf = trial.inference
    return {
        "server/rate_qps": best["rate_qps"] if best else None,
        "server/certified_qps": best.get("certified_qps") if best else None,
        "server/met_bound": best is not None,
        "server/latency_percentile": inf.latency_percentile,
        "server/ttft_bound_ms": inf.ttft_bound_ms, "server/tpot_bound_ms": inf.tpot_bound_ms,
        "server/capacity_estimate_qps": capacity, "server/probes": len(probes),
        "server/search_truncated": any(p.get("truncated") for p in probes),
        "server/queries": shown["queries"],
        "server/search": json.dumps([
            {"rate_qps": round(p["rate_qps"], 4), "passed": p["passed"],
             "queries": p["queries"], "stopped_early": p["stopped_early"],
             "sequence": p.get("sequence", 0), "confirming": p.get("confirming", False),
             "margin": p.get("margin", False),
             **{f"{k}_p{inf.latency_percentile:g}_ms": None if v["percentile_s"] == np.inf
                else round(v["percentile_s"] * 1e3, 3) for k, v in p["mlperf"].items()},
             "early_stopping": {k: v["early_stopping"] for k, v in p["mlperf"].items()}}
            for p in probes]),
        **mlperf.columns(shown), **rate_search.rule_columns(inf, probes),
    }


def _facts(trial: TrialSpec, records: list[dict[str, Any]], stats: list[dict[str, Any]],
           windows: list[dict[str, Any]]) -> dict[str, Any]:
    inf = trial.inference
    samples = [x for w in windows for x in w.get("kv", [])]
    served = [sum(1 for r in records if r["replica"] == i) for i in range(len(stats))]
    lag = [c - e for r in records for c, e in zip(r["stamps"], r["engine_stamps"],
                                                   strict=True)]
    one_node = len({s["node"] for s in stats}) == 1
    agreement = [{"matches": s["matches"], "compared": s["compared"]} for s in stats]
    return {
        "perf/headline_metric": "serve/output_tokens_per_s_per_gpu",
        "serve/input_tokens": float(np.mean([r["input_tokens"] for r in records])),
        "serve/output_tokens": float(np.mean([r["output_tokens"] for r in records])),
        "serve/concurrency": inf.concurrency if inf.scenario == "concurrency" else None,
        "serve/replica_cpu_util_pct": _most(windows, "cpu_util_pct"),
        "serve/replica_run_wait_pct": _most(windows, "run_wait_pct"),
        "serve/replica_busiest_thread_pct": _most(windows, "busiest_thread_pct"),
        "serve/replica_busiest_thread_wait_pct": _most(windows, "busiest_thread_wait_pct"),
        "serve/kv_use_peak_pct": 100 * max(samples) if samples else None,
        "serve/kv_use_mean_pct": 100 * float(np.mean(samples)) if samples else None,
        "serve/replica_requests": json.dumps(served),
        "serve/engine": json.dumps(stats[0].get("engine") if stats else None, default=str),
        "serve/client_lag_p99_ms": float(np.percentile(lag, 99) * 1e3)
        if lag and one_node else None,
        **figures.energy(records, [w.get("energy_j") for w in windows],
                         [w.get("power_mean_w") for w in windows]),
        "infer/replicas_used": sum(1 for x in served if x),
        "infer/setup_s": max(s["setup_s"] for s in stats) if stats else None,
        **offline.accuracy(agreement, stats, trial),
        **offline.replica_facts(stats, None, trial.hardware.precision),
    }


def _most(windows: list[dict[str, Any]], key: str) -> float | None:
    """The highest of the replicas' figures over the run; None where any lacks it."""
    values = [w.get(key) for w in windows]
    return max(values) if values and all(v is not None for v in values) else None


def _kept(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the trial's detail file keeps of its requests: each one's figures, not its
    stamps (tens of thousands of floats)."""
    out = []
    for r in records:
        f = figures.request_figures(r)
        out.append({"index": r["index"], "replica": r["replica"], "error": r["error"],
                    "tokens": len(r["stamps"]),
                    **{k: None if not np.isfinite(f[k]) else round(f[k] * 1e3, 3)
                       for k in ("ttft", "tpot", "e2e")}})
    return {"requests": out}

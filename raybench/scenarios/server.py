"""The Server scenario: Poisson arrivals, a shared queue in front of the replicas, latency.

Owns the arrival schedule (a seeded unit-rate Exponential sequence scaled by 1/rate, so every
probed rate replays the same arrival pattern and the latency percentile grows monotonically
with the rate, as in a single queue it must), the dispatcher (queries wait in one FIFO queue
and go to whichever replica is free: the least-loaded routing a serving front end does), the
latency figures, and the search for the highest rate whose percentile (at LoadGen's rank,
scenarios/mlperf.py) stays under the bound, with time to first token and time per output
token each under its own bound where set. Each probe also gets LoadGen's early-stopping
verdict, stated in the row; the search does not yet require it: with the shortest probe that
can be certified (459 queries at p99, none of them late) one late query fails a rate, and on
a 2-core VM a stall of the dispatcher made the search report 0.75 of the known limit
(docs/journal/2026-11.md). Latency runs from a query's scheduled arrival, so a generator that
falls behind cannot hide queueing. Replicas are plain async callables: Ray actors or threads.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from raybench.scenarios import mlperf

# query indices -> the replica's record of the one call that answered them all
Call = Callable[[list[int]], Awaitable[dict[str, Any]]]
MAX_PROBES = 16
# Below start / 2**HALVINGS the bound is out of reach: each halving doubles a probe's length
# (a probe sends at least min_queries), so going lower costs minutes and says nothing new.
HALVINGS = 5
# The GIL hand-over interval while in-process replicas serve: Python's 5 ms default lets a
# replica thread busy launching kernels hold the interpreter while the arrival and dispatch
# threads wait, and that wait would be counted as the replica's latency.
SWITCH_INTERVAL_S = 1e-3


def unit_gaps(seed: int, n: int) -> np.ndarray:
    """Inter-arrival gaps of a rate-1 Poisson process; divided by the rate when used."""
    return np.random.default_rng([seed, 0x5E7E]).exponential(1.0, n)


def query_count(rate: float, seconds: float, min_queries: int) -> int:
    return max(min_queries, math.ceil(rate * seconds))


async def run_load(replicas: Sequence[Call], rate: float, gaps: np.ndarray,
                   bound_s: float | None, percentile: float, max_batch: int = 1
                   ) -> dict[str, Any]:
    """Send len(gaps) queries at `rate`; returns the latencies (inf: never answered) and the
    replica records (per query: the record of the call that answered it). A free replica
    takes the oldest waiting query and, with `max_batch` > 1, up to max_batch - 1 more that
    are already waiting, in one call (dynamic batching without a wait, as a serving front end
    does it). With a bound, stops as soon as more queries were late than the percentile
    allows: the rest could not change the verdict."""
    loop = asyncio.get_running_loop()
    arrivals = np.cumsum(gaps) / rate
    n = len(arrivals)
    allowed_late = n - 1 - mlperf.rank(n, percentile)  # more late: the rank's query is late
    latency = np.full(n, np.inf)
    records: list[dict[str, Any] | None] = [None] * n
    queue: asyncio.Queue[int] = asyncio.Queue()
    late = 0
    errors: list[BaseException] = []
    failed = asyncio.Event()
    issued = asyncio.Event()
    halt = threading.Event()
    t0 = time.monotonic() + 0.01  # the loop's clock is time.monotonic too

    def issue() -> None:
        # A thread, not a coroutine: the event loop's timers wake up to 1 ms late (epoll's
        # millisecond timeout), which would show as latency; time.sleep is finer.
        for k, at in enumerate(arrivals):
            delay = t0 + at - time.monotonic()
            if delay > 0 and halt.wait(delay):
                return
            loop.call_soon_threadsafe(queue.put_nowait, k)
        loop.call_soon_threadsafe(issued.set)

    async def worker(call: Call) -> None:
        nonlocal late
        while True:
            batch = [await queue.get()]
            while len(batch) < max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                record = await call(batch)
                now = time.monotonic()
                for k in batch:
                    records[k] = record
                    latency[k] = now - (t0 + arrivals[k])
                    if bound_s is not None and latency[k] > bound_s:
                        late += 1
                if late > allowed_late:
                    failed.set()
            except Exception as e:  # a replica that fails ends the run: the trial is an error
                errors.append(e)
                failed.set()
                return
            finally:
                for _ in batch:
                    queue.task_done()

    workers = [asyncio.ensure_future(worker(c)) for c in replicas]
    issuer = threading.Thread(target=issue, name="raybench-arrivals", daemon=True)
    issuer.start()
    done_all = asyncio.ensure_future(_all_answered(issued, queue))
    stop = asyncio.ensure_future(failed.wait())
    # A replica that stops answering must not hang the sweep.
    limit = float(arrivals[-1]) * 4 + 120
    finished, _ = await asyncio.wait([done_all, stop], timeout=limit,
                                     return_when=asyncio.FIRST_COMPLETED)
    halt.set()
    issuer.join()
    for task in (*workers, done_all, stop):
        task.cancel()
    await asyncio.gather(*workers, done_all, stop, return_exceptions=True)
    if errors:
        raise errors[0]
    if not finished:
        raise TimeoutError(f"the replicas answered {int(np.isfinite(latency).sum())} of {n} "
                           f"queries at {rate:.4g} queries/s in {limit:.0f} s")
    return {"rate": rate, "latency_s": latency, "records": records,
            "duration_s": float(arrivals[-1]), "stopped_early": failed.is_set()}


async def _all_answered(issued: asyncio.Event, queue: asyncio.Queue) -> None:
    await issued.wait()
    await queue.join()


def summarize(run: dict[str, Any], bound_s: float | None, percentile: float,
              token_bounds_s: tuple[float | None, float | None] = (None, None)
              ) -> dict[str, Any]:
    """Percentiles of one rate's run and MLPerf's verdict on it (pure): each bound set (the
    query latency; time to first token and per output token, `token_bounds_s`) judged at
    LoadGen's rank, with LoadGen's early-stopping verdict beside it (stated, not yet
    required). Unanswered queries count as infinitely late."""
    lat = run["latency_s"]
    answered = [r for r in run["records"] if r is not None]
    calls = distinct_calls(run["records"])
    pct = mlperf.percentile_of(lat, percentile)
    verdicts = {}
    if bound_s is not None:
        verdicts["latency"] = mlperf.verdict(lat, bound_s, percentile, run.get("duration_s"))
    out: dict[str, Any] = {
        "rate_qps": run["rate"], "queries": len(lat), "answered": len(answered),
        **{f"p{q}_ms": _ms(mlperf.percentile_of(lat, q)) for q in (50, 90, 99)},
        f"p{percentile:g}_ms": _ms(pct),
        "service_mean_ms": float(np.mean([r["service_s"] for r in calls]) * 1e3)
        if calls else None,
        "queries_per_call": len(answered) / len(calls) if calls else None,
        "stopped_early": run["stopped_early"], "run_s": run.get("duration_s"),
    }
    tokens = [r for r in answered if r.get("first_token_s") is not None]
    if tokens:
        out.update(_token_figures(run, percentile, token_bounds_s, verdicts))
    elif any(b is not None for b in token_bounds_s):
        # token bounds on a workload whose replies carry no first-token time: nothing to judge
        verdicts["ttft"] = {"within_bound": False, "early_stopping": "no token times"}
    out["mlperf"] = verdicts
    out["passed"] = not run["stopped_early"] and all(v["within_bound"]
                                                     for v in verdicts.values())
    return out


def _token_figures(run: dict[str, Any], percentile: float,
                   bounds_s: tuple[float | None, float | None],
                   verdicts: dict[str, Any]) -> dict[str, Any]:
    """Time to first token (the latency less the decode part of the call) and per output token
    after it, percentiles; each bound set judged into `verdicts`. Unanswered: inf."""
    lat = run["latency_s"]
    done = [(lat[k], r) for k, r in enumerate(run["records"]) if r is not None]
    missing = [math.inf] * (len(lat) - len(done))
    ttft = np.array([lat_k - (r["service_s"] - r["first_token_s"]) for lat_k, r in done]
                    + missing)
    tpot = np.array([(r["service_s"] - r["first_token_s"]) / max(r["tokens"] - 1, 1)
                     for _, r in done] + missing)
    for name, values, bound in (("ttft", ttft, bounds_s[0]), ("tpot", tpot, bounds_s[1])):
        if bound is not None:
            verdicts[name] = mlperf.verdict(values, bound, percentile, run.get("duration_s"))
    return {"ttft_p50_ms": _ms(mlperf.percentile_of(ttft, 50)),
            "ttft_p99_ms": _ms(mlperf.percentile_of(ttft, 99)),
            "tpot_p50_ms": _ms(mlperf.percentile_of(tpot, 50)),
            "tpot_p99_ms": _ms(mlperf.percentile_of(tpot, 99))}


def distinct_calls(records: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Each replica call's record once (a batched call answered several queries)."""
    return list({id(r): r for r in records if r is not None}.values())


def _ms(seconds: float) -> float | None:
    return None if not math.isfinite(seconds) else float(seconds * 1e3)


def search_rate(probe: Callable[[float], dict[str, Any]], start: float, cap: float,
                tolerance_pct: float, budget_s: float = math.inf,
                clock: Callable[[], float] = time.monotonic,
                ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Highest passing rate: double from `start` (halve if it fails) until the verdict changes,
    then bisect until the bracket is within `tolerance_pct`. Returns the best passing probe
    (None: even the lowest rate tried failed) and every probe in order; no new probe starts
    after `budget_s` (the last probe then says `truncated`). Pure over `probe` and `clock`."""
    began = clock()
    probes: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    lo, hi = None, None  # highest passing, lowest failing rate
    rate = min(start, cap)
    while len(probes) < MAX_PROBES:
        if probes and clock() - began > budget_s:
            probes[-1]["truncated"] = True
            break
        result = probe(rate)
        probes.append(result)
        if result["passed"]:
            lo, best = rate, result if best is None or rate > best["rate_qps"] else best
        else:
            hi = rate
        if lo is not None and hi is not None:
            if hi / lo - 1 <= tolerance_pct / 100:
                break
            rate = math.sqrt(lo * hi)
        elif hi is None:  # everything so far passed
            if rate >= cap:
                break  # the limit is above what may be tried
            rate = min(rate * 2, cap)
        else:  # everything so far failed
            rate /= 2
            if rate < start / 2**HALVINGS:
                break
    return best, probes


def run_search(replicas: Sequence[Call], inf: Any, capacity_qps: float,
               ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The Server scenario over ready replicas: one fixed rate, or the search."""
    bound_s = inf.latency_bound_ms / 1e3 if inf.latency_bound_ms else None
    tokens_s = inf.token_bounds_s

    def probe(rate: float) -> dict[str, Any]:
        gaps = unit_gaps(inf.seed, query_count(rate, inf.probe_seconds, inf.min_queries))
        began = time.perf_counter()
        previous = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            run = asyncio.run(run_load(replicas, rate, gaps, bound_s, inf.latency_percentile,
                                       inf.max_batch_queries))
        finally:
            sys.setswitchinterval(previous)
        return {**summarize(run, bound_s, inf.latency_percentile, tokens_s),
                "wall_s": time.perf_counter() - began, "_run": run}

    if inf.rate_qps is not None:
        result = probe(inf.rate_qps)
        return (result if result["passed"] else None), [result]
    cap = inf.rate_max_qps or 1.5 * capacity_qps
    return search_rate(probe, min(0.5 * capacity_qps, cap), cap, inf.rate_tolerance_pct,
                       inf.search_seconds)

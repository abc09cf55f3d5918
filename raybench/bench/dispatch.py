"""`bench dispatch`: raybench's Server load against MLPerf's LoadGen on one replica of a known
service time, with busy processes beside them (issue 66, item 3).

Owns the comparison, not the dispatch (scenarios/dispatch.py) nor the search (server.py). Both
sides send Poisson queries through the same dispatcher to a replica that sleeps its service
time; what differs is who schedules and stamps them: raybench's arrival thread and clock, or
LoadGen's. Each round runs the same search (rate_search.search_rate, by the percentile alone, as
LoadGen's own rank gives it) with each side's probes, then the same search over the exact FIFO
queue of raybench's arrivals (the ideal that both approach from below). A round's sides replay
the same arrivals: raybench's first sequence of a seed is LoadGen's own schedule for that seed
(server.loadgen_gaps), so within a round they differ only in who schedules, stamps and
dispatches the queries, and rounds differ in luck.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from raybench.scenarios import loadgen, mlperf, rate_search, server
from raybench.scenarios.dispatch import Serve


def _spin() -> None:
    os.nice(0)
    while True:
        pass


@contextmanager
def busy(n: int) -> Iterator[None]:
    """`n` processes that keep a core busy each (nice 0) for the block's length."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        time.sleep(0.5 if n else 0)  # running before the first probe
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(timeout=10)


def sleeper(service_s: float) -> Serve:
    def serve(ks: list[int]) -> dict[str, Any]:
        began = time.perf_counter()
        time.sleep(service_s)
        return {"service_s": time.perf_counter() - began}
    return serve


def ideal_latencies(gaps: np.ndarray, rate: float, service_s: float) -> np.ndarray:
    """One FIFO server of a fixed time on these arrivals (Lindley's recursion)."""
    s = np.concatenate([[0.0], np.cumsum(service_s - gaps[1:] / rate)])
    return s - np.minimum(np.minimum.accumulate(s), 0.0) + service_s


def benchmark(service_ms: float, bound_ms: float, percentile: float, seconds: float,
              busy_procs: int, rounds: int, tolerance_pct: float) -> dict[str, Any]:
    """`rounds` seeds, each with the three searches (raybench's load, LoadGen's, the ideal
    queue's), `busy_procs` spinning processes beside them throughout."""
    serve = sleeper(service_ms / 1e3)
    previous = sys.getswitchinterval()
    # LoadGen's runs of the in-process replica under the same hand-over interval as
    # raybench's own (server.run_load sets it for its runs)
    sys.setswitchinterval(server.SWITCH_INTERVAL_S)
    try:
        with busy(busy_procs):
            out = [_round(serve, seed, service_ms, bound_ms, percentile, seconds,
                          tolerance_pct) for seed in range(rounds)]
    finally:
        sys.setswitchinterval(previous)
    ratio = [r["raybench"]["rate_qps"] / r["loadgen"]["rate_qps"] for r in out
             if r["raybench"]["rate_qps"] and r["loadgen"]["rate_qps"]]
    return {"service_ms": service_ms, "bound_ms": bound_ms, "percentile": percentile,
            "probe_seconds": seconds, "busy_processes": busy_procs, "rounds": out,
            "raybench_over_loadgen": ratio,
            "median_ratio": float(np.median(ratio)) if ratio else None,
            "median_rate_qps": {k: float(np.median([r[k]["rate_qps"] for r in out
                                                    if r[k]["rate_qps"]] or [np.nan]))
                                for k in ("raybench", "loadgen", "ideal")}}


def _round(serve: Serve, seed: int, service_ms: float, bound_ms: float, percentile: float,
           seconds: float, tolerance_pct: float) -> dict[str, Any]:
    """One seed's three searches: raybench's load, LoadGen's, the ideal queue's."""
    service, bound = service_ms / 1e3, bound_ms / 1e3

    def n_of(rate: float) -> int:
        return server.query_count(rate, seconds, 100)

    def ours(rate: float) -> dict[str, Any]:
        run = server.run_load([serve], rate, server.unit_gaps(seed, n_of(rate)), bound,
                              percentile, early_stopping=False)
        return server.summarize(run, bound, percentile, early_stopping=False)

    def theirs(rate: float) -> dict[str, Any]:
        inf = SimpleNamespace(latency_bound_ms=bound_ms, ttft_bound_ms=None,
                              latency_percentile=percentile, loadgen_seconds=seconds,
                              min_queries=100, seed=seed)
        with tempfile.TemporaryDirectory() as tmp:
            log = loadgen.run([serve], inf, "server", rate, Path(tmp), 1, 64)
        p_ms = loadgen.columns(log).get(f"loadgen/p{percentile:g}_ms")
        return {"rate_qps": rate, "passed": p_ms is not None and p_ms <= bound_ms}

    def ideal(rate: float) -> dict[str, Any]:
        lat = ideal_latencies(server.unit_gaps(seed, n_of(rate)), rate, service)
        return {"rate_qps": rate, "passed": mlperf.percentile_of(lat, percentile) <= bound}

    found: dict[str, Any] = {"seed": seed}
    start = 0.5 / service  # half the replica's capacity, as the Server search starts
    for name, probe in (("raybench", ours), ("loadgen", theirs), ("ideal", ideal)):
        began = time.monotonic()
        best, probes = rate_search.search_rate(probe, start, 4 * start, tolerance_pct)
        found[name] = {"rate_qps": best["rate_qps"] if best else None, "probes": len(probes),
                       "wall_s": round(time.monotonic() - began, 2)}
    return found

"""The Server scenario: Poisson arrivals, a shared queue in front of the replicas, latency.

Owns one rate's run and its figures: the arrival schedule (a seeded unit-rate Exponential
sequence scaled by 1/rate, so every probed rate replays the same arrival pattern and the
latency percentile grows monotonically with the rate, as in a single queue it must; the
seed's first sequence is LoadGen's own schedule for that seed, other sequences of the seed
for confirming runs), the run through the replicas' queue
(dispatch.py), and MLPerf's verdict on it, each bound set judged (scenarios/mlperf.py). The
search over rates is rate_search.py's. Latency runs from a query's scheduled arrival, so a
generator that falls behind cannot hide queueing.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from raybench.scenarios import dispatch, mlperf
from raybench.scenarios.dispatch import Serve

# The GIL hand-over interval while in-process replicas serve: Python's 5 ms default lets a
# replica thread busy launching kernels hold the interpreter while the arrival and dispatch
# threads wait, and that wait would be counted as the replica's latency.
SWITCH_INTERVAL_S = 1e-3


def unit_gaps(seed: int, n: int, sequence: int = 0) -> np.ndarray:
    """Inter-arrival gaps of a rate-1 Poisson process; divided by the rate when used.
    Sequence 0 is LoadGen's Server schedule for schedule_rng_seed = seed (loadgen_gaps), so
    LoadGen's run confirming a rate replays the arrivals raybench's certifying run had;
    `sequence` > 0: another arrival sequence of the same seed (the confirmation runs')."""
    if sequence == 0:
        return loadgen_gaps(seed, n)
    return np.random.default_rng([seed, 0x5E7E, sequence]).exponential(1.0, n)


def loadgen_gaps(seed: int, n: int) -> np.ndarray:
    """The unit gaps of LoadGen's Server schedule: its scheduler draws each next query's gap
    from std::exponential_distribution over a std::mt19937 seeded with schedule_rng_seed,
    -log(1 - u) with u = generate_canonical<double, 53> (two 32-bit words, libstdc++), the
    first query at once. numpy's legacy RandomState is the same Mersenne Twister with the
    same seeding; the SUT's receipt times of LoadGen 6.0.17's queries follow this to 0.014 ms
    at the median (tests/scenarios/test_loadgen.py)."""
    words = np.random.RandomState(seed % 2**32).randint(0, 2**32, size=2 * max(n - 1, 0),
                                                         dtype=np.uint64)
    u = (words[0::2] + words[1::2] * 2.0**32) / 2.0**64
    return np.concatenate([[0.0], -np.log1p(-u)])[:n]


def query_count(rate: float, seconds: float, min_queries: int, floor: int = 0) -> int:
    """Queries of a run at `rate`: `seconds` of them, at least min_queries and `floor`."""
    return max(min_queries, floor, math.ceil(rate * seconds))


def run_load(replicas: Sequence[Serve], rate: float, gaps: np.ndarray,
             bound_s: float | None, percentile: float, max_batch: int = 1,
             early_stopping: bool = True) -> dict[str, Any]:
    """Send len(gaps) queries at `rate`; returns the latencies (inf: never answered) and the
    replica records (per query: the record of the call that answered it). A free replica
    takes the oldest waiting query and, with `max_batch` > 1, up to max_batch - 1 more that
    are already waiting, in one call (dynamic batching without a wait, as a serving front end
    does it: dispatch.Fifo). With a bound, stops as soon as more queries were late than the
    rule allows (mlperf.stop_after): the rest could not change the verdict."""
    return _Load(np.cumsum(gaps) / rate, bound_s,
                 mlperf.stop_after(len(gaps), percentile, early_stopping)).run(
        replicas, rate, max_batch)


class _Load:
    """One run's state: its arrival offsets, each query's latency and record, each call's
    dispatch figures, and when it ends (every query answered, or too many late)."""

    def __init__(self, arrivals: np.ndarray, bound_s: float | None, allowed_late: int):
        self.arrivals, self.bound_s, self.allowed_late = arrivals, bound_s, allowed_late
        n = len(arrivals)
        self.latency = np.full(n, np.inf)
        self.records: list[dict[str, Any] | None] = [None] * n
        # each call's hand-off delay, its wall time on the dispatcher's clock, the replica's
        self.calls: list[tuple[float, float, float | None]] = []
        self.late = self.answered = 0
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.failed, self.ended, self.halt = (threading.Event(), threading.Event(),
                                              threading.Event())
        self.t0 = time.monotonic() + 0.01

    def done(self, call: dispatch.CallEnd) -> None:
        """A call's end, on its replica's thread."""
        if call.error is not None:  # a replica that fails ends the run: the trial is an error
            self.errors.append(call.error)
            self.failed.set()
            self.ended.set()
            return
        first = self.t0 + self.arrivals[call.items[0]]
        with self.lock:
            self.calls.append((call.start - max(first, call.free_since),
                               call.end - call.start, (call.record or {}).get("service_s")))
            for k in call.items:
                self.records[k] = call.record
                self.latency[k] = call.end - (self.t0 + self.arrivals[k])
                self.late += self.bound_s is not None and self.latency[k] > self.bound_s
            self.answered += len(call.items)
            if self.late > self.allowed_late:
                self.failed.set()
            if self.answered == len(self.arrivals) or self.failed.is_set():
                self.ended.set()

    def issue(self, fifo: dispatch.Fifo) -> None:
        """The arrivals, on a thread of their own: a thread's timed wait wakes finer than an
        event loop's timers (epoll's millisecond timeout), which would show as latency."""
        dispatch.fine_timers()
        for k, at in enumerate(self.arrivals):
            delay = self.t0 + at - time.monotonic()
            if delay > 0 and self.halt.wait(delay):
                return
            fifo.put(k)

    def run(self, replicas: Sequence[Serve], rate: float, max_batch: int) -> dict[str, Any]:
        previous = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            with dispatch.Fifo(replicas, max_batch, self.done) as fifo:
                issuer = threading.Thread(target=self.issue, args=(fifo,), daemon=True,
                                          name="raybench-arrivals")
                issuer.start()
                # A replica that stops answering must not hang the sweep.
                limit = float(self.arrivals[-1]) * 4 + 120
                finished = self.ended.wait(limit) or self.failed.is_set()
                self.halt.set()
                issuer.join()
        finally:
            sys.setswitchinterval(previous)
        if self.errors:
            raise self.errors[0]
        if not finished:
            raise TimeoutError(f"the replicas answered {int(np.isfinite(self.latency).sum())} "
                               f"of {len(self.arrivals)} queries at {rate:.4g} queries/s in "
                               f"{limit:.0f} s")
        return {"rate": rate, "latency_s": self.latency, "records": self.records,
                "calls": self.calls, "duration_s": float(self.arrivals[-1]),
                "stopped_early": self.failed.is_set()}


def summarize(run: dict[str, Any], bound_s: float | None, percentile: float,
              token_bounds_s: tuple[float | None, float | None] = (None, None),
              early_stopping: bool = True) -> dict[str, Any]:
    """Percentiles of one rate's run and MLPerf's verdict on it (pure): each bound set (the
    query latency; time to first token and per output token, `token_bounds_s`) judged at
    LoadGen's rank and by LoadGen's early stopping; the run passes where each does
    (`early_stopping` false: where each percentile is under its bound, the certification
    stated but not required). Unanswered queries count as infinitely late."""
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
    out.update(dispatch_figures(run.get("calls") or []))
    tokens = [r for r in answered if r.get("first_token_s") is not None]
    if tokens:
        out.update(_token_figures(run, percentile, token_bounds_s, verdicts))
    elif any(b is not None for b in token_bounds_s):
        # token bounds on a workload whose replies carry no first-token time: nothing to judge
        verdicts["ttft"] = {"within_bound": False, "passed": False,
                            "early_stopping": "no token times"}
    out["mlperf"] = verdicts
    out["passed"] = passes(verdicts, run["stopped_early"], early_stopping)
    return out


def dispatch_figures(calls: Sequence[tuple[float, float, float | None]]) -> dict[str, Any]:
    """What raybench's own dispatch cost the run's calls (run_load's `calls`): the hand-off
    delay from when a call could have begun (its first query there, its replica free) to when
    it did, and the time a call took on the dispatcher's clock beyond the replica's own."""
    if not calls:
        return {}
    delay = np.array([c[0] for c in calls])
    over = [c[1] - c[2] for c in calls if c[2] is not None]
    return {"dispatch_delay_p50_ms": float(np.percentile(delay, 50) * 1e3),
            "dispatch_delay_p99_ms": float(np.percentile(delay, 99) * 1e3),
            "call_overhead_ms": float(np.mean(over) * 1e3) if over else None}


def passes(verdicts: dict[str, Any], stopped_early: bool, early_stopping: bool) -> bool:
    """A run's decision from its verdicts (mlperf.verdict, one per bound judged): MLPerf's
    rule, or with `early_stopping` false the percentiles alone."""
    key = "passed" if early_stopping else "within_bound"
    return not stopped_early and all(v[key] for v in verdicts.values())


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



"""The Server scenario: Poisson arrivals, a shared queue in front of the replicas, latency.

Owns the arrival schedule (a seeded unit-rate Exponential sequence scaled by 1/rate, so every
probed rate replays the same arrival pattern and the latency percentile grows monotonically
with the rate, as in a single queue it must), the latency figures, and the search for the
highest rate that passes MLPerf's rule (scenarios/mlperf.py): each bound set (the latency;
time to first token and per output token) under its percentile at LoadGen's rank, with
LoadGen's early stopping certifying it. The search brackets the rate by the percentile on
short probes (probe_seconds), then certifies it on longer runs (certify_seconds, at least the
459 queries that can certify p99) on its own arrival sequence and on fresh ones, a tolerance
lower wherever one fails, as a submitter confirms before a run: at the shortest certifiable
run none may be late and a sequence's worst burst decides (a 10 ms replica's 30 ms bound:
8.5, 29.5 and 28.1 queries/s on three sequences of 459, docs/journal/2026-12.md); the
longer the run, the nearer its rate to what MLPerf's 600 s run certifies.
`early_stopping: false` judges the percentile alone, for quick looks. The queue in front of
the replicas is dispatch.py's. Latency runs from a query's scheduled arrival, so a generator
that falls behind cannot hide queueing.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raybench.scenarios import dispatch, mlperf
from raybench.scenarios.dispatch import Serve

log = logging.getLogger(__name__)

MAX_PROBES = 16
# Rates tried below the search's answer while a certifying or confirming run fails it (down by
# 1, 2, 4, 8 tolerance steps, then bisected); an answer still unconfirmed after them is not
# reported.
MAX_CONFIRM_STEPS = 8
# Below start / 2**HALVINGS the bound is out of reach: each halving doubles a probe's length
# (a probe sends at least min_queries), so going lower costs minutes and says nothing new.
HALVINGS = 5
# The GIL hand-over interval while in-process replicas serve: Python's 5 ms default lets a
# replica thread busy launching kernels hold the interpreter while the arrival and dispatch
# threads wait, and that wait would be counted as the replica's latency.
SWITCH_INTERVAL_S = 1e-3


def unit_gaps(seed: int, n: int, sequence: int = 0) -> np.ndarray:
    """Inter-arrival gaps of a rate-1 Poisson process; divided by the rate when used.
    `sequence` > 0: another arrival sequence of the same seed (the confirmation runs')."""
    key = [seed, 0x5E7E] + ([sequence] if sequence else [])
    return np.random.default_rng(key).exponential(1.0, n)


def query_count(rate: float, seconds: float, min_queries: int, floor: int = 0) -> int:
    """Queries of a run at `rate`: `seconds` of them, at least min_queries and `floor`."""
    return max(min_queries, floor, math.ceil(rate * seconds))


def probe_length(inf: Any, certify: bool) -> tuple[float, int]:
    """The seconds of queries a run sends and its fewest queries beyond min_queries: a
    certifying run certify_seconds, and at least what early stopping can certify at the
    trial's percentile (459 at p99, none late); a search probe (or a fixed-rate run)
    probe_seconds."""
    if certify:
        return inf.certify_seconds, mlperf.queries_needed(0, inf.latency_percentile)
    return inf.probe_seconds, 0


def run_load(replicas: Sequence[Serve], rate: float, gaps: np.ndarray,
             bound_s: float | None, percentile: float, max_batch: int = 1,
             early_stopping: bool = True) -> dict[str, Any]:
    """Send len(gaps) queries at `rate`; returns the latencies (inf: never answered) and the
    replica records (per query: the record of the call that answered it). A free replica
    takes the oldest waiting query and, with `max_batch` > 1, up to max_batch - 1 more that
    are already waiting, in one call (dynamic batching without a wait, as a serving front end
    does it: dispatch.Fifo). With a bound, stops as soon as more queries were late than the
    rule allows (mlperf.stop_after): the rest could not change the verdict."""
    arrivals = np.cumsum(gaps) / rate
    n = len(arrivals)
    allowed_late = mlperf.stop_after(n, percentile, early_stopping)
    latency = np.full(n, np.inf)
    records: list[dict[str, Any] | None] = [None] * n
    # each call's hand-off delay, its wall time on the dispatcher's clock, the replica's own
    calls: list[tuple[float, float, float | None]] = []
    lock = threading.Lock()
    counts = {"late": 0, "answered": 0}
    errors: list[BaseException] = []
    failed, ended, halt = threading.Event(), threading.Event(), threading.Event()
    t0 = time.monotonic() + 0.01

    def done(call: dispatch.CallEnd) -> None:
        if call.error is not None:  # a replica that fails ends the run: the trial is an error
            errors.append(call.error)
            failed.set()
            ended.set()
            return
        first = t0 + arrivals[call.items[0]]
        with lock:
            calls.append((call.start - max(first, call.free_since), call.end - call.start,
                          (call.record or {}).get("service_s")))
            for k in call.items:
                records[k] = call.record
                latency[k] = call.end - (t0 + arrivals[k])
                counts["late"] += bound_s is not None and latency[k] > bound_s
            counts["answered"] += len(call.items)
            if counts["late"] > allowed_late:
                failed.set()
            if counts["answered"] == n or failed.is_set():
                ended.set()

    def issue(fifo: dispatch.Fifo) -> None:
        # a thread's timed wait wakes finer than an event loop's timers (epoll's millisecond
        # timeout), which would show as latency
        dispatch.fine_timers()
        for k, at in enumerate(arrivals):
            delay = t0 + at - time.monotonic()
            if delay > 0 and halt.wait(delay):
                return
            fifo.put(k)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        with dispatch.Fifo(replicas, max_batch, done) as fifo:
            issuer = threading.Thread(target=issue, args=(fifo,), name="raybench-arrivals",
                                      daemon=True)
            issuer.start()
            # A replica that stops answering must not hang the sweep.
            limit = float(arrivals[-1]) * 4 + 120
            finished = ended.wait(limit) or failed.is_set()
            halt.set()
            issuer.join()
    finally:
        sys.setswitchinterval(previous)
    if errors:
        raise errors[0]
    if not finished:
        raise TimeoutError(f"the replicas answered {int(np.isfinite(latency).sum())} of {n} "
                           f"queries at {rate:.4g} queries/s in {limit:.0f} s")
    return {"rate": rate, "latency_s": latency, "records": records, "calls": calls,
            "duration_s": float(arrivals[-1]), "stopped_early": failed.is_set()}


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


def say(probe: dict[str, Any], certify: bool, sequence: int, percentile: float) -> None:
    """One line per run of a search, which may take many minutes: its rate, kind, verdict."""
    shown = {k: v.get("percentile_s") for k, v in (probe.get("mlperf") or {}).items()}
    log.info("server: %.4g queries/s, %s%s, %d queries: %s (p%g %s)", probe["rate_qps"],
             "certifying run" if certify else "search probe",
             f" on sequence {sequence}" if sequence else "", probe["queries"],
             "passed" if probe["passed"] else "failed", percentile,
             ", ".join(f"{k} {'-' if v is None or v == math.inf else f'{v * 1e3:.1f} ms'}"
                       for k, v in shown.items()) or "not judged")


def rule_columns(inf: Any, probes: list[dict[str, Any]]) -> dict[str, Any]:
    """What a Server row states of the rule its rate passed and its confirmation: each
    step-down is a confirming run on the search's own sequence after the first (with
    certification) or after the search (without)."""
    searching = inf.rate_qps is None
    own = sum(1 for p in probes if p.get("confirming") and not p.get("sequence"))
    return {"server/rule": "mlperf" if inf.early_stopping else "percentile",
            "server/confirm_runs": inf.confirm_runs if searching else 0,
            "server/certify_s": inf.certify_seconds if searching and inf.early_stopping
            else None,
            "server/confirm_steps": max(0, own - bool(inf.early_stopping)) if searching else 0}


def distinct_calls(records: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Each replica call's record once (a batched call answered several queries)."""
    return list({id(r): r for r in records if r is not None}.values())


def _ms(seconds: float) -> float | None:
    return None if not math.isfinite(seconds) else float(seconds * 1e3)


def search_rate(probe: Callable[..., dict[str, Any]], start: float, cap: float,
                tolerance_pct: float, budget_s: float = math.inf,
                clock: Callable[[], float] = time.monotonic, confirm_runs: int = 0,
                certify: bool = False) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Highest passing rate: double from `start` (halve if it fails) until the verdict changes,
    then bisect until the bracket is within `tolerance_pct` (`probe(rate)`). Then, with
    `certify`, the rate found must pass a certifying run (`probe(rate, k, certify=True)`) on
    the search's arrival sequence (k = 0) and on `confirm_runs` fresh ones (k = 1, 2, ...);
    without, the search's own probe stands for k = 0 and the fresh sequences are probed as the
    search's were. Wherever one fails the rate goes a tolerance lower and all are run again.
    Returns the probe shown for the answer (the search's sequence's; None: even the lowest
    rate tried failed, or no rate was confirmed) and every probe in order, each confirming
    one marked with its `sequence`; no new probe starts after `budget_s` (the last probe then
    says `truncated`). Pure over `probe` and `clock`."""
    began = clock()
    probes: list[dict[str, Any]] = []

    def out_of_time() -> bool:
        if probes and clock() - began > budget_s:
            probes[-1]["truncated"] = True
            return True
        return False

    best: dict[str, Any] | None = None
    lo, hi = None, None  # highest passing, lowest failing rate
    rate = min(start, cap)
    while len(probes) < MAX_PROBES and not out_of_time():
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
    if best is None or (confirm_runs <= 0 and not certify):
        return best, probes
    confirm = _Confirm(probe, probes, confirm_runs, tolerance_pct, out_of_time, certify)
    return confirm.run(best), probes


class _Confirm:
    """The search's answer on the arrival sequences that confirm it (search_rate): the
    highest rate at most the answer that passes on every sequence, as every sequence's
    verdict only worsens with the rate. Down from the answer by 1, 2, 4, ... tolerance steps
    until one passes, then bisected to the tolerance; the sequence that failed last is run
    first at the next rate. At most MAX_CONFIRM_STEPS rates, within the time budget; every
    probe it runs appended to `probes`."""

    def __init__(self, probe: Callable[..., dict[str, Any]], probes: list[dict[str, Any]],
                 runs: int, tolerance_pct: float, out_of_time: Callable[[], bool],
                 certify: bool):
        self.probe, self.probes, self.runs = probe, probes, runs
        self.step, self.out_of_time, self.certify = 1 + tolerance_pct / 100, out_of_time, certify
        self.order = list(range(runs + 1))

    def _one(self, rate: float, sequence: int) -> dict[str, Any]:
        result = (self.probe(rate, sequence, certify=True) if self.certify
                  else self.probe(rate, sequence) if sequence else self.probe(rate))
        result["sequence"] = sequence
        result["confirming"] = True
        self.probes.append(result)
        return result

    def _passes_all(self, rate: float, best: dict[str, Any]) -> dict[str, Any] | bool | None:
        """The search's sequence's probe where every sequence passes `rate`; False where one
        fails; None where the time budget ended first."""
        shown = None if self.certify or rate != best["rate_qps"] else best
        for k in self.order:
            if k == 0 and shown is not None:
                continue
            if self.out_of_time():
                return None
            result = self._one(rate, k)
            if not result["passed"]:
                self.order.remove(k)
                self.order.insert(0, k)
                return False
            if k == 0:
                shown = result
        return shown

    def run(self, best: dict[str, Any]) -> dict[str, Any] | None:
        rate, jump = best["rate_qps"], 1
        passing: tuple[float, dict[str, Any]] | None = None
        failing: float | None = None
        for _ in range(MAX_CONFIRM_STEPS):
            shown = self._passes_all(rate, best)
            if shown is None:
                break
            if shown is False:
                failing = rate
            else:
                passing = (rate, shown)
            if passing and (failing is None or failing / passing[0] <= self.step):
                break
            if passing is None:
                rate, jump = rate / self.step**jump, jump * 2
            else:
                rate = math.sqrt(passing[0] * failing)
        return passing[1] if passing else None


def run_search(replicas: Sequence[Serve], inf: Any, capacity_qps: float,
               ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The Server scenario over ready replicas: one fixed rate judged by the trial's rule, or
    the search (by the percentile on probe_seconds probes; with early_stopping, then certified
    by MLPerf's rule on certify_seconds runs)."""
    bound_s = inf.latency_bound_ms / 1e3 if inf.latency_bound_ms else None
    tokens_s = inf.token_bounds_s
    pct = inf.latency_percentile

    def probe(rate: float, sequence: int = 0, certify: bool = False,
              rule: bool = False) -> dict[str, Any]:
        seconds, floor = probe_length(inf, certify)
        gaps = unit_gaps(inf.seed, query_count(rate, seconds, inf.min_queries, floor), sequence)
        began = time.perf_counter()
        run = run_load(replicas, rate, gaps, bound_s, pct, inf.max_batch_queries,
                       certify or rule)
        out = {**summarize(run, bound_s, pct, tokens_s, certify or rule),
               "wall_s": time.perf_counter() - began, "_run": run}
        say(out, certify, sequence, pct)
        return out

    if inf.rate_qps is not None:
        result = probe(inf.rate_qps, rule=inf.early_stopping)
        return (result if result["passed"] else None), [result]
    cap = inf.rate_max_qps or 1.5 * capacity_qps
    return search_rate(probe, min(0.5 * capacity_qps, cap), cap, inf.rate_tolerance_pct,
                       inf.search_seconds, confirm_runs=inf.confirm_runs,
                       certify=inf.early_stopping)

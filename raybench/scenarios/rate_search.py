"""The Server scenario's rate search: the highest Poisson rate that passes MLPerf's rule.

Owns the search, not a rate's run (server.py: arrivals, load, summary) nor the rule itself
(mlperf.py). The search brackets the rate by the percentile on short probes (probe_seconds),
then certifies it on longer runs (certify_seconds, at least the 459 queries that can certify
p99) by MLPerf's rule, on its own arrival sequence and on fresh ones, a tolerance lower
wherever one fails, as a submitter confirms before a run. A run's certified limit is its
sequence's luck as much as the replica's (a 10.2 ms queue under a 30 ms bound: 26.6, 18.2 and
27.7 queries/s on three sequences of 2,000 queries, docs/journal/2026-12.md): the rate that
passes k sequences passes a fresh run of the same length with odds of about k/(k+1), the
sequences' limits being exchangeable draws. The search's own sequence is LoadGen's schedule
of the seed (server.loadgen_gaps), so LoadGen's confirming run replays its arrivals. The
longer the runs, the nearer the rate to what MLPerf's 600 s run certifies. `early_stopping:
false` judges the percentile alone, for quick looks. Pure over its probe and clock but for a
log line a run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from raybench.scenarios import mlperf, server
from raybench.scenarios.dispatch import Serve

log = logging.getLogger(__name__)

MAX_PROBES = 16
# Rates tried below the search's answer while a certifying or confirming run fails it (down by
# 1, 2, 4, 8, 8, ... steps, then bisected to a step); an answer still unconfirmed after them is
# not reported. Twelve: 2% steps reach half the answer in seven rates and bisect back to one
# step in three more (a 5 ms replica's bracket, 48.9 queries/s, certified near 31: with eight
# the search ended two bisections short, 8% wide).
MAX_CONFIRM_STEPS = 12
# The longest step down, in steps: a failing run stops at its first late query too many and
# costs little, a passing one runs to its end, and the lower its rate the longer (doubling on,
# a 5 ms replica's search stepped from 37.7 queries/s, failed, to 20.0 and spent 50 s a
# sequence there, where the limit was near 34)
MAX_JUMP = 8
# Runs at a margin under the highest certified rate, each a margin lower than the last,
# before the search gives no answer: at p99 on 459 queries none may be late, and one stall of
# a busy VM fails a run (a token engine's search once failed two and reported nothing)
MARGIN_TRIES = 3
# Below start / 2**HALVINGS the bound is out of reach: each halving doubles a probe's length
# (a probe sends at least min_queries), so going lower costs minutes and says nothing new.
HALVINGS = 5


def standard_count(n: float) -> int:
    """n rounded to the nearest (on a log scale) of 1, 2 or 5 x 10^k: 1,000 for 708-1,414,
    2,000 for 1,415-3,162. The certifying runs' length comes from the bracket's answer, which
    moves a few percent from one search to the next; rounded, the searches of a replica run
    the same arrival sequences, which decide its certified rate (a 2.5 ms replica's two
    searches certified on 987 and 1,458 queries found 48.9 and 52.6 queries/s)."""
    k = math.floor(math.log10(n))
    return min((m * 10**k for m in (1, 2, 5, 10)), key=lambda c: abs(math.log(c / n)))


class RunLength:
    """How many queries a run sends: a search probe (or a fixed-rate run) probe_seconds of
    them, at least min_queries; every certifying run as many as the first, which is at the
    search's answer: certify_queries where the sweep sets it, else certify_seconds of queries
    at that rate rounded to a standard count (standard_count) and at least min_queries; at
    least the fewest early stopping can certify (459 at p99). So fixed, a certifying run's
    verdict only worsens as the rate rises (the same arrivals, closer together). Grown with
    the rate, a longer run at a higher rate allowed more late queries: on a 10 ms replica 17.6
    queries/s (1,058 queries) passed where 12.4 (747) had failed, and the search stepped down
    past both."""

    def __init__(self, inf: Any):
        self.inf = inf
        self.certifying: int | None = None

    def __call__(self, rate: float, certify: bool) -> int:
        inf = self.inf
        if not certify:
            return server.query_count(rate, inf.probe_seconds, inf.min_queries)
        if self.certifying is None:
            wanted = (inf.certify_queries if inf.certify_queries is not None
                      else max(standard_count(rate * inf.certify_seconds), inf.min_queries))
            self.certifying = max(wanted,
                                  mlperf.queries_needed(0, inf.latency_percentile))
        return self.certifying


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
    certifying = searching and inf.early_stopping
    own = sum(1 for p in probes
              if p.get("confirming") and not p.get("sequence") and not p.get("margin"))
    return {"server/rule": "mlperf" if inf.early_stopping else "percentile",
            "server/confirm_runs": inf.confirm_runs if searching else 0,
            "server/certify_s": inf.certify_seconds if certifying and inf.certify_queries is None
            else None,
            "server/certify_queries": next(
                (p["queries"] for p in probes if p.get("confirming")), None) if certifying
            else None,
            "server/confirm_steps": max(0, own - bool(inf.early_stopping)) if searching else 0,
            "server/margin_pct": inf.rate_margin_pct if certifying else None}


def search_rate(probe: Callable[..., dict[str, Any]], start: float, cap: float,
                tolerance_pct: float, budget_s: float = math.inf,
                clock: Callable[[], float] = time.monotonic, confirm_runs: int = 0,
                certify: bool = False, certify_tolerance_pct: float | None = None,
                margin_pct: float = 0.0) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Highest passing rate: double from `start` (halve if it fails) until the verdict changes,
    then bisect until the bracket is within `tolerance_pct` (`probe(rate)`). Then, with
    `certify`, the rate found must pass a certifying run (`probe(rate, k, certify=True)`) on
    the search's arrival sequence (k = 0) and on `confirm_runs` fresh ones (k = 1, 2, ...);
    without, the search's own probe stands for k = 0 and the fresh sequences are probed as the
    search's were. Wherever one fails the rate goes a tolerance lower and all are run again;
    certifying runs step by `certify_tolerance_pct` where given (finer than the bracket's: the
    answer is the certified rate, so its step is what two searches can differ by). With
    `certify` and `margin_pct`, the answer is that far under the highest rate certified, where
    the search's sequence passes once more (_Confirm._inside).
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
    step = certify_tolerance_pct if certify and certify_tolerance_pct else tolerance_pct
    confirm = _Confirm(probe, probes, confirm_runs, step, out_of_time, certify,
                       margin_pct if certify else 0.0)
    return confirm.run(best), probes


class _Confirm:
    """The search's answer on the arrival sequences that confirm it (search_rate): the
    highest rate at most the answer that passes on every sequence, as every sequence's
    verdict only worsens with the rate. Down from the answer by 1, 2, 4, 8, 8, ... tolerance
    steps until one passes, then bisected to the tolerance; the sequence that failed last is run
    first at the next rate. At most MAX_CONFIRM_STEPS rates, within the time budget; every
    probe it runs appended to `probes`."""

    def __init__(self, probe: Callable[..., dict[str, Any]], probes: list[dict[str, Any]],
                 runs: int, tolerance_pct: float, out_of_time: Callable[[], bool],
                 certify: bool, margin_pct: float = 0.0):
        self.probe, self.probes, self.runs = probe, probes, runs
        self.margin = margin_pct / 100
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
                rate, jump = rate / self.step**jump, min(jump * 2, MAX_JUMP)
            else:
                rate = math.sqrt(passing[0] * failing)
        if passing is None or not self.margin:
            return passing[1] if passing else None
        return self._inside(passing)

    def _inside(self, passing: tuple[float, dict[str, Any]]) -> dict[str, Any] | None:
        """The answer `margin` under the highest rate every sequence passed, its run on the
        search's sequence passing there too (the others pass a lower rate as they passed the
        higher one); a margin lower again where that run fails (the replica's time moved
        between runs, or a stall), at most MARGIN_TRIES runs, else no answer. Its probe says
        the highest certified rate."""
        rate = passing[0]
        for _ in range(MARGIN_TRIES):
            rate /= 1 + self.margin
            if self.out_of_time():
                return None
            shown = self._one(rate, 0)
            shown["margin"] = True
            if shown["passed"]:
                shown["certified_qps"] = passing[0]
                return shown
        return None


def run_search(replicas: Sequence[Serve], inf: Any, capacity_qps: float,
               ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The Server scenario over ready replicas: one fixed rate judged by the trial's rule, or
    the search (by the percentile on probe_seconds probes; with early_stopping, then certified
    by MLPerf's rule on certify_seconds runs)."""
    bound_s = inf.latency_bound_ms / 1e3 if inf.latency_bound_ms else None
    tokens_s = inf.token_bounds_s
    pct = inf.latency_percentile

    length = RunLength(inf)

    def probe(rate: float, sequence: int = 0, certify: bool = False,
              rule: bool = False) -> dict[str, Any]:
        gaps = server.unit_gaps(inf.seed, length(rate, certify), sequence)
        began = time.perf_counter()
        run = server.run_load(replicas, rate, gaps, bound_s, pct, inf.max_batch_queries,
                              certify or rule)
        out = {**server.summarize(run, bound_s, pct, tokens_s, certify or rule),
               "wall_s": time.perf_counter() - began, "_run": run}
        say(out, certify, sequence, pct)
        return out

    return run_or_search(probe, inf, capacity_qps)


def run_or_search(probe: Callable[..., dict[str, Any]], inf: Any, capacity_qps: float,
                  ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """What the trial's `inference` section asks of a Server probe (in-process or Ray
    replicas, or a token engine's): one run at rate_qps judged by the trial's rule, or the
    search from half the replicas' capacity with the section's bracket, certification and
    margin."""
    if inf.rate_qps is not None:
        result = probe(inf.rate_qps, rule=inf.early_stopping)
        return (result if result["passed"] else None), [result]
    cap = inf.rate_max_qps or 1.5 * capacity_qps
    return search_rate(probe, min(0.5 * capacity_qps, cap), cap, inf.rate_tolerance_pct,
                       inf.search_seconds, confirm_runs=inf.confirm_runs,
                       certify=inf.early_stopping,
                       certify_tolerance_pct=inf.certify_tolerance_pct,
                       margin_pct=inf.rate_margin_pct)

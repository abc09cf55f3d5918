"""MLPerf's rules for a latency-bound run, as its official LoadGen applies them.

Owns LoadGen's percentile rank and its early-stopping decision for the Server scenario (pure;
scipy's binomial distribution). Sources, mlcommons/inference, `loadgen/`:

- percentile: `results.cc`, `PerformanceSummary::ProcessLatencies`: the sorted latencies at
  index `sample_count * percentile` (truncated): the 397th of 400 at p99, where numpy's
  "inverted_cdf" takes the 396th.
- early stopping: `results.cc`, `PerformanceSummary::EarlyStopping`, Server case, with
  `early_stopping.cc`: t queries over the latency bound out of n pass only when, were the true
  share of late queries 1 - p (p the percentile, tolerance 0), seeing t or fewer late in n
  would have odds at most 1 - 0.99 (the binomial CDF, LoadGen's regularised incomplete beta).
  No late query at p99 needs 459 queries; 1,000 queries allow 2 late; 2,000 allow 9.
- minimums: `mlperf.conf` (`*.Server.min_duration = 600000` ms) and `test_settings.h`
  (`min_query_count = 100`): a run shorter than either is not a submittable one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.99  # LoadGen's early stopping: `double confidence = 0.99;`
TOLERANCE = 0.0  # ... `double tolerance = 0.0;`
SERVER_MIN_DURATION_S = 600.0
MIN_DURATION_S = SERVER_MIN_DURATION_S  # mlperf.conf sets Offline's the same (`*.Offline.`)
MIN_QUERIES = 100


def rank(n: int, percentile: float) -> int:
    """LoadGen's index of the percentile in n sorted latencies (0-based)."""
    return min(n - 1, int(n * (percentile / 100.0)))


def percentile_of(values: Sequence[float], percentile: float) -> float:
    """The latency at LoadGen's rank (no interpolation); inf for no values."""
    if not len(values):
        return math.inf
    return float(sorted(values)[rank(len(values), percentile)])


def certified(n: int, late: int, percentile: float) -> bool:
    """Whether n queries with `late` over the bound let LoadGen's early stopping certify the
    percentile: P[at most `late` late of n | a true late share of 1 - p] <= 1 - confidence."""
    # scipy.stats: 0.6-1.3 s to import, here only where a run is judged (the report imports
    # this module, and so every sweep's driver)
    from scipy.stats import binom

    p = percentile / 100.0 - TOLERANCE
    return bool(n > late and binom.cdf(late, n, 1.0 - p) <= 1.0 - CONFIDENCE)


def allowed_late(n: int, percentile: float) -> int:
    """The most late queries of n that early stopping certifies; -1 where even none does (too
    few queries: fewer than 459 at p99)."""
    lo, hi = -1, n - 1  # certified(n, t) falls as t grows: the last t that passes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if certified(n, mid, percentile):
            lo = mid
        else:
            hi = mid - 1
    return lo


def queries_needed(late: int, percentile: float) -> int:
    """The fewest queries with `late` of them late that early stopping certifies (every query
    beyond those on time): LoadGen's h + t."""
    lo, hi = late + 1, max(2 * (late + 1), 64)
    while not certified(hi, late, percentile):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if certified(mid, late, percentile):
            hi = mid
        else:
            lo = mid + 1
    return lo


def late_allowed(n: int, percentile: float, early_stopping: bool) -> int:
    """The most late queries of n a run may have and still pass: under MLPerf's rule those
    that early stopping certifies (which keeps the percentile under its bound too: fewer than
    the queries past the rank), else those past LoadGen's rank of the percentile; -1 where
    even none pass (fewer than 459 queries at p99, by MLPerf's rule)."""
    if early_stopping:
        return allowed_late(n, percentile)
    return n - 1 - rank(n, percentile)


def stop_after(n: int, percentile: float, early_stopping: bool) -> int:
    """The late queries past which a run of n stops (its verdict can no longer change): those
    the rule allows, or, where n queries can never be certified (a short fixed-rate run), those
    the percentile allows: such a run still gives its figures."""
    allowed = late_allowed(n, percentile, early_stopping)
    return allowed if allowed >= 0 else late_allowed(n, percentile, False)


def verdict(latencies_s: Sequence[float], bound_s: float, percentile: float,
            run_s: float | None) -> dict[str, object]:
    """LoadGen's Server decision on one run: its percentile under the bound and early
    stopping met; with what a row states of it (queries, late, the rank's latency, the
    queries early stopping needed, and whether the run meets MLPerf's minimum duration and
    query count, which a short search probe never does)."""
    n = len(latencies_s)
    late = sum(1 for x in latencies_s if x > bound_s)
    at_rank = percentile_of(latencies_s, percentile)
    stops = certified(n, late, percentile)
    return {"queries": n, "late": late, "percentile_s": at_rank,
            "within_bound": bool(at_rank <= bound_s),
            "early_stopping": "met" if stops else "not met",
            "queries_needed": queries_needed(late, percentile),
            "passed": bool(at_rank <= bound_s and stops),
            "run_s": run_s,
            "min_duration_met": None if run_s is None else run_s >= SERVER_MIN_DURATION_S,
            "min_queries_met": n >= MIN_QUERIES}


def columns(shown: dict[str, Any]) -> dict[str, Any]:
    """What a Server row states of MLPerf's verdict on the rate shown: `shown` holds the
    verdict of each bound judged (`mlperf`), its queries and run length."""
    verdicts = shown.get("mlperf") or {}
    judged = [v for v in verdicts.values() if "queries" in v]
    run_s = shown.get("run_s")
    return {
        "server/late": max((v["late"] for v in judged), default=None),
        "server/early_stopping": ", ".join(f"{k} {v.get('early_stopping')}"
                                           for k, v in verdicts.items()) or None,
        "server/queries_needed": max((v["queries_needed"] for v in judged), default=None),
        "server/run_s": run_s,
        "server/mlperf_min_duration_met": None if run_s is None else
        run_s >= SERVER_MIN_DURATION_S,
        "server/mlperf_min_queries_met": shown["queries"] >= MIN_QUERIES,
    }

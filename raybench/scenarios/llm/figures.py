"""Token-level figures of an LLM serving run (pure): per request and per trial, and the Pareto
front of a concurrency sweep.

A request's record holds its scheduled arrival and the client's stamp of every token it
received (time.monotonic of the process that sent it; a streamed chunk of k tokens gives k
equal stamps). Definitions as vLLM's `bench serve` states them: time to first token (TTFT)
from the arrival to the first token; time per output token (TPOT) = (end-to-end - TTFT) /
(output tokens - 1); inter-token latency (ITL) every gap between consecutive tokens;
end-to-end from the arrival to the last token. Goodput: requests per second that met every
limit set. Tokens/s per user: a request's decode speed, 1 / TPOT, averaged over requests (what
InferenceMAX and NVIDIA's curves put on their x axis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from raybench.columns import Metric, declare
from raybench.scenarios import mlperf

QUANTILES = (50, 90, 99)
# a closed-loop or offline run's output tokens/s in this many equal windows of its token span,
# the first and last left out (users starting, the last requests draining): the windows
# `compare` judges a serving row by, as a training row by its measured windows
WINDOWS = 10
MIN_TOKENS_PER_WINDOW = 4  # fewer tokens than this a window on average: no windows at all

declare(
    Metric("serve/requests", "count", "requests sent"),
    Metric("serve/failed", "count", "requests that ended without every token"),
    Metric("serve/input_tokens", "count", "prompt tokens per request (the trial's; drawn from "
           "inference.lengths_file: their mean)"),
    Metric("serve/output_tokens", "count", "output tokens per request, forced (no end of "
           "sequence); from a lengths file: their mean"),
    Metric("serve/concurrency", "count", "closed-loop users (the concurrency scenario)"),
    Metric("serve/wall_s", "s", "from the first arrival to the last token"),
    Metric("serve/requests_per_s", "requests/s", "requests finished per second"),
    Metric("serve/output_tokens_per_s", "tokens/s", "output tokens per second, every replica"),
    Metric("serve/output_tokens_per_s_per_gpu", "tokens/s", "serve/output_tokens_per_s over "
           "the trial's GPUs (its replicas on CPU)"),
    Metric("serve/input_tokens_per_s", "tokens/s", "prompt tokens per second, every replica"),
    Metric("serve/tokens_per_s_per_user", "tokens/s", "a request's decode speed (1 / TPOT), "
           "mean over requests"),
    Metric("serve/ttft_{s}_ms", "ms", "time to first token from the arrival: p50, p90, "
           "p99 (LoadGen's rank) and mean"),
    Metric("serve/tpot_{s}_ms", "ms", "time per output token after the first"),
    Metric("serve/itl_{s}_ms", "ms", "inter-token latency: every gap between tokens"),
    Metric("serve/e2e_{s}_ms", "ms", "end-to-end latency from the arrival to the last token"),
    Metric("serve/goodput_rps", "requests/s", "requests per second that met every limit set "
           "(TTFT and TPOT bounds)"),
    Metric("serve/limits_met_pct", "%", "share of requests that met every limit set"),
    Metric("serve/j_per_output_token", "J", "the replicas' GPU energy over the run (NVML) "
           "per output token"),
    Metric("serve/gpu_power_mean_w", "W", "the replicas' GPU power, mean over the run"),
    Metric("serve/replica_cpu_util_pct", "%", "CPU time of a replica's process over the run "
           "(100 = one core), the most of any replica; in-process (the local runner) the "
           "process is the client's too"),
    Metric("serve/replica_run_wait_pct", "%", "time a replica process's threads were ready "
           "to run but waited for a core over the run (100 = one thread the whole run; Linux "
           "schedstat), the most of any replica: whether the engine had the cores it assumed"),
    Metric("serve/replica_busiest_thread_pct", "%", "share of the run the busiest thread of "
           "a replica's process ran (the engine's loop; Linux schedstat), the most of any "
           "replica: near 100, the engine was bound by its host's CPU or GIL, not its device"),
    Metric("serve/replica_busiest_thread_wait_pct", "%", "share of the run that same thread "
           "was ready to run but waited for a core, the most of any replica"),
    Metric("serve/kv_use_peak_pct", "%", "the engine's KV cache in use, highest sampled"),
    Metric("serve/kv_use_mean_pct", "%", "the engine's KV cache in use, mean of the samples"),
    Metric("serve/mlperf_min_duration_met", "bool", "the run lasted MLPerf's 600 s minimum "
           "(mlperf.conf: Offline and Server alike); a short run is not a submittable one"),
    Metric("serve/window_output_tokens_per_s", "tokens/s", "output tokens per second in each "
           "of the middle 8 of 10 equal windows of a closed-loop or offline run's tokens (the "
           "first and last left out: ramp and drain); what compare judges a serving row by; "
           "empty for a Server run, whose throughput is its arrival rate"),
    Metric("serve/usd_per_m_output_tokens", "USD", "what a million output tokens cost at "
           "system.gpu_hour_usd a GPU (results/writer.py); empty where unset"),
)


def request_figures(r: dict[str, Any]) -> dict[str, Any]:
    """TTFT, TPOT, end-to-end (seconds) and the gaps of one request; inf where it failed."""
    stamps = r["stamps"]
    if r.get("error") or len(stamps) < r["output_tokens"] or not stamps:
        return {"ttft": math.inf, "tpot": math.inf, "e2e": math.inf, "gaps": [], "ok": False}
    ttft = stamps[0] - r["arrival"]
    e2e = stamps[-1] - r["arrival"]
    n = len(stamps)
    tpot = (e2e - ttft) / (n - 1) if n > 1 else math.nan
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e, "gaps": np.diff(stamps).tolist(),
            "ok": True}


def met(fig: dict[str, Any], ttft_s: float | None, tpot_s: float | None) -> bool:
    """The request met every limit set (a one-token request has no TPOT to miss)."""
    if not fig["ok"]:
        return False
    return (ttft_s is None or fig["ttft"] <= ttft_s) and (
        tpot_s is None or not math.isfinite(fig["tpot"]) or fig["tpot"] <= tpot_s)


def _stats(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 at LoadGen's rank (a failed request infinitely late) and the mean, ms."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if not v.size:
        return {f"serve/{name}_{s}_ms": None for s in ("p50", "p90", "p99", "mean")}
    out: dict[str, float | None] = {
        f"serve/{name}_p{q}_ms": _ms(mlperf.percentile_of(v, q)) for q in QUANTILES}
    finite = v[np.isfinite(v)]  # the mean of the requests that finished, as vLLM states it
    out[f"serve/{name}_mean_ms"] = _ms(float(np.mean(finite))) if finite.size else None
    return out


def _ms(s: float) -> float | None:
    return float(s * 1e3) if math.isfinite(s) else None


def token_windows(stamps: Sequence[float], tokens: Sequence[float] | None = None
                  ) -> list[float] | None:
    """Output tokens/s in the middle WINDOWS - 2 of WINDOWS equal windows from the first token
    to the last (every request's stamps together; `tokens`: how many tokens each stamp brought,
    one where not given); None for too few tokens to fill them."""
    t = np.asarray(stamps, dtype=float)
    w = np.ones_like(t) if tokens is None else np.asarray(tokens, dtype=float)
    if w.sum() < WINDOWS * MIN_TOKENS_PER_WINDOW or t.max() <= t.min():  # w: t not empty
        return None
    edges = np.linspace(t.min(), t.max(), WINDOWS + 1)
    rates = np.histogram(t, edges, weights=w)[0] / np.diff(edges)
    return [float(x) for x in rates[1:-1]]


def summarize(requests: list[dict[str, Any]], gpus: int, ttft_s: float | None = None,
              tpot_s: float | None = None, windowed: bool = False) -> dict[str, Any]:
    """A trial's row figures from its requests' records. `gpus`: the replicas' GPUs (their
    count on CPU), what per-GPU figures divide by. `windowed`: the run's throughput is the
    engine's (closed loop, offline), not its arrival rate: its token windows too."""
    figs = [request_figures(r) for r in requests]
    ok = [(r, f) for r, f in zip(requests, figs, strict=True) if f["ok"]]
    first = min(r["arrival"] for r in requests)
    last = max((r["stamps"][-1] for r, _ in ok), default=first)
    wall = last - first
    out_tokens = sum(len(r["stamps"]) for r, _ in ok)
    in_tokens = sum(r["input_tokens"] for r, _ in ok)
    rate = out_tokens / wall if wall > 0 else None
    good = sum(met(f, ttft_s, tpot_s) for f in figs)
    speeds = [1.0 / f["tpot"] for _, f in ok if math.isfinite(f["tpot"]) and f["tpot"] > 0]
    out: dict[str, Any] = {
        "serve/requests": len(requests), "serve/failed": len(requests) - len(ok),
        "serve/wall_s": wall,
        "serve/requests_per_s": len(ok) / wall if wall > 0 else None,
        "serve/output_tokens_per_s": rate,
        "serve/output_tokens_per_s_per_gpu": rate / gpus if rate is not None else None,
        "serve/input_tokens_per_s": in_tokens / wall if wall > 0 else None,
        "serve/tokens_per_s_per_user": float(np.mean(speeds)) if speeds else None,
        "serve/goodput_rps": good / wall if wall > 0 else None,
        "serve/limits_met_pct": 100.0 * good / len(requests) if requests else None,
        "serve/mlperf_min_duration_met": wall >= mlperf.MIN_DURATION_S,
        "serve/window_output_tokens_per_s": token_windows(
            [s for r, _ in ok for s in r["stamps"]]) if windowed else None,
    }
    for name in ("ttft", "tpot", "e2e"):
        out.update(_stats(name, [f[name] for f in figs]))
    out.update(_stats("itl", [g for _, f in ok for g in f["gaps"]]))
    return out


def usd_per_m_tokens(gpu_hour_usd: float | None, tokens_per_s_per_gpu: float | None
                     ) -> float | None:
    """What a million output tokens cost at this price of a GPU hour and this rate per GPU."""
    if gpu_hour_usd is None or not tokens_per_s_per_gpu:
        return None
    return gpu_hour_usd / 3600 / tokens_per_s_per_gpu * 1e6


def energy(requests: list[dict[str, Any]], energy_j: Sequence[float | None],
           power_w: Sequence[float | None]) -> dict[str, float | None]:
    """Joules per output token from each replica's GPU energy over the run (NVML); empty
    unless every replica has its figure (a CPU replica, a window under a second)."""
    tokens = sum(len(r["stamps"]) for r in requests if not r.get("error"))
    whole = bool(energy_j) and all(e is not None for e in energy_j)
    total = float(sum(energy_j)) if whole else None  # type: ignore[arg-type]
    watts = [w for w in power_w if w is not None]
    return {"serve/j_per_output_token": total / tokens if total is not None and tokens
            else None,
            "serve/gpu_power_mean_w": float(np.mean(watts)) if watts else None}


def verdicts(requests: list[dict[str, Any]], percentile: float, ttft_s: float | None,
             tpot_s: float | None, run_s: float | None) -> dict[str, Any]:
    """MLPerf's decision on a Server run, each bound set judged by LoadGen's rule
    (scenarios/mlperf.verdict) over every request, a failed one infinitely late."""
    figs = [request_figures(r) for r in requests]
    out = {}
    for name, bound in (("ttft", ttft_s), ("tpot", tpot_s)):
        if bound is not None:
            values = [f[name] if not math.isnan(f[name]) else 0.0 for f in figs]
            out[name] = mlperf.verdict(values, bound, percentile, run_s)
    return out


def pareto(points: Sequence[tuple[float, float]]) -> list[bool]:
    """Which (tokens/s per GPU, tokens/s per user) points no other point beats on both (at
    least as high on each, higher on one): the front a concurrency sweep draws."""
    out = []
    for i, (x, y) in enumerate(points):
        beaten = any(j != i and a >= x and b >= y and (a > x or b > y)
                     for j, (a, b) in enumerate(points))
        out.append(not beaten and math.isfinite(x) and math.isfinite(y))
    return out

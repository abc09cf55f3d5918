"""`bench overhead` on an LLM serving trial: the same engines in this process and behind Ray
actors (tokens streamed back as Ray streaming generators), round by round.

What Ray adds to serving is what users of Ray Serve LLM measured against bare vLLM
(ray-project/ray#59681: about +20 ms mean TTFT, a little less throughput): so the output
tokens/s ratio is judged against raybench's goal (through Ray at least 0.98 of in-process),
and the time to first token's difference is stated beside it, each round pairing the two
sides back to back.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from raybench.bench.overhead import paired_ratio
from raybench.runners.on_ray import cluster
from raybench.scenarios.llm.run import run_trial
from raybench.trials import TrialSpec

log = logging.getLogger(__name__)

SERVING_GOAL = 0.98  # output tokens/s through Ray over in-process (issue 65)
TTFT = ("serve/ttft_p50_ms", "serve/ttft_mean_ms", "serve/ttft_p99_ms")


def serving_overhead(trial: TrialSpec, rounds: int) -> dict[str, Any]:
    """In-process and through Ray in turn (which goes first alternates), `rounds` times."""
    started = cluster.connect(None)
    sides: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    try:
        for i in range(rounds):
            for runner in ("local", "ray")[::1 if i % 2 == 0 else -1]:
                out = run_trial(trial, runner)
                if out.status != "ok":
                    raise RuntimeError(f"the {runner} side of round {i} failed: {out.error}")
                sides[runner].append(out.metrics)
            log.info("round %d: %.1f output tokens/s in-process, %.1f through Ray", i,
                     sides["local"][-1]["serve/output_tokens_per_s"],
                     sides["ray"][-1]["serve/output_tokens_per_s"])
    finally:
        if started:
            cluster.shutdown()
    rate = "serve/output_tokens_per_s"
    out: dict[str, Any] = {
        "config": trial.overrides or trial.config(), "rounds": rounds,
        "in_process_tokens_per_s": [m[rate] for m in sides["local"]],
        "ray_tokens_per_s": [m[rate] for m in sides["ray"]],
        "tokens_per_s_ray_vs_in_process": paired_ratio(
            [m[rate] for m in sides["ray"]], [m[rate] for m in sides["local"]], SERVING_GOAL),
    }
    for key in TTFT:
        diffs = [r[key] - x[key] for r, x in zip(sides["ray"], sides["local"], strict=True)
                 if r.get(key) is not None and x.get(key) is not None]
        name = key.split("/")[1].replace("_ms", "")
        out[f"{name}_ray_minus_in_process_ms"] = statistics.median(diffs) if diffs else None
    # where the cores went: the engine's process waiting for one (through Ray beside Ray's
    # own processes; in-process beside the client, which shares the process)
    for key in ("serve/client_lag_p99_ms", "serve/replica_cpu_util_pct",
                "serve/replica_run_wait_pct", "serve/replica_busiest_thread_pct",
                "serve/replica_busiest_thread_wait_pct"):
        out[key.split("/")[1]] = {side: [m.get(key) for m in ms] for side, ms in sides.items()}
    return out

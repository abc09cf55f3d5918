"""LLM serving through Ray: a threaded actor per replica, each request's tokens streamed back as a
Ray streaming generator and stamped by the client as they arrive (scenarios/llm/run.py), side
by side with the same trial in this process, on an embedded Ray of three CPUs."""

from __future__ import annotations

import json
import os

import pytest
import ray

from raybench.grid import expand
from raybench.scenarios.run import run_trial
from raybench.spec import validate_sweep

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def embedded_ray():
    ray.init(address="local", num_cpus=3, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def trial(workload, **inference):
    return expand(validate_sweep({"name": "serve_ray", "system": {"label": "cpu"},
                                  "workload": workload, "hardware": {"cpus_per_worker": 1},
                                  "inference": inference}))[0]


# times against known sleeps: alone (in a clean clone's parallel part the client's p99 lag read
# 26 ms, and TTFT p50 27 ms of its 20-30 ms, beside the other worker's sweeps)
@pytest.mark.serial
def test_tokens_come_back_through_ray_as_the_generator_makes_them(embedded_ray):
    """A generator of known times (20 ms to the first token, 5 ms after it) behind an actor:
    the client's stamps keep its timing (a client that stamped in bulk, or an actor that sent
    tokens only at the end, would read TPOT near 0 and TTFT near the whole request)."""
    t = trial({"name": "fixed_tokens", "slots": 4, "prefill_ms": 20.0, "token_ms": 5.0},
              scenario="concurrency", concurrency=4, replicas=2, samples=16, input_tokens=8,
              output_tokens=10, warmup_batches=1)
    out = run_trial(t, "ray")
    assert out.status == "ok", out.error
    m = out.metrics
    print({k: v for k, v in m.items() if k.startswith("serve/")})
    assert json.loads(m["serve/replica_requests"]) == [8, 8]
    assert 5.0 * 0.95 <= m["serve/tpot_p50_ms"] <= 6.5
    assert 20.0 <= m["serve/ttft_p50_ms"] <= 30.0  # the way through Ray: a few ms here
    # the lag's p99 (the second slowest of 160 tokens) under 40 ms: one stall of the host
    # passes, and stamps taken in bulk at a request's end would lag its first tokens by the
    # 45 ms of tokens after them
    assert m["serve/itl_p50_ms"] <= 6.5 and m["serve/client_lag_p99_ms"] < 40
    # the generator sleeps: its actor's process is idle most of the run (a figure that
    # counted the replica's start-up, or the whole machine, would read far more)
    assert 0 <= m["serve/replica_cpu_util_pct"] < 60
    assert {r["node"] for r in out.ranks} == {ray.util.get_node_ip_address()}


def test_the_tiny_llama_through_ray_and_in_process(embedded_ray):
    """The same trial both ways: every request its tokens, the fp32 reference agreed with,
    the requests shared between the two replicas."""
    t = trial({"name": "llama", "preset": "tiny"}, scenario="concurrency", concurrency=4,
              replicas=2, samples=8, input_tokens=16, output_tokens=8, accuracy_target=0.99,
              accuracy_samples=2, warmup_batches=1)
    for runner in ("ray", "local"):
        out = run_trial(t, runner)
        assert out.status == "ok", (runner, out.error)
        m = out.metrics
        assert m["serve/requests"] == 8 and m["serve/failed"] == 0, runner
        assert m["infer/accuracy"] == 1.0 and m["infer/replicas_used"] == 2, runner
        assert [r["tokens"] for r in out.records[0]["requests"]] == [8] * 8, runner
        assert m["serve/output_tokens_per_s"] > 0 and m["serve/tpot_p50_ms"] > 0, runner
        # the replica's process over the run: it computed, on at most the machine's cores,
        # and its threads' wait for a core is read (Linux)
        assert 0 < m["serve/replica_cpu_util_pct"] <= 100 * os.cpu_count(), runner
        assert m["serve/replica_run_wait_pct"] >= 0, runner
        # its busiest thread (the engine's loop) is one thread: at most the whole window (a
        # run of about 80 ms here; the counters are read a moment apart, so 5 points over)
        busiest = m["serve/replica_busiest_thread_pct"]
        print(runner, busiest, m["serve/replica_cpu_util_pct"], m["serve/wall_s"])
        assert 0 < busiest <= 105 and 0 <= m["serve/replica_busiest_thread_wait_pct"] <= 105


def test_a_failed_server_probe_stops_its_requests_through_ray(embedded_ray):
    """A Server run at ten times one slot's capacity (a request takes 95 ms, the first token
    100 ms at most): once the late first tokens decide the verdict, the client cancels what
    is left on the actor while the actor's token stream still runs (the cancel is a call of
    its own beside the stream), every cancelled request ends as such, and the run ends."""
    t = trial({"name": "fixed_tokens", "slots": 1, "prefill_ms": 50.0, "token_ms": 5.0},
              scenario="server", rate_qps=100.0, ttft_bound_ms=100.0, warmup_batches=0,
              probe_seconds=0.5, min_queries=40, input_tokens=8, output_tokens=10,
              early_stopping=False)
    out = run_trial(t, "ray")
    assert out.status == "ok", out.error
    m = out.metrics
    (probe,) = json.loads(m["server/search"])
    assert probe["stopped_early"] and not probe["passed"] and m["server/met_bound"] is False
    errors = [r["error"] for r in out.records[0]["requests"]]
    # one request was served before the verdict; those sent after it, unserved, ended as
    # cancelled (not as failures, and not by the run's time limit)
    assert errors.count(None) >= 1 and m["serve/failed"] == len(errors) - errors.count(None)
    assert set(errors) - {None} == {"cancelled: its Server probe had already failed"}

"""Inference scenarios run in-process (the runner of a GPU box without Ray), on CPU replicas."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torchvision

from raybench import flops
from raybench.bench import command as bench
from raybench.grid import expand
from raybench.report.assess import validity
from raybench.scenarios import mlperf, server
from raybench.scenarios.run import run_trial
from raybench.spec import validate_sweep
from tests.conftest import ROOT


def sweep(workload, **inference_spec):
    raw = {"name": "t", "system": {"label": "x"}, "workload": workload,
           "inference": inference_spec}
    grid = inference_spec.pop("grid", None)
    if grid:
        raw["grid"] = grid
    return expand(validate_sweep(raw))


def path_latencies(arrivals: np.ndarray, service_s, max_batch: int = 1) -> np.ndarray:
    """Latencies of a single server in front of one FIFO queue that, when free, takes the
    oldest query and up to max_batch - 1 more already waiting; a call of n queries takes
    service_s(n). With max_batch 1 this is Lindley's recursion."""
    lat, free, i = np.empty(len(arrivals)), 0.0, 0
    while i < len(arrivals):
        start = max(free, arrivals[i])
        j = i + 1
        while j < len(arrivals) and j - i < max_batch and arrivals[j] <= start:
            j += 1
        free = start + service_s(j - i)
        lat[i:j] = free - arrivals[i:j]
        i = j
    return lat


def path_limit(gaps: np.ndarray, service_s, bound_s: float, pct: float,
               max_batch: int = 1, rule: str = "percentile") -> float:
    """The highest rate at which this arrival sequence's latencies in that queue keep their
    percentile (at LoadGen's rank) under the bound (rule "mlperf": and early stopping
    certifies it), by bisection: latencies only grow with the rate."""
    key = "passed" if rule == "mlperf" else "within_bound"

    def passes(rate: float) -> bool:
        lat = path_latencies(np.cumsum(gaps) / rate, service_s, max_batch)
        return bool(mlperf.verdict(lat, bound_s, pct, 0.0)[key])

    lo, hi = 0.01, max_batch / service_s(max_batch)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo



def search_with_one_more_after_a_stall(trial, known_of, low: float = 0.80):
    """The Server search of `trial`, once more if its first answer fell short of the known
    limit because a probe below that limit stopped early (more late queries than the rule
    allows, no percentile kept). A stall of the VM of tens of milliseconds does that: in CI on
    2026-11-24 probes at 68 and 96 queries/s stopped early with the limit at 110 and the search
    settled at 67 while this test took 4x its usual time; by MLPerf's rule at 459 queries one
    late query is enough. Any other shortfall gets no second search."""
    out = run_trial(trial, "local")
    if out.status != "ok":
        return out
    known = known_of(out.metrics)
    if (out.metrics["server/rate_qps"] or 0.0) >= known * low:
        return out
    probes = json.loads(out.metrics["server/search"])
    at = f"p{trial.inference.latency_percentile:g}_ms"
    if any(p["passed"] is False and p[at] is None and p["rate_qps"] < known for p in probes):
        print("a probe below the known limit stopped early (a stall): searching again", probes)
        out = run_trial(trial, "local")
    return out


@pytest.mark.serial  # rates and latencies against a known service time: alone
def test_server_search_finds_the_known_limit_of_a_fixed_service_time():
    """One replica taking 2 ms per query, p95 bound 10 ms, by MLPerf's rule: the search
    brackets the rate by the p95 of 300 queries (LoadGen's rank), then the rate must pass
    certifying runs (of 300 queries, at most 6 late for early stopping) on its own arrival
    sequence and on two fresh ones.
    The known limit: the lowest over the three sequences of the rate at which a FIFO queue of
    that service time, fed that sequence, passes the same rule, for the call time this run
    measured on the dispatcher's clock; it cannot pass the limit of the fastest queue the
    replica can be (its sleeps only overshoot). At p99 the shortest certifiable run (459
    queries) allows none late, and one stall of this VM fails a rate: the rule's p99 case is
    shown on an exact queue (tests/scenarios/test_mlperf_rules.py) and on a token engine
    (tests/scenarios/test_llm_serving.py)."""
    (t,) = sweep({"name": "fixed_service", "service_ms": 2.0}, scenario="server",
                 latency_bound_ms=10.0, latency_percentile=95.0, probe_seconds=0.1,
                 certify_seconds=0.1, min_queries=300, rate_tolerance_pct=5.0)

    def known_of(m, service_ms: float | None = None):
        service = (service_ms or m["server/service_mean_ms"] + m["server/call_overhead_ms"])
        return min(path_limit(server.unit_gaps(0, 300, k), lambda _: service / 1e3, 0.010, 95.0,
                              rule="mlperf") for k in range(3))

    out = search_with_one_more_after_a_stall(t, known_of)
    assert out.status == "ok", out.error
    m = out.metrics
    service_ms = m["server/service_mean_ms"]
    # The replica's time is what was asked. Its sleep only overshoots: by ~0.1 ms on an idle
    # 2-core VM, 0.32 ms in a CI run where every test took 1.8x its usual time.
    assert 2.0 <= service_ms <= 2.5
    known, fastest = known_of(m), known_of(m, 2.0)
    found = m["server/rate_qps"]
    probes = json.loads(m["server/search"])
    print({"found": found, "known": known, "fastest": fastest, "service_ms": service_ms,
           "probes": probes,
           **{k: v for k, v in m.items() if k.startswith(("server/dispatch", "server/call"))}})
    # Latency taken from dispatch rather than from the scheduled arrival, or arrivals that are
    # not Poisson, land above `fastest`; a dispatcher slow to hand calls over, far below.
    assert known * 0.8 <= found <= fastest * 1.03
    # the dispatcher's own cost, stated in the row: a hand-off well under a call, a call's
    # time beyond the replica's own a small part of it
    assert 0 <= m["server/dispatch_delay_p50_ms"] < 1.0
    assert 0 <= m["server/call_overhead_ms"] < 0.5
    assert m["server/p95_ms"] <= 10.0 and m["server/met_bound"] is True
    # what the row says of MLPerf's verdict on the rate shown
    assert m["server/early_stopping"] == "latency met"
    assert m["server/late"] <= mlperf.allowed_late(300, 95.0) == 6
    assert m["server/queries"] == 300 and m["server/mlperf_min_duration_met"] is False
    assert m["server/rule"] == "mlperf" and m["server/confirm_runs"] == 2
    certified = m["server/certified_qps"]  # every sequence passed it; the answer 5% under
    assert sorted(p["sequence"] for p in probes
                  if p["confirming"] and p["rate_qps"] == round(certified, 4)) == [0, 1, 2]
    assert found == pytest.approx(certified / 1.05)
    assert any(p["passed"] is False and p["rate_qps"] <= fastest * 1.12 for p in probes)
    # A probe with up to 5% late (15 of 300) passed the percentile; its rate failed a
    # certifying run (6 late allowed), and a lower one passed: on these sequences the
    # percentile allows 1.4 times the rule's rate, so the bracket is always above it
    bracket = max(p["rate_qps"] for p in probes if not p["confirming"] and p["passed"])
    assert any(p["confirming"] and not p["passed"] and p["rate_qps"] == bracket for p in probes)
    assert found < bracket


@pytest.mark.serial  # rates and latencies against a known service time: alone
def test_server_dynamic_batching_finds_the_known_limit_of_a_batching_queue():
    """One replica whose call of n queries takes 10 + n ms, taking up to 8 waiting queries a
    call, p99 bound 50 ms. The known limit is the same queue's, fed the same arrivals; one
    query a call could not go past 1 / 11 ms = 91 queries/s."""
    (t,) = sweep({"name": "fixed_service", "service_ms": 10.0, "per_sample_ms": 1.0},
                 scenario="server", latency_bound_ms=50.0, probe_seconds=0.1, min_queries=600,
                 rate_tolerance_pct=5.0, max_batch_queries=8,
                 early_stopping=False, confirm_runs=0)  # the percentile alone: its limit
    known = path_limit(server.unit_gaps(0, 600), lambda n: (10.0 + n) / 1e3,
                       0.050, 99.0, 8)
    out = search_with_one_more_after_a_stall(t, lambda m: known)
    assert out.status == "ok", out.error
    m = out.metrics
    found = m["server/rate_qps"]
    print({"found": found, "known": known, "per_call": m["server/queries_per_call"],
           "probes": json.loads(m["server/search"])})
    # found 0.95 x known on a 2-core VM; overheads only lower it (see the test above)
    assert known * 0.80 <= found <= known * 1.05 and found > 2 * 1000 / 11
    assert m["server/queries_per_call"] > 2 and m["server/max_batch_queries"] == 8
    assert m["server/p99_ms"] <= 50.0


@pytest.mark.serial  # rates and latencies against a known service time: alone
def test_offline_throughput_of_fixed_service_replicas_is_what_theory_says():
    """2 replicas x 4 samples per 20 ms call = 400 samples/s at best; 1 replica half that."""
    trials = sweep({"name": "fixed_service", "service_ms": 20.0, "batch_size": 4},
                   scenario="offline", samples=160, project_samples=13368,
                   grid={"replicas": [1, 2]})
    rates = []
    for t in trials:
        out = run_trial(t, "local")
        m = out.metrics
        assert out.status == "ok" and m["infer/samples"] == 160
        assert m["infer/replicas_used"] == t.inference.replicas
        assert m["infer/replica_samples_per_s_mean"] == pytest.approx(200.0, rel=0.05)
        assert m["infer/projected_s"] == pytest.approx(
            m["infer/setup_s"] + 13368 / m["infer/samples_per_s"])
        rates.append(m["infer/samples_per_s"])
    # Less the sleeps' overshoot and the threads' hand-offs: measured 188-198 and 390-391
    # over four runs on a 2-core VM.
    assert rates[0] == pytest.approx(200.0, rel=0.10)
    assert rates[1] == pytest.approx(400.0, rel=0.10)
    assert rates[1] / rates[0] == pytest.approx(2.0, rel=0.10)


def test_accuracy_below_target_marks_the_run_invalid():
    """A ResNet-18 in bf16 against its own fp32 reference: the top-1 agreement a real model
    loses in low precision (on this machine 60 of 64 agree), below a 0.99 target; fp32 meets
    it exactly (same weights, same inputs, same arithmetic)."""
    trials = sweep({"name": "resnet", "depth": 18, "image_size": 64, "num_classes": 100,
                    "batch_size": 16}, scenario="offline", samples=64, accuracy_target=0.99,
                   accuracy_samples=64, grid={"hardware.precision": ["fp32", "bf16"]})
    rows = []
    for t in trials:
        out = run_trial(t, "local")
        assert out.status == "ok", out.error
        rows.append({"status": "ok", **out.metrics})
    fp32, bf16 = rows
    assert fp32["infer/accuracy"] == 1.0 and fp32["infer/accuracy_ok"] is True
    assert fp32["infer/accuracy_compared"] == 64
    assert bf16["infer/accuracy"] < 0.99 and bf16["infer/accuracy_ok"] is False
    assert validity(fp32) == []
    assert validity(bf16) == [f"agreement {bf16['infer/accuracy']:.4f} < target 0.99"]
    # MFU's inputs for served rows: forward FLOPs of a real call, as the meta-device count of
    # the same model gives them; the achieved rate from the measured samples/s (no peak on CPU)
    expect = flops.flops_per_sample(torchvision.models.resnet18(num_classes=100),
                                    torch.zeros(1, 3, 64, 64), train=False)
    for r in (fp32, bf16):
        assert r["perf/gflops_per_sample"] == pytest.approx(expect / 1e9, rel=1e-6)
        assert r["perf/achieved_tflops_per_gpu"] == pytest.approx(
            expect * r["infer/samples_per_s"] / 1e12)
        assert r["perf/mfu_pct"] is None


def test_language_model_offline_and_server_figures():
    lm = {"name": "decoder_lm", "layers": 2, "width": 64, "heads": 2, "vocab": 512,
          "prompt_tokens": 32, "gen_tokens": 8, "batch_size": 4}
    (off,) = sweep(lm, scenario="offline", samples=32)
    m = run_trial(off, "local").metrics
    assert m["infer/tokens_per_s"] == pytest.approx(m["infer/samples_per_s"] * 8)
    # prefill (32 tokens) and 7 decode steps through 2 blocks of 49,152 weights, and the head
    # (512 x 64) once per generated token: 2 FLOPs per weight per token; attention adds a few %
    weights = 2 * 2 * 49_152 * (32 + 7) + 2 * 512 * 64 * 8
    assert weights <= m["perf/gflops_per_sample"] * 1e9 <= 1.25 * weights
    assert m["infer/prefill_tokens_per_s"] > m["infer/decode_tokens_per_s"] > 0
    (srv,) = sweep(lm, scenario="server", rate_qps=20.0, latency_bound_ms=1000.0,
                   probe_seconds=1.0, min_queries=20, early_stopping=False)
    out = run_trial(srv, "local")
    m = out.metrics
    assert out.status == "ok" and m["server/rate_qps"] == 20.0 and m["server/queries"] == 20
    assert 0 < m["server/ttft_p50_ms"] <= m["server/p50_ms"]
    assert 0 < m["server/tpot_p50_ms"] < m["server/p50_ms"]


@pytest.mark.serial  # a Server search against a latency bound: alone (no rate passed beside three other tests)
def test_bench_run_writes_inference_rows_and_a_report(tmp_path, capsys):
    out = tmp_path / "run"
    code = bench.main(["run", str(ROOT / "sweeps" / "inference_cpu.yaml"), "--output", str(out),
                       "--set", "inference.samples=64", "--set", "inference.probe_seconds=1",
                       "--set", "inference.min_queries=40", "--set", "inference.rate_qps=20",
                       "--set", "inference.latency_bound_ms=400",
                       "--set", "inference.early_stopping=false"])  # 40 queries: no MLPerf run
    assert code == 0, capsys.readouterr().out[-2000:]
    df = pd.read_parquet(out / "results.parquet")
    assert list(df["inference.scenario"]) == ["offline", "offline", "server", "server"]
    assert list(df["inference.replicas"]) == [1, 2, 1, 2]
    assert (df["status"] == "ok").all() and (df["device"] == "cpu").all()
    assert (df["infer/samples_per_s"].iloc[:2] > 0).all() and (df["server/rate_qps"][2:] > 0).all()
    # The report's scaling efficiency is the measured 2-replica rate over twice the 1-replica's.
    trials = json.loads((out / "benchmark_report.json").read_text())["trials"]
    one, two = df["infer/samples_per_s"].iloc[0], df["infer/samples_per_s"].iloc[1]
    assert trials[1]["infer/scaling_efficiency_pct"] == pytest.approx(100 * two / (2 * one))
    assert trials[0]["infer/scaling_efficiency_pct"] == pytest.approx(100.0)
    html = (out / "report.html").read_text()
    assert "Offline: samples" in html and "Server: latency percentile" in html
    assert "Accuracy gate" in html

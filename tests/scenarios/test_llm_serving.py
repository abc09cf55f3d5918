"""LLM serving (scenarios/llm/): token-level figures on constructed requests, the three loads on a
token generator of known prefill and per-token times (fixed_tokens) against what theory says
it must give, the tiny Llama preset behind transformers' continuous batching in-process, and
the sweep file's bad input refused at load."""

from __future__ import annotations

import heapq
import json
import math

import numpy as np
import pytest

from raybench.grid import expand
from raybench.scenarios import mlperf, server
from raybench.scenarios.llm import figures, lengths
from raybench.scenarios.run import run_trial
from raybench.spec import SpecError, load_sweep, validate_sweep
from tests.conftest import ROOT


def trials(workload, grid=None, **inference):
    raw = {"name": "t", "system": {"label": "x"}, "workload": workload,
           "inference": inference}
    if grid:
        raw["grid"] = grid
    return expand(validate_sweep(raw))


def request(arrival, stamps, n=None, **extra):
    return {"arrival": arrival, "stamps": stamps, "input_tokens": 4,
            "output_tokens": n or len(stamps), "error": None, **extra}


def test_token_figures_of_constructed_requests():
    """Two requests of 3 tokens and one that failed after its first: the definitions of vLLM's
    bench serve, LoadGen's percentile rank, goodput against the bounds."""
    reqs = [request(0.0, [0.1, 0.2, 0.3]),  # TTFT 100 ms, TPOT 100 ms
            request(0.5, [0.55, 0.57, 0.59]),  # TTFT 50 ms, TPOT 20 ms
            request(0.6, [0.9], n=3, error="the engine failed the request")]
    m = figures.summarize(reqs, gpus=2, ttft_s=0.08, tpot_s=0.05)
    assert m["serve/requests"] == 3 and m["serve/failed"] == 1
    assert m["serve/wall_s"] == pytest.approx(0.59)
    assert m["serve/output_tokens_per_s"] == pytest.approx(6 / 0.59)
    assert m["serve/output_tokens_per_s_per_gpu"] == pytest.approx(3 / 0.59)
    assert m["serve/input_tokens_per_s"] == pytest.approx(8 / 0.59)
    # a failed request is infinitely late: the p99 of three is the worst
    assert m["serve/ttft_p50_ms"] == pytest.approx(100.0) and m["serve/ttft_p99_ms"] is None
    assert m["serve/ttft_mean_ms"] == pytest.approx(75.0)  # of the requests that finished
    # gaps 100, 100, 20, 20: LoadGen's rank of p50 in four is the third
    assert m["serve/itl_p50_ms"] == pytest.approx(100.0) and m["serve/itl_mean_ms"] == \
        pytest.approx(60.0)
    assert m["serve/tokens_per_s_per_user"] == pytest.approx((10 + 50) / 2)
    # only the second met both bounds (TTFT <= 80 ms, TPOT <= 50 ms)
    assert m["serve/goodput_rps"] == pytest.approx(1 / 0.59)
    assert m["serve/limits_met_pct"] == pytest.approx(100 / 3)
    assert m["serve/mlperf_min_duration_met"] is False  # 0.6 s of MLPerf's 600
    v = figures.verdicts(reqs, 99.0, 0.08, 0.05, run_s=0.6)
    assert v["ttft"]["late"] == 2 and v["tpot"]["late"] == 2 and not v["ttft"]["within_bound"]


def test_token_windows_are_the_run_s_throughput_less_its_ramp_and_drain():
    """A token every 10 ms for 1 s, after a slow start and before a slow end: the middle 8 of
    10 windows read 100 tokens/s each; a run too short to fill them has none; a Server run's
    row has none (its throughput is its arrival rate); a chunk of 4 tokens counts 4."""
    steady = [0.1 + 0.01 * k for k in range(80)]
    stamps = [0.0, 0.05, *steady, 0.95, 1.0]
    windows = figures.token_windows(stamps)
    assert len(windows) == 8 and windows == pytest.approx([100.0] * 8, rel=0.15)
    assert figures.token_windows(stamps[:30]) is None
    assert figures.token_windows([5.0] * 50) is None  # every token at once: no span to cut
    assert figures.token_windows([0.0, 1.0], [40.0, 40.0]) == pytest.approx([0.0] * 8)
    # chunks of 4 tokens at 40 a second, none on a window's edge: 160 tokens/s
    chunks = figures.token_windows([0.0, *[(k + 0.5) / 40 for k in range(40)], 1.0],
                                   [0.0, *[4.0] * 40, 0.0])
    assert chunks == pytest.approx([160.0] * 8)
    reqs = [request(0.0, stamps)]
    assert figures.summarize(reqs, gpus=1, windowed=True)[
        "serve/window_output_tokens_per_s"] == windows
    assert figures.summarize(reqs, gpus=1)["serve/window_output_tokens_per_s"] is None


def test_the_cost_of_a_million_output_tokens():
    # 2.5 USD a GPU hour at 1,000 output tokens/s per GPU: 3.6 M tokens an hour
    assert figures.usd_per_m_tokens(2.5, 1000.0) == pytest.approx(2.5 / 3.6)
    assert figures.usd_per_m_tokens(None, 1000.0) is None
    assert figures.usd_per_m_tokens(2.5, None) is None


def test_joules_per_output_token_need_every_replicas_energy():
    reqs = [request(0.0, [0.1, 0.2]), request(0.0, [0.3, 0.4, 0.5])]
    assert figures.energy(reqs, [30.0, 20.0], [300.0, 200.0]) == {
        "serve/j_per_output_token": 10.0, "serve/gpu_power_mean_w": 250.0}
    assert figures.energy(reqs, [30.0, None], [300.0, None])["serve/j_per_output_token"] \
        is None
    assert figures.energy(reqs, [], []) == {"serve/j_per_output_token": None,
                                            "serve/gpu_power_mean_w": None}


def test_the_pareto_front_of_a_concurrency_curve():
    # (tokens/s per user, tokens/s per GPU): more users trade speed per user for throughput
    points = [(400, 400), (300, 1000), (100, 1900), (90, 1800), (300, 900), (50, 1900)]
    assert figures.pareto(points) == [True, True, True, False, False, False]
    assert figures.pareto([(1.0, math.inf), (2.0, 1.0)]) == [False, True]


def _known(trial):
    p, inf = trial.workload, trial.inference
    service = (p.prefill_ms + (inf.output_tokens - 1) * p.token_ms) / 1e3
    return service, p.prefill_ms / 1e3


@pytest.mark.serial  # times against known sleeps: alone
def test_offline_and_users_recover_the_generators_known_times():
    """Two replicas of 4 slots, 20 ms to the first token, 5 ms per token after it, 8 tokens:
    Offline sends 16 requests at once, so each replica serves two waves of 4 (TTFT 20 and
    75 ms, TPOT 5 ms, 64 tokens in 110 ms each); two closed-loop users never wait."""
    base = {"name": "fixed_tokens", "slots": 4, "prefill_ms": 20.0, "token_ms": 5.0}
    (off,) = trials(base, scenario="offline", replicas=2, samples=16, input_tokens=16,
                    output_tokens=8, warmup_batches=1)
    (users,) = trials(base, scenario="concurrency", concurrency=2, replicas=2, samples=12,
                      input_tokens=16, output_tokens=8, warmup_batches=1)
    service, prefill = _known(off)
    out = run_trial(off, "local")
    assert out.status == "ok", out.error
    m = out.metrics
    print({k: v for k, v in m.items() if k.startswith("serve/")})
    assert json.loads(m["serve/replica_requests"]) == [8, 8]  # least in flight
    # Sleeps only overshoot (0.1-0.3 ms each on a quiet 2-core VM); a slot's later tokens
    # keep to their deadlines, so a late first token makes TPOT a little shorter. LoadGen's
    # p50 of 16 is the 9th: a request of the second wave (55 ms later).
    assert 5.0 * 0.97 <= m["serve/tpot_p50_ms"] <= 5.0 * 1.1 + 0.5
    assert 47.5 <= m["serve/ttft_mean_ms"] <= 47.5 * 1.1 + 3
    assert 75.0 <= m["serve/ttft_p50_ms"] <= m["serve/ttft_p99_ms"] <= 75.0 * 1.1 + 5
    ideal = 16 * 8 / (2 * service)
    assert ideal * 0.85 <= m["serve/output_tokens_per_s"] <= ideal * 1.01
    assert m["serve/failed"] == 0 and m["serve/kv_use_peak_pct"] > 0
    assert 0 <= m["serve/client_lag_p99_ms"] < 20  # stamped on arrival, not in bulk later

    out = run_trial(users, "local")
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["serve/concurrency"] == 2 and m["serve/requests"] == 12
    # no one waits for a slot: the median at the prefill, the slowest (p99 of 12) well under
    # what a wait would add (most of another request's 55 ms); a clean clone's serial part
    # read 25.7 ms once for the slowest, one first token late by a stall of the host
    assert 20.0 <= m["serve/ttft_p50_ms"] <= 20.0 * 1.1 + 3
    assert 20.0 <= m["serve/ttft_p99_ms"] <= 20.0 + 15
    assert 1e3 / (5.0 * 1.1 + 0.5) <= m["serve/tokens_per_s_per_user"] <= 200.0 / 0.97
    ideal = 2 * 8 / service
    assert ideal * 0.8 <= m["serve/output_tokens_per_s"] <= ideal * 1.01


def slot_ttft(arrivals: np.ndarray, slots: int, service: float, prefill: float) -> np.ndarray:
    """TTFT of FIFO requests on `slots` slots of a fixed service time: the queue an M/D/c
    model describes, on this arrival path."""
    free = [0.0] * slots
    out = np.empty(len(arrivals))
    for k, a in enumerate(arrivals):
        start = max(a, heapq.heappop(free))
        heapq.heappush(free, start + service)
        out[k] = start - a + prefill
    return out


def ttft_limit(gaps, slots, service, prefill, bound, pct=99.0, rule="percentile") -> float:
    """The highest rate at which this arrival path's TTFT passes: its percentile under the
    bound, or (rule "mlperf") that and early stopping's certification too."""
    key = "passed" if rule == "mlperf" else "within_bound"
    lo, hi = 0.01, slots / service
    for _ in range(50):
        mid = (lo + hi) / 2
        lat = slot_ttft(np.cumsum(gaps) / mid, slots, service, prefill)
        lo, hi = (mid, hi) if mlperf.verdict(lat, bound, pct, 0.0)[key] else (lo, mid)
    return lo


@pytest.mark.serial  # rates and latencies against known sleeps: alone
def test_the_server_search_finds_the_known_ttft_limit_under_mlperfs_rule():
    """One replica of 3 slots, 3 ms to the first token, 1 ms per token, 5 tokens (7 ms a
    request), TTFT bound 20 ms at p99 by MLPerf's rule. The search brackets the rate by the
    percentile on probes of 459 requests (LoadGen's rank lets 4 of them, about 1%, be late),
    then the rate must pass certifying runs of as many requests with none late (early
    stopping's allowance at 459), on its arrival sequence and two fresh ones. The known
    answer: the lowest over the three sequences of the rate at which the same FIFO queue on
    that sequence's arrivals is certified; by the percentile alone the queue allows 1.14 times
    it, so the percentile's bracket fails a certifying run and a lower rate passes (with
    200-request probes the bracket's limit is within 1% of the known answer, and whether it
    failed was chance). A search judging the percentile alone lands above the known answer
    and fails here; TPOT stays 1 ms."""
    (t,) = trials({"name": "fixed_tokens", "slots": 3, "prefill_ms": 3.0, "token_ms": 1.0},
                  scenario="server", input_tokens=8, output_tokens=5, ttft_bound_ms=20.0,
                  tpot_bound_ms=5.0, probe_seconds=0.1, certify_seconds=0.1, min_queries=459,
                  rate_tolerance_pct=5.0)
    service, prefill = _known(t)
    n = mlperf.queries_needed(0, 99.0)
    known = min(ttft_limit(server.unit_gaps(0, n, k), 3, service, prefill, 0.020,
                           rule="mlperf") for k in range(3))
    by_percentile = ttft_limit(server.unit_gaps(0, n), 3, service, prefill, 0.020)
    assert by_percentile > known * 1.08
    out = run_trial(t, "local")
    assert out.status == "ok", out.error
    m = out.metrics
    probes = json.loads(m["server/search"])
    if (m["server/rate_qps"] or 0.0) < known * 0.75 and any(
            p["confirming"] and p["stopped_early"] and p["rate_qps"] < known * 0.9
            for p in probes):
        # A certifying run well under the exact queue's limit stopped at a late request:
        # a stall of the VM (none may be late in 459 at p99). In a clean clone's make test
        # sequence 2 failed five rates from 327 down to 173 requests/s this way, the limit
        # 314, while the serial tests beside took 1.4 times their usual time: search again
        print("a certifying run under the known limit failed (a stall): searching again")
        out = run_trial(t, "local")
        assert out.status == "ok", out.error
        m = out.metrics
        probes = json.loads(m["server/search"])
    print({"found": m["server/rate_qps"], "known": known, "by_percentile": by_percentile,
           "probes": probes})
    # the sleeps' overshoot and the hand-offs can only lower the rate found
    assert known * 0.75 <= m["server/rate_qps"] <= known * 1.03
    assert m["server/met_bound"] and m["serve/ttft_p99_ms"] <= 20.0
    assert m["serve/tpot_p99_ms"] <= 5.0
    assert m["server/early_stopping"] == "ttft met, tpot met" and m["server/late"] == 0
    assert m["server/queries"] == n == 459 and m["server/mlperf_min_duration_met"] is False
    assert m["server/rule"] == "mlperf" and m["server/confirm_runs"] == 2
    # every sequence passed the highest certified rate; the answer sits 5% under it, where
    # the search's own sequence passed once more, or a further 5% under for each margin run
    # that failed first (a stall: CI's run of a5a8e17 failed the first at 266.9 requests/s,
    # every sequence having passed 280.3, and answered 254.2, the known limit 314)
    certified = m["server/certified_qps"]
    at_certified = [p["sequence"] for p in probes
                    if p["confirming"] and p["rate_qps"] == round(certified, 4)]
    assert sorted(at_certified) == [0, 1, 2]
    margins = [p for p in probes if p.get("margin")]
    assert [p["passed"] for p in margins] == [False] * (len(margins) - 1) + [True]
    assert m["server/rate_qps"] == pytest.approx(certified / 1.05 ** len(margins))
    assert m["server/margin_pct"] == 5.0
    assert {p["queries"] for p in probes if p["confirming"]} == {459}  # every certifying run
    # the search's answer by the percentile (459 requests, up to 4 late) failed a certifying
    # run of 459, and a lower rate passed: the rule, not the percentile, decided
    bracket = max(p["rate_qps"] for p in probes if not p["confirming"] and p["passed"])
    assert any(p["confirming"] and not p["passed"] and p["rate_qps"] == bracket for p in probes)
    assert m["server/rate_qps"] < bracket
    assert any(not p["passed"] and p["rate_qps"] <= known * 1.15 for p in probes)


def test_a_run_shorter_than_the_kv_sampling_period_still_reads_the_cache():
    """Two requests of 4 tokens at 1 ms a token on 2 slots: the run lasts a few milliseconds,
    a tenth of KV_SAMPLE_S. The cache's use is read as the engine hands out tokens, so the row
    has it (a reader waking every 50 ms missed such runs, or read them between allocations:
    the tiny Llama's 60 ms closed loop once read 0)."""
    (t,) = trials({"name": "fixed_tokens", "slots": 2, "prefill_ms": 1.0, "token_ms": 1.0},
                  scenario="offline", samples=2, input_tokens=4, output_tokens=4,
                  warmup_batches=1)
    out = run_trial(t, "local")
    assert out.status == "ok", out.error
    print("wall", out.metrics["serve/wall_s"])  # about 5 ms here
    assert out.metrics["serve/kv_use_peak_pct"] > 0


def test_the_tiny_llama_serves_through_continuous_batching_in_process():
    """transformers' engine, random weights, forced lengths: every request gets its 12 tokens,
    the greedy tokens equal an fp32 reference pass of the same weights (the engine in fp32),
    the KV cache is in use, and the client's stamps follow the engine's."""
    (t,) = trials({"name": "llama", "preset": "tiny"}, scenario="concurrency", concurrency=3,
                  samples=9, input_tokens=24, output_tokens=12, accuracy_target=0.99,
                  accuracy_samples=2, warmup_batches=1)
    out = run_trial(t, "local")
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["serve/requests"] == 9 and m["serve/failed"] == 0
    assert m["infer/accuracy"] == 1.0 and m["infer/accuracy_compared"] == 24
    assert m["serve/kv_use_peak_pct"] > 0 and json.loads(m["serve/engine"])["kv_blocks"] >= 3
    assert m["serve/ttft_p50_ms"] > 0 and m["serve/tpot_p50_ms"] > 0
    assert 0 <= m["serve/client_lag_p99_ms"] < 100
    requests = out.records[0]["requests"]
    assert [r["tokens"] for r in requests] == [12] * 9
    # a closed-loop run: its windows of output tokens/s, what compare judges it by
    assert len(m["serve/window_output_tokens_per_s"]) == 8
    assert all(w >= 0 for w in m["serve/window_output_tokens_per_s"])


def test_request_lengths_drawn_from_a_file(tmp_path):
    """Each request draws its lengths from the file's rows (seeded), gets exactly its output
    tokens, and the row states the means."""
    path = tmp_path / "lengths.csv"
    path.write_text("input_tokens,output_tokens\n16,4\n32,8\n8,2\n")
    (t,) = trials({"name": "fixed_tokens", "slots": 8, "prefill_ms": 1.0, "token_ms": 0.5},
                  scenario="offline", samples=12, lengths_file=str(path), warmup_batches=1)
    out = run_trial(t, "local")
    assert out.status == "ok", out.error
    drawn = lengths.requests(t.inference, 12)
    assert len({tuple(x) for x in drawn}) > 1  # not one row for all
    assert [r["tokens"] for r in out.records[0]["requests"]] == list(drawn[:, 1])
    assert out.metrics["serve/input_tokens"] == pytest.approx(drawn[:, 0].mean())
    assert out.metrics["serve/output_tokens"] == pytest.approx(drawn[:, 1].mean())
    assert (lengths.requests(t.inference, 12) == drawn).all()  # the same draw every time


def test_the_overhead_files_draw_spread_lengths_that_fit(monkeypatch):
    # `bench overhead`'s serving files: the CPU sweep and the GPU run's step draw their
    # lengths from the committed files (paths from the project root), spread rather than one
    # length, within what each model holds
    monkeypatch.chdir(ROOT)
    (t,) = expand(load_sweep(ROOT / "sweeps" / "llm_serve_overhead_cpu.yaml", []))
    drawn = lengths.requests(t.inference, t.inference.samples)
    assert drawn[:, 0].min() >= 32 and drawn[:, 0].max() <= 96 and \
        drawn[:, 1].min() >= 16 and drawn[:, 1].max() <= 48
    assert 60 <= drawn[:, 0].mean() <= 70 and 28 <= drawn[:, 1].mean() <= 36
    assert len(np.unique(drawn[:, 1])) >= 20  # users that do not finish in step
    gpu = ROOT / "docs" / "results" / "2026-11-27_h100_ray" / "sweeps" / "llm_serve.yaml"
    (t,) = expand(load_sweep(gpu, [
        "inference.scenario=concurrency", "inference.concurrency=64",
        "grid={concurrency: [64]}", "inference.input_tokens=null",
        "inference.output_tokens=null",
        "inference.lengths_file=sweeps/lengths/spread_128_128.csv"]))
    drawn = lengths.requests(t.inference, t.inference.samples)
    assert 120 <= drawn[:, 0].mean() <= 136 and 120 <= drawn[:, 1].mean() <= 136
    assert drawn.min() >= 64 and drawn.max() <= 192


@pytest.mark.parametrize("text, problem", [
    ("prompt,output_tokens\n16,4\n", "no column input_tokens"),
    ("input_tokens,output_tokens\n16,0\n", "whole numbers of at least 1"),
    ("input_tokens,output_tokens\n", "whole numbers of at least 1"),
    ("input_tokens,output_tokens\n1000,100\n", "is more than the 1024"),
])
def test_a_bad_lengths_file_is_refused_at_load(tmp_path, text, problem):
    path = tmp_path / "lengths.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as e:
        expand(load_sweep(ROOT / "sweeps" / "llm_serve_cpu.yaml", [
            f"inference.lengths_file={path}", "inference.input_tokens=null",
            "inference.output_tokens=null"]))
    assert "inference.lengths_file" in str(e.value) and problem in str(e.value), str(e.value)
    with pytest.raises(SpecError, match="leave input_tokens"):
        load_sweep(ROOT / "sweeps" / "llm_serve_cpu.yaml", [f"inference.lengths_file={path}"])


@pytest.mark.parametrize("sets, key, problem", [
    (["inference.output_tokens=1010"], "inference.output_tokens", "more than the 1024"),
    (["inference.concurrency=0"], "inference.concurrency", "greater than or equal to 1"),
    (["inference.latency_percentile=null"], "inference.latency_percentile", "valid number"),
    (["inference.scenario=server", "inference.ttft_bound_ms=null",
      "inference.tpot_bound_ms=null"], "inference", "needs latency_bound_ms"),
    (["inference.latency_bound_ms=50"], "inference.latency_bound_ms", "token by token"),
    (["inference.limits=mlperf-server"], "inference", "sets ttft_bound_ms to 2000"),
])
def test_bad_token_input_is_refused_at_load(sets, key, problem):
    with pytest.raises(SpecError) as e:
        expand(load_sweep(ROOT / "sweeps" / "llm_serve_cpu.yaml", sets))
    assert key in str(e.value) and problem in str(e.value), str(e.value)


def test_mlperf_limits_and_token_fields_only_where_they_apply():
    (t,) = trials({"name": "llama"}, scenario="server", limits="mlperf-interactive")
    assert (t.inference.ttft_bound_ms, t.inference.tpot_bound_ms) == (500.0, 30.0)
    # a grid over the limit sets, the file's own one of them (each combination's bounds
    # derived again, not kept from the file's)
    both = trials({"name": "llama"}, scenario="server", limits="mlperf-server",
                  grid={"inference.limits": ["mlperf-server", "mlperf-interactive"]})
    assert [(x.inference.ttft_bound_ms, x.inference.tpot_bound_ms) for x in both] == [
        (2000.0, 100.0), (500.0, 30.0)]
    with pytest.raises(SpecError, match="answers calls, not token streams"):
        trials({"name": "fixed_service"}, scenario="offline", output_tokens=16)
    with pytest.raises(SpecError, match="closed-loop users are for token workloads"):
        trials({"name": "fixed_service"}, scenario="concurrency", concurrency=2)


def test_the_report_draws_the_curve_and_ranks_serving_rows_by_tokens():
    import pandas as pd

    from raybench.report import serving
    from raybench.report.assess import rate_text, recommend

    rows = [{"trial_key": f"k{c}", "status": "ok", "stage": "benchmark",
             "workload.name": "llama", "inference.scenario": "concurrency",
             "inference.concurrency": c, "serve/concurrency": c, "serve/requests": 64,
             "serve/output_tokens_per_s": per_gpu, "serve/output_tokens_per_s_per_gpu": per_gpu,
             "serve/tokens_per_s_per_user": user,
             "perf/headline_metric": "serve/output_tokens_per_s_per_gpu"}
            for c, per_gpu, user in ((1, 400.0, 400.0), (4, 1400.0, 350.0), (16, 1300.0, 90.0))]
    df = pd.DataFrame(rows)
    fig = serving.throughput_vs_speed(df)
    (trace,) = fig.data
    assert list(trace.text) == ["1", "4", "16"]
    assert list(trace.marker.symbol) == ["star", "star", "circle"]  # 16 users: beaten by 4
    best = recommend(df)["fastest"]
    assert best["trial_key"] == "k4" and "1.4 ktokens/s" in rate_text(best)


def test_published_serving_figures_stand_beside_rows_of_the_same_lengths_not_as_equals():
    import pandas as pd

    from raybench.report.reference import compare

    row = {"trial_key": "k", "status": "ok", "valid": True, "device": "NVIDIA H100 80GB HBM3",
           "workload.name": "llama", "workload.preset": "llama3.1-8b",
           "hardware.precision": "bf16", "inference.scenario": "offline",
           "serve/input_tokens": 128, "serve/output_tokens": 128,
           "serve/output_tokens_per_s_per_gpu": 2831.2}
    (line,) = compare(pd.DataFrame([row]))
    assert line["published_per_gpu"] == 28312.0 and line["ratio"] == pytest.approx(0.1)
    assert line["unit"] == "output tokens/s" and "not like for like" in line["note"]
    assert "TensorRT-LLM" in line["source"]
    other = {**row, "serve/input_tokens": 1000, "serve/output_tokens": 128}
    assert compare(pd.DataFrame([other])) == []  # no published figure at 1000/128


def test_a_replica_that_fails_to_start_is_a_row_and_stops_its_engine(monkeypatch):
    """Its engine's threads would keep the process alive (transformers' loop is no daemon)."""
    import threading

    from raybench.scenarios.llm.host import EngineHost

    def broken(self, prompts, n):
        raise RuntimeError("warmup broke")

    monkeypatch.setattr(EngineHost, "run_together", broken)
    (t,) = trials({"name": "fixed_tokens", "slots": 3}, scenario="offline", samples=4,
                  input_tokens=4, output_tokens=4, replicas=2)
    out = run_trial(t, "local")
    assert out.status == "error" and "warmup broke" in out.error
    for thread in threading.enumerate():
        if thread.name.startswith("raybench-slot"):
            thread.join(timeout=5)
            assert not thread.is_alive(), thread.name


def test_one_server_run_at_a_fixed_rate_needs_no_warmup():
    (t,) = trials({"name": "fixed_tokens", "slots": 4, "prefill_ms": 2.0, "token_ms": 1.0},
                  scenario="server", rate_qps=50.0, ttft_bound_ms=200.0, warmup_batches=0,
                  probe_seconds=0.5, min_queries=40, input_tokens=8, output_tokens=4,
                  early_stopping=False)  # 40 requests: the percentile alone
    out = run_trial(t, "local")
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["server/rate_qps"] == 50.0 and m["server/probes"] == 1
    assert m["server/queries"] == 40 and m["serve/requests"] == 40


def test_a_replicas_stream_for_a_thread_carries_what_its_event_loop_stream_does():
    """`EngineHost.stream` (a threaded Ray actor's token stream) and `events` (the client's
    event loop in-process) over the same requests: every request's counts in order up to its
    last, with its token ids, what came before the reader started included, tokens of one
    engine step joined into one item rather than one item each, and the stream ending after
    `end`."""
    import asyncio
    import time

    from raybench.scenarios.llm.host import EngineHost

    (t,) = trials({"name": "fixed_tokens", "slots": 3, "prefill_ms": 1.0, "token_ms": 4.0},
                  scenario="offline", samples=3, input_tokens=4, output_tokens=6,
                  warmup_batches=0)
    host = EngineHost(t)

    def progress(items):
        counts = {}
        for batch in items:
            for rid, count, _, finished, ids in batch:
                counts.setdefault(rid, []).append(count)
                if finished:
                    assert ids == [0] * 6
        return counts

    def send(tag):
        for i in range(3):
            host.submit(f"{tag}{i}", [1, 2, 3, 4], 6)
        time.sleep(0.01)  # the first tokens come before the reader starts

    async def on_loop():
        items = []
        async for batch in host.events():
            items.append(batch)
            if sum(1 for b in items for e in b if e[3]) == 3:
                host.end()
        return items

    try:
        send("t")
        items = []
        for batch in host.stream():
            items.append(batch)
            if sum(1 for b in items for e in b if e[3]) == 3:
                host.end()
        send("a")
        looped = asyncio.run(on_loop())
    finally:
        host.close()
    for got, tag in ((items, "t"), (looped, "a")):
        print(tag, [len(b) for b in got])
        counts = progress(got)
        assert sorted(counts) == [f"{tag}{i}" for i in range(3)]
        for seen in counts.values():  # later items carry later counts, the last one 6
            assert seen == sorted(seen) and seen[-1] == 6
        # three slots in step: their 18 counts in far fewer items than one a count (a slot
        # woken late on a busy machine may split one step's item)
        assert len(got) <= 12, [len(b) for b in got]


def test_a_token_after_its_reader_ended_waits_for_the_next_reader():
    """A Server probe's reader ends with its event loop; a token the engine makes after that
    (a request it had not yet dropped) must neither raise on the engine's thread (waking a
    closed loop did, which would end the engine's output thread) nor be lost to the next
    probe's reader."""
    import asyncio

    from raybench.scenarios.llm.host import EngineHost

    (t,) = trials({"name": "fixed_tokens", "slots": 1}, scenario="offline", samples=1,
                  input_tokens=4, output_tokens=2, warmup_batches=0)
    host = EngineHost(t)

    async def read_until_end():
        host.end()
        return [b async for b in host.events()]

    try:
        assert asyncio.run(read_until_end()) == []
        host._emit("late", 1, False, 0.0, None)  # the engine's thread, the loop now closed
        host.end()
        assert list(host.stream()) == [[("late", 1, 0.0, False, None)]]
    finally:
        host.close()

"""Inference scenarios, pure parts: the rate search, latency and offline figures, the gate."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from raybench.grid import expand
from raybench.report import assess, inference
from raybench.scenarios import offline, rate_search, server
from raybench.spec import SpecError, validate_sweep

BASE = {"name": "t", "system": {"label": "x"},
        "workload": {"name": "fixed_service", "service_ms": 5.0, "batch_size": 4}}


def trial(**inference_spec):
    return expand(validate_sweep({**BASE, "inference": inference_spec}))[0]


@pytest.mark.parametrize("limit", [37.0, 180.0, 2.0])
def test_search_finds_a_threshold_within_tolerance(limit):
    seen = []

    def probe(rate):
        seen.append(rate)
        return {"rate_qps": rate, "passed": rate <= limit}

    best, probes = rate_search.search_rate(probe, start=50.0, cap=1000.0, tolerance_pct=2.0)
    assert best["rate_qps"] <= limit and best["rate_qps"] >= limit / 1.02
    assert len(probes) == len(seen) <= rate_search.MAX_PROBES
    assert any(not p["passed"] for p in probes)  # the bracket was closed from above too


def test_search_stops_at_the_cap_when_everything_passes():
    best, probes = rate_search.search_rate(lambda r: {"rate_qps": r, "passed": True}, 10, 25, 5)
    assert best["rate_qps"] == 25 and [p["rate_qps"] for p in probes] == [10, 20, 25]


def test_search_stops_starting_probes_after_its_time_budget():
    now = iter(range(0, 1000, 10))  # each probe "takes" 10 s
    best, probes = rate_search.search_rate(lambda r: {"rate_qps": r, "passed": r < 37}, 10, 1000, 1,
                                      budget_s=25, clock=lambda: next(now))
    assert len(probes) == 3 and probes[-1]["truncated"] is True and best["rate_qps"] == 20


def test_search_reports_none_when_nothing_passes():
    best, probes = rate_search.search_rate(lambda r: {"rate_qps": r, "passed": False}, 10, 25, 5)
    assert best is None and len(probes) == rate_search.HALVINGS + 1
    assert probes[-1]["rate_qps"] == pytest.approx(10 / 2**rate_search.HALVINGS)


def test_arrivals_are_poisson_and_the_same_pattern_at_every_rate():
    gaps = server.unit_gaps(0, 20_000)
    assert gaps.mean() == pytest.approx(1.0, rel=0.03)
    assert gaps.std() == pytest.approx(1.0, rel=0.05)  # exponential: std = mean
    assert np.array_equal(gaps[:100], server.unit_gaps(0, 100))
    assert server.query_count(100.0, 2.0, 50) == 200 and server.query_count(10, 2, 50) == 50
    assert server.query_count(10, 2, 50, floor=459) == 459
    # the confirmation runs' sequences: other Poisson sequences of the same seed
    other = server.unit_gaps(0, 20_000, sequence=1)
    assert not np.array_equal(other[:100], gaps[:100])
    assert np.array_equal(other[:100], server.unit_gaps(0, 100, sequence=1))
    assert other.mean() == pytest.approx(1.0, rel=0.03)


def limits_probe(limits: dict[int, float], seen: list, search_limit: float | None = None):
    """A probe whose arrival sequence k passes every rate up to limits[k] when certifying; a
    search probe (sequence 0, the percentile alone) up to `search_limit` (default limits[0])."""
    def probe(rate, sequence=0, certify=False):
        seen.append((round(rate, 3), sequence, certify))
        top = limits[sequence] if certify or search_limit is None else search_limit
        return {"rate_qps": rate, "passed": rate <= top, "queries": 1000 if certify else 250}
    return probe


def test_the_rate_found_is_confirmed_on_fresh_sequences_and_lowered_where_one_fails():
    """Without certification (early_stopping false): the search's own sequence passes up to
    40, the next two up to 36 and 38. The search's answer (within 2% below 40) fails the first
    fresh sequence, so it is lowered by the tolerance (and run on the search's sequence again)
    until every sequence passes it: then within one step below the lowest limit."""
    seen = []
    best, probes = rate_search.search_rate(limits_probe({0: 40.0, 1: 36.0, 2: 38.0}, seen), 50.0,
                                      1000.0, 2.0, confirm_runs=2)
    assert 36.0 / 1.02 <= best["rate_qps"] <= 36.0
    assert best.get("sequence") == 0  # the probe shown is the search's own sequence's
    assert {p["sequence"] for p in probes if p.get("sequence")} == {1, 2}
    at_best = [k for r, k, _ in seen if r == round(best["rate_qps"], 3)]
    assert sorted(at_best) == [0, 1, 2]  # the answer passed on all three
    assert not any(c for _, _, c in seen)  # nothing certified: the percentile's probes alone
    steps = sum(1 for p in probes if p.get("confirming") and not p["sequence"])
    assert 1 <= steps <= rate_search.MAX_CONFIRM_STEPS  # 40 -> 36: down 1, 2, 4 steps, bisected
    quick = trial(scenario="server", latency_bound_ms=30.0, early_stopping=False).inference
    assert rate_search.rule_columns(quick, probes) == {
        "server/rule": "percentile", "server/confirm_runs": 2, "server/certify_s": None,
        "server/certify_queries": None, "server/confirm_steps": steps,
        "server/margin_pct": None}


def test_the_rate_bracketed_by_the_percentile_is_certified_by_the_rule_on_every_sequence():
    """MLPerf's rule (the default): the search brackets by the percentile (its probes pass up
    to 45), then the answer must pass certifying runs on the search's sequence (up to 40) and
    two fresh ones (36, 38): each failure a tolerance lower, every sequence certified again."""
    seen = []
    best, probes = rate_search.search_rate(limits_probe({0: 40.0, 1: 36.0, 2: 38.0}, seen, 45.0),
                                      50.0, 1000.0, 2.0, confirm_runs=2, certify=True)
    assert 36.0 / 1.02 <= best["rate_qps"] <= 36.0
    assert best["sequence"] == 0 and best["confirming"] is True  # a certifying run's
    certified = [k for r, k, c in seen if c and r == round(best["rate_qps"], 3)]
    assert sorted(certified) == [0, 1, 2]
    search = [r for r, _, c in seen if not c]
    assert max(r for r in search if r <= 45.0) > 44.0  # bracketed to the percentile's 45
    own = sum(1 for p in probes if p.get("confirming") and not p["sequence"])
    cols = rate_search.rule_columns(trial(scenario="server", latency_bound_ms=30.0).inference, probes)
    assert cols == {"server/rule": "mlperf", "server/confirm_runs": 2, "server/certify_s": 60.0,
                    "server/certify_queries": 1000, "server/confirm_steps": own - 1,
                    "server/margin_pct": 5.0}
    fixed = trial(scenario="server", latency_bound_ms=30.0, certify_queries=1000).inference
    assert rate_search.rule_columns(fixed, probes)["server/certify_s"] is None
    assert 3 <= own - 1 <= rate_search.MAX_CONFIRM_STEPS  # 45 -> 36: 1, 2, 4, 8 steps, bisected
    # the sequence that failed last is run first at the next rate: no rate runs sequence 1
    # after another sequence has failed there
    assert len([1 for _, k, c in seen if c]) <= 3 * (own + 1)


def test_every_certifying_run_sends_as_many_queries_as_the_first():
    """A search probe sends probe_seconds of queries at its rate; the certifying runs all send
    what the first (at the search's answer) did, certify_seconds of queries there and at least
    the 459 that can certify p99, rounded to 1, 2 or 5 x 10^k queries (so two searches
    whose answers differ a little run the same sequences): fixed, a run's verdict only
    worsens as the rate rises."""
    inf = trial(scenario="server", latency_bound_ms=30.0, probe_seconds=10.0,
                certify_seconds=60.0, min_queries=200).inference
    length = rate_search.RunLength(inf)
    assert length(50.0, False) == 500 and length(10.0, False) == 200
    assert length(25.0, True) == 2000  # the first: 60 s at 25 queries/s, 1,500, rounded
    assert length(12.0, True) == length(40.0, True) == 2000
    for rate in (24.0, 30.0, 50.0):  # 1,440-3,000 queries: one length
        assert rate_search.RunLength(inf)(rate, True) == 2000
    assert rate_search.RunLength(inf)(13.0, True) == 1000  # 780
    assert [rate_search.standard_count(n) for n in (1, 3.1, 3.2, 7.0, 7.1, 459, 9999)] == [
        1, 2, 5, 5, 10, 500, 10000]
    short = rate_search.RunLength(trial(scenario="server", latency_bound_ms=30.0,
                                        certify_seconds=1.0).inference)
    assert short(25.0, True) == 459 and short(100.0, True) == 459


def test_a_certifying_count_set_by_the_sweep_holds_whatever_the_bracket_says():
    """certify_queries fixes every certifying run's length from the sweep alone: brackets
    ending either side of a rounding edge (34.95 and 36 queries/s at 20 s: 699 and 720
    queries, rounded to 500 and 1,000) certify on the same sequences; never fewer than early
    stopping can certify at the percentile."""
    def inf(**kw):
        return trial(scenario="server", latency_bound_ms=30.0, certify_seconds=20.0,
                     **kw).inference
    assert rate_search.RunLength(inf())(34.95, True) == 500
    assert rate_search.RunLength(inf())(36.0, True) == 1000
    for rate in (34.95, 36.0, 5.0, 400.0):
        assert rate_search.RunLength(inf(certify_queries=1000))(rate, True) == 1000
    assert rate_search.RunLength(inf(certify_queries=1000))(36.0, False) == 360  # probes: probe_seconds
    assert rate_search.RunLength(inf(certify_queries=100))(36.0, True) == 459
    assert rate_search.RunLength(inf(certify_queries=100, latency_percentile=90.0))(
        36.0, True) == 100


def test_an_answer_no_fresh_sequence_confirms_is_not_reported():
    seen = []
    best, probes = rate_search.search_rate(limits_probe({0: 40.0, 1: 0.0, 2: 40.0}, seen), 50.0,
                                      1000.0, 2.0, confirm_runs=2, certify=True)
    assert best is None
    assert len({p["rate_qps"] for p in probes if p.get("confirming")}) == (
        rate_search.MAX_CONFIRM_STEPS)
    # without confirmation the search's answer is its own sequence's
    best, _ = rate_search.search_rate(limits_probe({0: 40.0}, []), 50.0, 1000.0, 2.0)
    assert 40.0 / 1.02 <= best["rate_qps"] <= 40.0


def test_confirmation_keeps_to_the_search_budget():
    now = iter(range(0, 1000, 10))  # each probe "takes" 10 s
    best, probes = rate_search.search_rate(limits_probe({0: 37.0, 1: 37.0}, []), 10, 1000, 1,
                                      budget_s=55, clock=lambda: next(now), confirm_runs=1,
                                      certify=True)
    assert best is None and probes[-1]["truncated"] is True


def test_latency_summary_counts_unanswered_queries_as_late():
    lat = np.array([0.010] * 95 + [0.030] * 3 + [np.inf] * 2)
    recs = [{"service_s": 0.005} for _ in range(98)] + [None] * 2  # a call per query
    run = {"rate": 50.0, "latency_s": lat, "records": recs, "stopped_early": False}
    s = server.summarize(run, bound_s=0.050, percentile=99)
    assert s["p50_ms"] == pytest.approx(10.0) and s["p99_ms"] is None  # inf: beyond any bound
    assert s["passed"] is False and s["answered"] == 98
    answered = {**run, "latency_s": lat[:98], "records": recs[:98]}
    ok = server.summarize(answered, 0.050, 99, early_stopping=False)  # the percentile alone
    assert ok["passed"] is True and ok["p99_ms"] == pytest.approx(30.0)
    assert ok["queries_per_call"] == 1.0
    # MLPerf's rule: 98 queries are too few for early stopping to certify any percentile
    assert server.summarize(answered, 0.050, 99)["passed"] is False


def test_a_batched_call_is_one_call_for_its_queries():
    shared, alone = {"service_s": 0.020}, {"service_s": 0.010}
    run = {"rate": 5.0, "latency_s": np.array([0.03, 0.025, 0.02]),
           "records": [shared, shared, alone], "stopped_early": False}
    s = server.summarize(run, None, 99)
    assert s["queries_per_call"] == 1.5 and s["service_mean_ms"] == pytest.approx(15.0)
    assert server.distinct_calls(run["records"] + [None]) == [shared, alone]


def test_time_to_first_token_and_per_token_latency():
    # 10 ms queueing + 4 ms prefill + 9 tokens more at 2 ms each = 32 ms from arrival.
    rec = {"service_s": 0.022, "first_token_s": 0.004, "tokens": 10}
    run = {"rate": 1.0, "latency_s": np.array([0.032]), "records": [rec],
           "stopped_early": False}
    s = server.summarize(run, None, 99)
    assert s["ttft_p50_ms"] == pytest.approx(14.0) and s["tpot_p50_ms"] == pytest.approx(2.0)


def records(replicas=2, nodes=("10.0.0.1", "10.0.0.2"), batches=5, n=4, service=0.1):
    out = []
    for r in range(replicas):
        for b in range(batches):
            t = 1000.0 + b * 0.125  # 0.1 s of work every 0.125 s: 80% busy
            out.append({"replica": r, "node": nodes[r % len(nodes)], "n": n, "t_start": t,
                        "t_end": t + service, "service_s": service, "first_token_s": None,
                        "tokens": None, "matches": 3 if b == 0 else 0,
                        "compared": 4 if b == 0 else 0})
    return out


def test_the_pass_is_timed_on_one_clock_across_nodes():
    # Two replicas on two nodes whose clocks differ by 1,000 s; each did 5 batches of 0.1 s
    # every 0.125 s. On Ray every batch also carries the driver's clock when it arrived.
    recs = records()
    for r in recs:
        if r["replica"] == 1:
            r["t_start"] += 1000.0  # node 2's clock runs ahead
            r["t_end"] += 1000.0
    assert offline.pass_seconds(recs) == pytest.approx(1000.6)  # replica clocks: skew enters
    for r in recs:
        r["arrived_s"] = 50.0 + (r["t_end"] - 1000.0 * r["replica"] - 1000.0) + 0.002
    assert offline.pass_seconds(recs) == pytest.approx(0.6)  # 4 x 0.125 + 0.1, driver's clock
    m = offline.summarize(recs, [{"setup_s": 1.0, "rss_peak_mb": 1.0, "device_name": "cpu"}] * 2,
                          trial(scenario="offline", replicas=2, samples=40))
    assert m["infer/samples_per_s"] == pytest.approx(40 / 0.6)
    # each replica's wait between calls is read on its own clock: no skew in it
    assert m["infer/replica_wait_p50_ms"] == pytest.approx(25.0)
    assert m["infer/replica_wait_p90_ms"] == pytest.approx(25.0)


def test_the_pass_starts_at_its_first_call_however_late_ray_data_hands_it_over():
    """Ray Data hands a task's calls over together, and the pass's first calls wait longest (its
    pipeline filling): one replica's 8 calls of 0.1 s, back to back, in two tasks of four; the
    second task's calls reach the driver 0.05 s after its last call ends, the first's 0.3 s
    after. The pass is the replica's 0.8 s on its own clock. Timed by each batch's arrival
    less its service time, it was 0.25 s: 3.2 times the throughput the replica gave."""
    recs = []
    for b in range(8):
        t = 5000.0 + 0.1 * b  # the replica's clock
        recs.append({"replica": 0, "node": "10.0.0.1", "n": 4, "t_start": t, "t_end": t + 0.1,
                     "service_s": 0.1})
    task_end = {0: 5000.4, 1: 5000.8}  # each task's last call's end, the replica's clock
    for r in recs:
        task = int(r["t_start"] >= 5000.4 - 1e-9)
        # the driver's clock runs 4,000 s behind the replica's
        r["arrived_s"] = task_end[task] - 4000.0 + (0.3 if task == 0 else 0.05)
    assert offline.pass_seconds(recs) == pytest.approx(0.8)
    old = max(r["arrived_s"] for r in recs) - min(r["arrived_s"] - r["service_s"] for r in recs)
    assert old == pytest.approx(0.25)
    # a second node, whose clock runs 60 s ahead, makes two calls ending 0.15 s after the
    # first node's last, each reaching the driver 0.01 s after its end: each node's clock is
    # put on the driver's by its own quickest hand-over, so the pass of 0.95 s comes out short
    # by their difference (0.05 - 0.01 s), whatever the nodes' clocks say
    for b in range(2):
        t = 5060.75 + 0.1 * b
        recs.append({"replica": 1, "node": "10.0.0.2", "n": 4, "t_start": t, "t_end": t + 0.1,
                     "service_s": 0.1, "arrived_s": t + 0.1 - 4060.0 + 0.01})
    assert offline.pass_seconds(recs) == pytest.approx(0.95 - (0.05 - 0.01))


def test_offline_inputs_are_made_before_the_pass_and_handed_out_in_turn(monkeypatch):
    """The Ray pass cycles a pool of batches made before it (on the lent H200, inputs made
    during the pass held a replica to 57.6% busy), which each replica takes from the object
    store itself: each full batch gets the pool's batch in turn, with the pool's ids (its
    samples), compared with the reference on first use only; the short last batch gets the
    inputs made for it."""
    import ray

    t = trial(scenario="offline", samples=18, accuracy_target=0.9, accuracy_samples=12)
    assert offline.pool_batches(t) == math.ceil(18 / 4)  # no more batches than the pass has
    t = trial(scenario="offline", samples=400, accuracy_target=0.9, accuracy_samples=12)
    assert offline.pool_batches(t) == offline.POOL_BATCHES
    t = trial(scenario="offline", samples=400, accuracy_target=0.9, accuracy_samples=60)
    assert offline.pool_batches(t) == 15  # the accuracy samples fill 15 batches of 4
    monkeypatch.setattr(ray, "get", lambda ref: ref)  # the refs stand for what they hold
    seen = []

    class Served:
        trial = trial(scenario="offline", samples=26)  # 6 batches of 4 and one of 2

        def serve(self, ids, inputs, check):
            # fixed_service's one input is named `id`, like the rows' column (it broke the pass)
            assert list(inputs) == ["id"] and list(inputs["id"]) == list(ids)
            seen.append((list(ids), check))
            return {"replica": 0, "n": len(ids)}

        def stats(self):
            return {"setup_s": 0.0}

    replica = object.__new__(offline._RayReplica)
    replica.replica, replica.seq = Served(), 0
    replica.pool = [offline._made(Served.trial, np.arange(lo, lo + 4)) for lo in range(0, 12, 4)]
    replica.tail = offline._made(Served.trial, np.array([24, 25]))
    for j in range(7):  # batch numbers, as Ray Data hands them over
        out = replica({"batch": np.array([j])})
        assert list(out["n"]) == [len(seen[-1][0])]  # one row per call, its samples counted
    assert seen[:3] == [([0, 1, 2, 3], True), ([4, 5, 6, 7], True), ([8, 9, 10, 11], True)]
    assert seen[3:6] == [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9, 10, 11], False)]
    assert seen[6] == ([24, 25], True)  # the short last batch: its own samples


def test_offline_figures_from_records():
    t = trial(scenario="offline", replicas=2, samples=40, project_samples=13368,
              accuracy_target=0.9)
    stats = [{"setup_s": 2.0, "rss_peak_mb": 100.0, "device_name": "cpu"},
             {"setup_s": 3.0, "rss_peak_mb": 120.0, "device_name": "cpu"}]
    m = offline.summarize(records(), stats, t)
    wall = 4 * 0.125 + 0.1
    assert m["infer/samples"] == 40 and m["infer/wall_s"] == pytest.approx(wall)
    assert m["infer/samples_per_s"] == pytest.approx(40 / wall)
    assert m["infer/replica_samples_per_s_mean"] == pytest.approx(40.0)  # 4 samples / 0.1 s
    assert json.loads(m["infer/node_samples_per_s"]) == pytest.approx(
        {"10.0.0.1": 20 / wall, "10.0.0.2": 20 / wall})
    assert m["infer/busy_pct"] == pytest.approx(100 * 1.0 / (2 * wall))
    assert m["infer/projected_s"] == pytest.approx(3.0 + 13368 / (40 / wall))
    assert m["infer/accuracy"] == pytest.approx(6 / 8) and m["infer/accuracy_ok"] is False
    assert m["host/rss_peak_mb"] == 120.0


def frame(**cols):
    n = len(next(iter(cols.values())))
    base = {"stage": ["benchmark"] * n, "status": ["ok"] * n, "run_id": ["r"] * n,
            "trial_key": [f"k{i}" for i in range(n)], "workload.name": ["resnet"] * n}
    return pd.DataFrame({**base, **cols})


def test_scaling_efficiency_against_one_replica_of_the_same_config():
    df = frame(**{"inference.scenario": ["offline"] * 4, "inference.replicas": [1, 2, 1, 2],
                  "hardware.precision": ["fp32", "fp32", "bf16", "bf16"],
                  "infer/samples_per_s": [100.0, 180.0, 150.0, 300.0]})
    eff = assess.with_scaling(df)["infer/scaling_efficiency_pct"].tolist()
    assert eff == pytest.approx([100.0, 90.0, 100.0, 100.0])
    assert inference.offline_scaling(df) is not None


def test_a_task_metric_gate_takes_the_worst_replica_score():
    """The detector's gate: each replica scored its own validation pass; the lowest counts."""
    t = expand(validate_sweep({"name": "t", "system": {"label": "x"},
                               "workload": {"name": "xview3_frcnn"},
                               "inference": {"accuracy_target": 0.3}}))[0]
    scores = [{"xview3/aggregate": 0.42, "xview3/detection_f1": 0.8, "samples": 25},
              {"xview3/aggregate": 0.28, "xview3/detection_f1": 0.7, "samples": 25}]
    stats = [{"score": json.dumps(s), "accuracy_check_s": 2.0 + k} for k, s in enumerate(scores)]
    m = offline.accuracy([], stats, t)
    assert m["infer/accuracy_metric"] == "xview3/aggregate" and m["infer/accuracy"] == 0.28
    assert m["infer/accuracy_ok"] is False and m["infer/score/xview3/detection_f1"] == 0.7
    assert m["infer/accuracy_compared"] == 25 and m["infer/accuracy_check_s"] == 3.0
    assert assess.validity({"status": "ok", **m}) == ["xview3/aggregate 0.2800 < target 0.3"]
    ok = offline.accuracy([], stats[:1], t)
    assert ok["infer/accuracy"] == 0.42 and ok["infer/accuracy_ok"] is True
    assert offline.accuracy([], [{"score": None}], t)["infer/accuracy_ok"] is False  # none run
    df = frame(**{k: [v] for k, v in m.items()})
    assert inference.accuracy_gate(df).layout.yaxis.title.text == "xview3/aggregate"


def test_the_gate_and_a_missed_bound_make_a_row_invalid():
    row = {"status": "ok", "infer/accuracy": 0.9375, "infer/accuracy_target": 0.99,
           "infer/accuracy_ok": False}
    assert assess.validity(row) == ["accuracy 0.9375 < target 0.99"]
    agree = {**row, "infer/accuracy_metric": "agreement"}
    assert assess.validity(agree) == ["agreement 0.9375 < target 0.99"]
    assert assess.validity({**row, "infer/accuracy": 1.0, "infer/accuracy_ok": True}) == []
    srv = {"status": "ok", "server/met_bound": False, "server/latency_percentile": 99.0,
           "server/latency_bound_ms": 25.0}
    assert assess.validity(srv) == ["no rate kept p99 latency under 25 ms"]
    # by MLPerf's rule a run may keep its percentile and still fail: the row says why
    certify = {**srv, "server/rule": "mlperf", "server/early_stopping": "latency not met",
               "server/queries_needed": 459, "server/queries": 200}
    assert assess.validity(certify) == [
        "no rate kept p99 latency under 25 ms by MLPerf's rule (early stopping: latency not "
        "met; 459 queries needed, 200 sent)"]


def test_recommendation_of_an_inference_sweep_skips_the_gated_row():
    df = frame(**{"inference.scenario": ["offline"] * 2, "hardware.precision": ["fp32", "bf16"],
                  "infer/samples_per_s": [100.0, 190.0], "infer/accuracy": [1.0, 0.93],
                  "infer/accuracy_target": [0.99, 0.99], "infer/accuracy_ok": [True, False]})
    rec = assess.recommend(df)
    assert rec["fastest"]["label"] == "precision=fp32" and rec["ranked_by"] == "infer/samples_per_s"
    assert inference.accuracy_gate(df) is not None


def test_server_figures_read_the_search_column_and_the_trial_latencies():
    search = json.dumps([{"rate_qps": 50.0, "p99_ms": 20.0, "passed": True, "queries": 200},
                         {"rate_qps": 100.0, "p99_ms": None, "passed": False, "queries": 200}])
    df = frame(**{"inference.scenario": ["server"], "server/search": [search],
                  "server/latency_percentile": [99.0], "server/latency_bound_ms": [25.0],
                  "server/rate_qps": [50.0]})
    assert inference.server_search(df) is not None
    details = {"k0": {"records": [{"latency_ms": [1.0, 2.0, None]}]}}
    assert inference.server_latency(details, df) is not None


def test_spec_checks_of_the_inference_section():
    with pytest.raises(SpecError, match="latency_bound_ms"):
        trial(scenario="server")
    with pytest.raises(SpecError, match="has no inference scenario"):
        validate_sweep({**BASE, "workload": {"name": "allreduce"}, "inference": {}})
    with pytest.raises(SpecError, match="one GPU"):
        validate_sweep({**BASE, "hardware": {"num_gpus": 2}, "inference": {}})
    with pytest.raises(SpecError, match="inference.replica"):
        validate_sweep({**BASE, "inference": {"replica": 2}})
    sweep = validate_sweep({**BASE, "inference": {}, "grid": {"replicas": [1, 2]}})
    trials = expand(sweep)
    assert [t.inference.replicas for t in trials] == [1, 2]
    assert trials[1].resources()["workers"] == 2 and trials[0].key != trials[1].key


def test_training_trial_keys_do_not_change_with_the_inference_section_absent():
    import hashlib

    t = expand(validate_sweep(BASE))[0]
    from raybench.trials import KEY_NEUTRAL

    payload = {"workload.name": "fixed_service",
               **{s: getattr(t, s).model_dump(mode="json")
                  for s in ("workload", "hardware", "measure")}}
    for section, fields in KEY_NEUTRAL.items():
        for name in fields:
            payload.get(section, {}).pop(name, None)
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert t.key == hashlib.sha256(blob.encode()).hexdigest()[:12]
    assert t.inference is None and "inference.replicas" not in t.config()
    assert math.isfinite(t.resources()["total"]["CPU"])


def test_replicas_warm_every_call_size_the_scenario_will_send(monkeypatch):
    """Each new input shape's first call pays for cuDNN's autotuning: a replica warms the
    Server's joined queries (1 to max_batch_queries of query_samples) and the Offline pass's
    short last batch before it is timed, besides its full batch."""
    from raybench.scenarios.replica import Replica
    from raybench.workloads.fixed_service import FixedService

    calls = []
    monkeypatch.setattr(FixedService, "_work", lambda self, n: calls.append(n))
    t = expand(validate_sweep({**BASE, "workload": {**BASE["workload"], "batch_size": 8},
                               "inference": {"scenario": "server", "rate_qps": 5,
                                             "query_samples": 2, "max_batch_queries": 4}}))[0]
    r = Replica(t)
    assert r._other_call_sizes() == [2, 4, 6]
    # the FLOP count's call, the two timed warmups of a full batch, then each other size
    assert calls == [8, 8, 8, 2, 2, 4, 4, 6, 6] and len(r.warmup_s) == 2
    calls.clear()
    r = Replica(trial(scenario="offline", samples=18, warmup_batches=1))
    assert r._other_call_sizes() == [2] and calls == [4, 4, 2]
    assert Replica(trial(scenario="offline", samples=16))._other_call_sizes() == []


def test_the_rate_reported_sits_a_margin_under_the_highest_certified():
    """Certified by three sequences (limits 40, 36, 38), the highest rate all pass is within a
    2% step under 36; with a 5% margin the answer is a twentieth under that, its run on the
    search's own sequence (LoadGen's schedule) passing there: at the edge itself LoadGen's run
    on the same arrivals is a coin flip. The probe says the rate it sits under, and the row
    counts no step-down for it."""
    seen = []
    best, probes = rate_search.search_rate(limits_probe({0: 40.0, 1: 36.0, 2: 38.0}, seen), 50.0,
                                      1000.0, 5.0, confirm_runs=2, certify=True,
                                      certify_tolerance_pct=2.0, margin_pct=5.0)
    assert 36.0 / 1.02 <= best["certified_qps"] <= 36.0
    assert best["rate_qps"] == pytest.approx(best["certified_qps"] / 1.05)
    assert best["sequence"] == 0 and best["margin"] and best["passed"]
    assert probes[-1] is best  # the last run: the search's sequence at the margin
    inf = trial(scenario="server", latency_bound_ms=30.0).inference
    cols = rate_search.rule_columns(inf, probes)
    assert cols["server/margin_pct"] == 5.0
    assert cols["server/confirm_steps"] == sum(
        1 for p in probes if p.get("confirming") and not p["sequence"]) - 2
    # without a margin: the edge
    edge, _ = rate_search.search_rate(limits_probe({0: 40.0, 1: 36.0, 2: 38.0}, []), 50.0,
                                      1000.0, 5.0, confirm_runs=2, certify=True,
                                      certify_tolerance_pct=2.0)
    assert edge["rate_qps"] == best["certified_qps"] and "certified_qps" not in edge


def test_a_margin_run_that_fails_goes_a_margin_lower_and_three_failures_give_no_answer():
    """The search's sequence passes up to 36 when certifying, but its runs under 36 / 1.03
    fail (as one stall fails a run of 459 queries at p99): the answer is the first margin
    rate that passes; where none of the three passes, there is no answer."""
    def probe(rate, sequence=0, certify=False, fails_under=36.0 / 1.03 * 1.001, floor=0.0):
        passed = rate <= 36.0 and not (certify and sequence == 0 and floor < rate < fails_under)
        return {"rate_qps": rate, "passed": passed}

    def search(p):
        return rate_search.search_rate(p, 50.0, 1000.0, 5.0, confirm_runs=2, certify=True,
                                       certify_tolerance_pct=2.0, margin_pct=5.0)

    best, probes = search(lambda r, s=0, certify=False: probe(r, s, certify, floor=31.2))
    margins = [p for p in probes if p.get("margin")]
    assert [p["passed"] for p in margins] == [False, False, True]
    assert best is margins[-1] and best["rate_qps"] == pytest.approx(
        best["certified_qps"] / 1.05**3)
    none, probes = search(probe)
    assert none is None and len([p for p in probes if p.get("margin")]) == 3

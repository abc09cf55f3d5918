"""Statistics on recorded per-rank timings: sums, percentiles, skew, CV."""

from __future__ import annotations

import pytest

from raybench.metrics import per_rank_table, summarize, with_interval


def record(rank: int, step_s: float, n: int = 10, wait_s: float = 0.0, bs: int = 32, **kw):
    return {
        "rank": rank, "local_rank": rank, "node_rank": 0, "hostname": "h", "device": "cpu",
        "device_name": "cpu", "steps_per_window": n, "samples_per_step": bs,
        "warmup_s": [step_s] * 2, "wait_s": [wait_s] * n, "compute_s": [step_s - wait_s] * n,
        "windows_s": [step_s * n], "setup_s": 0.1, "loss_final": 1.0, "params": 2_000_000,
        "model_size_mb": 7.6, "peak_allocated_mb": kw.get("alloc"), "peak_reserved_mb": None,
        "rss_peak_mb": 100.0 + rank,
    }


def test_global_throughput_is_sum_of_ranks():
    m = summarize([record(0, 0.1), record(1, 0.2)])
    # rank 0: 320 / 1.0 s; rank 1: 320 / 2.0 s -> 480, not 2 x 320 and not the mean
    assert m["train/samples_per_s"] == pytest.approx(480.0)
    assert m["train/samples_per_s_per_worker"] == pytest.approx(240.0)
    assert m["train/global_batch_size"] == 64
    assert m["train/rank_skew_pct"] == pytest.approx(100.0)


def test_percentiles_pool_all_steps():
    r = record(0, 0.01, n=100)
    r["compute_s"] = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    r["windows_s"] = [sum(r["compute_s"])]
    m = summarize([r])
    assert m["train/step_time_p50_ms"] == pytest.approx(50.5)
    assert m["train/step_time_p99_ms"] == pytest.approx(99.01)
    assert m["train/step_time_mean_ms"] == pytest.approx(50.5)
    assert m["train/step_time_cv_pct"] == pytest.approx(100 * 29.011 / 50.5, rel=1e-3)


def test_data_wait_separated_from_compute():
    m = summarize([record(0, 0.1, wait_s=0.025)])
    assert m["train/data_wait_mean_ms"] == pytest.approx(25.0)
    assert m["train/compute_time_mean_ms"] == pytest.approx(75.0)
    assert m["train/data_wait_pct"] == pytest.approx(25.0)


def test_memory_none_on_cpu_and_max_on_gpu():
    cpu = summarize([record(0, 0.1)])
    assert cpu["mem/peak_allocated_mb"] is None
    assert cpu["host/rss_peak_mb"] == 100.0
    gpu = summarize([record(0, 0.1, alloc=500.0), record(1, 0.1, alloc=700.0)])
    assert gpu["mem/peak_allocated_mb"] == 700.0


def test_repeat_cv():
    r = record(0, 0.1, n=10)
    r["compute_s"] = [0.1] * 20
    r["wait_s"] = [0.0] * 20
    r["windows_s"] = [1.0, 1.25]
    m = summarize([r])
    # windows give 320 and 256 samples/s: sample std 64/sqrt(2) over a mean of 288
    assert m["train/repeat_cv_pct"] == pytest.approx(100 * (64 / 2**0.5) / 288.0, rel=1e-6)
    assert summarize([record(0, 0.1)])["train/repeat_cv_pct"] is None


def test_windows_and_their_confidence_interval():
    r = record(0, 0.1, n=10)
    r["compute_s"] = [0.1] * 50
    r["wait_s"] = [0.0] * 50
    r["windows_s"] = [1.0, 1.25, 1.0, 1.1, 0.9]  # 320, 256, 320, 290.9, 355.6 samples/s
    m = with_interval(summarize([r]))  # the driver adds the interval to the rank's figures
    assert m["train/window_samples_per_s"] == pytest.approx([320, 256, 320, 290.91, 355.56],
                                                            abs=0.01)
    low, high = m["train/samples_per_s_ci95_low"], m["train/samples_per_s_ci95_high"]
    mean = sum(m["train/window_samples_per_s"]) / 5
    assert 256 <= low < mean < high <= 355.6  # within the windows, around their mean
    assert "train/samples_per_s_ci95_low" not in summarize([r])  # no scipy in the ranks
    assert with_interval(summarize([r]))["train/samples_per_s_ci95_low"] == low  # seeded
    assert m["trial/category"] == "quick"  # five windows, but 12% apart: not settled
    r["windows_s"] = [1.0, 1.01, 0.99, 1.0, 1.02]
    assert summarize([r])["trial/category"] == "canonical"
    r["windows_s"] = [1.0, 1.01, 0.99, 1.0]
    r["compute_s"] = [0.1] * 40
    r["wait_s"] = [0.0] * 40
    assert summarize([r])["trial/category"] == "quick"  # settled, but four windows
    two = with_interval(summarize([record(0, 0.1)]))
    assert two["train/samples_per_s_ci95_low"] is None and len(two["train/window_samples_per_s"]) == 1


def test_per_rank_table_sorted():
    rows = per_rank_table([record(1, 0.2), record(0, 0.1)])
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[1]["samples_per_s"] == pytest.approx(160.0)


def test_a_nan_or_inf_loss_on_any_rank_is_flagged():
    # the results file stores nan as null, so the flag is what tells a diverged run from no loss
    assert summarize([record(0, 0.1), record(1, 0.1)])["train/loss_finite"] is True
    assert summarize([record(0, 0.1), {**record(1, 0.1), "loss_final": float("nan")}])[
        "train/loss_finite"] is False
    assert summarize([{**record(0, 0.1), "loss_final": float("inf")}])["train/loss_finite"] is False
    assert summarize([{**record(0, 0.1), "loss_final": None}])["train/loss_finite"] is None
    # an epoch-based run that diverged in an earlier epoch is flagged even if it came back
    epochs = [{"epoch": 1, "train_s": 1.0, "eval_s": 0.1, "loss": float("nan")},
              {"epoch": 2, "train_s": 1.0, "eval_s": 0.1, "loss": 0.5}]
    assert summarize([{**record(0, 0.1), "loss_final": 0.5, "epochs": epochs}])[
        "train/loss_finite"] is False


def test_every_row_names_its_device():
    assert summarize([record(0, 0.1), record(1, 0.1)])["device"] == "cpu"
    mixed = [record(r, 0.1) for r in range(3)]
    for r, name in zip(mixed, ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
                               "NVIDIA H100 80GB HBM3"], strict=True):
        r["device_name"] = name
    assert summarize(mixed)["device"] == "NVIDIA A100-SXM4-80GB,NVIDIA H100 80GB HBM3"


def test_ranks_sharing_a_gpu_count_its_energy_once_and_its_rate_whole():
    gpu = {"energy_j": 50.0, "throttled": False, "throttle_reasons": "", "uuid": "GPU-a"}
    shared = [{**record(r, 0.1), "device_name": "NVIDIA H100 80GB HBM3", "precision": "bf16",
               "flops_per_sample": 1e9, "ranks_per_gpu": 2, "gpu": dict(gpu)} for r in (0, 1)]
    m = summarize(shared)
    assert m["gpu/energy_j"] == 50.0  # one GPU, sampled by both ranks
    assert m["gpu/energy_per_sample_j"] == pytest.approx(50.0 / 640)
    # 320 samples/s per rank, 640 on the GPU: 0.64 TFLOP/s of the H100's 989.5 in bf16
    assert m["perf/achieved_tflops_per_gpu"] == pytest.approx(0.64)
    apart = [{**r, "ranks_per_gpu": 1, "gpu": {**gpu, "uuid": f"GPU-{i}"}}
             for i, r in enumerate(shared)]
    m = summarize(apart)
    assert m["gpu/energy_j"] == 100.0 and m["perf/achieved_tflops_per_gpu"] == pytest.approx(0.32)


def test_fixed_cost_phases_from_the_runner_and_rank_stamps():
    from raybench.metrics.overhead import fixed_cost

    def stamped(rank, entry, setup, measured_end, **extra):
        r = record(rank, 0.1, n=10)  # a 1.0 s measured window, warmup 2 x 0.1 s
        r["stamps"] = {"loop_entry": entry, "setup_start": entry + 0.5, "setup_end": setup,
                       "measure_end": measured_end, **extra}
        return r

    recs = [stamped(0, 110.0, 111.0, 113.0, loop_exit=113.4, process_start=103.0,
                    imported=108.0),
            stamped(1, 112.0, 112.7, 113.2, process_start=104.0, imported=109.5)]
    # the slower rank decides each phase
    stamps = {"trial_start": 100.0, "fit_start": 101.5, "fit_end": 114.0}
    m = fixed_cost(recs, stamps)
    assert m["overhead/trial_start_s"] == pytest.approx(1.5)
    assert m["overhead/train_start_s"] == pytest.approx(10.5)  # to the last rank's entry
    # ... in two parts, the last rank's: its process's launch 2.5, that process to the loop 8
    assert (m["overhead/worker_launch_s"], m["overhead/worker_start_s"]) == pytest.approx(
        (2.5, 8.0))
    # a process Ray had started before the fit: no launch, all of it is the worker's start
    early = [stamped(0, 110.0, 111.0, 113.0, loop_exit=113.4, process_start=90.0)]
    e = fixed_cost(early, stamps)
    assert (e["overhead/worker_launch_s"], e["overhead/worker_start_s"]) == pytest.approx(
        (0.0, 8.5))
    assert m["overhead/rank_prep_s"] == pytest.approx(0.5)
    assert m["overhead/setup_s"] == pytest.approx(0.5)  # rank 0: 0.5, rank 1: 0.2
    assert m["overhead/warmup_s"] == pytest.approx(0.2)
    assert m["overhead/record_s"] == pytest.approx(0.2)  # last measure end to rank 0's exit
    assert m["overhead/teardown_s"] == pytest.approx(0.6)
    assert m["overhead/fixed_s"] == pytest.approx(114.0 - 100.0 - 1.0)
    assert fixed_cost([record(0, 0.1)], stamps) == {}  # records without stamps: no breakdown

    # a worker group's later trial: no workers started for it, its time runs from the last
    # trial's hand-over to its own
    later = fixed_cost(recs, {"trial_start": 109.0, "fit_end": 114.0})
    assert "overhead/train_start_s" not in later and "overhead/trial_start_s" not in later
    assert later["overhead/fixed_s"] == pytest.approx(114.0 - 109.0 - 1.0)
    assert later["overhead/teardown_s"] == pytest.approx(0.6)
    # ... and its rank 0 says how it got from the last trial's exit to its own entry
    assert "overhead/handover_s" not in later
    recs[0]["stamps"].update(last_exit=108.8, handed_over=109.6)
    later = fixed_cost(recs, {"trial_start": 109.0, "fit_end": 114.0})
    assert (later["overhead/handover_s"], later["overhead/release_s"]) == pytest.approx(
        (0.8, 0.4))


def test_bench_overhead_breakdown_adds_up_per_trial():
    from raybench.bench.overhead import breakdown

    def row(start, end, measured, **phases):
        return {"start_time": f"2026-01-01T00:00:{start:06.3f}+00:00",
                "end_time": f"2026-01-01T00:00:{end:06.3f}+00:00", "train/measured_s": measured,
                "overhead/report_s": 0.1, **{f"overhead/{k}_s": v for k, v in phases.items()}}

    # a group of two: the first starts the workers, the second follows at once; the sweep's
    # own time around them (Tune, files, report) is 4 s
    rows = [row(10.0, 30.0, 2.0, train_start=15.0, worker_launch=7.0, setup=1.0, fixed=18.0),
            row(30.0, 34.0, 2.5, setup=1.0, fixed=1.5)]
    b = breakdown(rows, 28.2)
    assert b["sweep_loop"] == pytest.approx((28.2 - 24.2) / 2)
    assert b["train_start"] == pytest.approx(7.5) and b["setup"] == pytest.approx(1.0)
    assert b["train_start.worker_launch"] == pytest.approx(3.5)  # beside, not in the sum
    parts = sum(v for k, v in b.items() if "." not in k)
    assert parts == pytest.approx((28.2 - 4.5) / 2)  # the sweep outside its windows, per trial


def test_bench_overhead_ratio_pairs_rounds_and_judges_the_goal():
    from raybench.bench.overhead import paired_ratio

    # the machine's speed moves by half between rounds; the runners' gap (0.5%) stays: paired
    # rounds see only the gap (a ratio of medians would see the drift's medians too)
    theirs = [100.0, 150.0, 120.0]
    r = paired_ratio([x * 0.995 for x in theirs], theirs, 0.99)
    assert r["geomean"] == pytest.approx(0.995) and r["ci95"] == pytest.approx([0.995, 0.995])
    assert r["verdict"] == "met"
    missed = paired_ratio([97.0, 97.5, 97.2], [100.0] * 3, 0.99)
    assert missed["verdict"] == "missed" and missed["ci95"][1] < 0.99
    # 1% of noise per round cannot decide a 1% goal in three rounds
    noisy = paired_ratio([100.0, 101.0, 99.5], [100.0] * 3, 0.99)
    assert noisy["verdict"] == "undecided" and "straddles 0.99" in noisy["reason"]
    assert noisy["ci95"][0] < 0.99 < noisy["ci95"][1]
    one = paired_ratio([100.0], [101.0], 0.99)
    assert one["ci95"] is None and one["verdict"] == "undecided"
    assert "verdict" not in paired_ratio([1.0, 2.0], [1.0, 1.0], None)  # no goal, no verdict


def test_bench_overhead_rounds_come_to_their_figures_and_verdicts():
    from raybench.bench.overhead import LATER_TRIAL_MARGIN_S, _Rounds

    def row(rate, fixed, position, wait, start=10.0, end=20.0):
        return {"start_time": f"2026-01-01T00:00:{start:06.3f}+00:00",
                "end_time": f"2026-01-01T00:00:{end:06.3f}+00:00", "train/measured_s": 2.0,
                "train/samples_per_s": rate, "overhead/fixed_s": fixed,
                "trial/group_position": position, "host/run_wait_pct": wait,
                "host/cpu_util_pct": float("nan")}  # a column a row lacks is left out

    tally = _Rounds()
    for bare, ours, theirs in ((100.0, 99.5, 100.0), (120.0, 119.4, 120.0)):  # drift, same gap
        rows = [row(ours - 0.5, 9.0, 0, 19.0), row(ours + 0.5, 2.0, 1, 21.0)]
        tally.add(bare, rows, 25.0, [row(theirs, 7.0, 0, 5.0), row(theirs, 7.4, 0, 5.0)])
    out = tally.summary([130.0, 131.0])
    assert out["throughput_vs_torchrun"]["by_round"] == pytest.approx([0.995, 0.995])
    assert out["throughput_vs_torchrun"]["verdict"] == "met"
    assert out["fixed_overhead_s_median"] == pytest.approx((25.0 - 4.0) / 2)
    assert (out["first_trial_fixed_s_median"], out["next_trials_fixed_s_median"]) == (9.0, 2.0)
    assert out["torchrun_trial_fixed_s_median"] == pytest.approx(7.2)
    assert out["later_trial_fixed_cost"]["limit_s"] == pytest.approx(7.2 + LATER_TRIAL_MARGIN_S)
    assert out["later_trial_fixed_cost"]["verdict"] == "met"
    assert out["window_host_median"] == {"raybench": {"host/run_wait_pct": 20.0},
                                         "torchrun": {"host/run_wait_pct": 5.0}}
    assert list(out["raybench_samples_per_s_by_group_position"]) == [0, 1]


def test_bench_overhead_interval_holds_the_true_ratio_95_times_in_100():
    """The interval's own promise, by simulation: rounds whose log-ratios scatter normally about
    a known ratio; its 95% interval must hold that ratio in about 95% of 400 such runs."""
    import numpy as np

    from raybench.bench.overhead import paired_ratio

    rng = np.random.default_rng(7)
    true = 0.97
    held = 0
    for _ in range(400):
        theirs = rng.uniform(100, 160, size=4)  # the machine's own speed, round by round
        ours = theirs * true * np.exp(rng.normal(0.0, 0.02, size=4))
        low, high = paired_ratio(list(ours), list(theirs), None)["ci95"]
        held += low <= true <= high
    assert 0.91 <= held / 400 <= 0.985

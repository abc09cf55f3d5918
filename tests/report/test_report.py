"""Report logic as pure functions: validity, recommendations, Pareto, figures, escaping."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from raybench.report import figures, model, page
from raybench.report.assess import config_label, notes, recommend, validity, varied_columns


def row(key, batch, world, thr, mem=None, rss=1000.0, status="ok", cv=2.0, steps=50, **kw):
    return {"sweep": "s", "run_id": "r1", "stage": "benchmark", "trial_key": key,
            "status": status, "error": None if status == "ok" else "boom",
            "workload.batch_size": batch, "train/world_size": world, "hardware.num_gpus": world,
            "hardware.precision": kw.get("precision", "bf16"), "train/samples_per_s": thr,
            "mem/peak_allocated_mb": mem, "host/rss_peak_mb": rss,
            "train/step_time_cv_pct": cv, "train/measured_steps": steps, "system": "x",
            "start_time": "2026-11-22T00:00:00"}


FRAME = pd.DataFrame([
    row("a", 16, 1, 100.0, mem=4000), row("b", 32, 1, 180.0, mem=7000),
    row("c", 16, 2, 190.0, mem=4000), row("d", 32, 2, 340.0, mem=7000),
    row("e", 64, 2, 0.0, status="oom"), row("f", 64, 1, 400.0, mem=9000, cv=25.0),
])


def test_validity_reasons():
    assert validity(row("a", 1, 1, 1.0)) == []
    assert validity(row("a", 1, 1, 1.0, status="oom")) == ["out of memory"]
    assert "CV 25.0% > 10%" in validity(row("a", 1, 1, 1.0, cv=25.0))[0]
    assert "only 4 measured steps" in validity(row("a", 1, 1, 1.0, steps=4))[0]
    # with repeats, the windows' spread is judged, not bursty steps
    assert validity({**row("a", 1, 1, 1.0, cv=25.0), "train/repeat_cv_pct": 1.1}) == []
    assert "across repeats 6.0% > 5%" in validity(
        {**row("a", 1, 1, 1.0, cv=2.0), "train/repeat_cv_pct": 6.0})[0]
    assert "throttled" in validity({**row("a", 1, 1, 1.0), "gpu/throttled": True})[0]
    assert "loss became nan/inf" in validity({**row("a", 1, 1, 1.0), "train/loss_finite": False})[0]
    assert validity({**row("a", 1, 1, 1.0), "train/loss_finite": True}) == []
    assert validity({**row("a", 1, 1, 1.0), "train/loss_finite": None}) == []  # no loss: inference


def test_power_cap_is_a_note_and_slowdowns_invalidate():
    capped = {**row("a", 1, 1, 1.0), "gpu/throttled": False, "gpu/throttle_reasons":
              "sw_power_cap", "gpu/power_capped_pct": 62.5, "gpu/power_mean_w": 694.6,
              "gpu/sm_clock_mean_mhz": 1755.0}
    assert validity(capped) == []
    assert notes(capped) == ["at the GPU's power limit in 62% of samples, 695 W mean, "
                             "SM clock 1755 MHz mean"]
    thermal = {**capped, "gpu/throttled": True, "gpu/throttle_reasons": "sw_power_cap,hw_thermal"}
    assert validity(thermal) == ["GPU throttled (hw_thermal)"]
    # rows written before the split (throttled true for the cap alone) are read the new way
    old = {**row("a", 1, 1, 1.0), "gpu/throttled": True, "gpu/throttle_reasons": "sw_power_cap"}
    assert validity(old) == [] and notes(old)[0].startswith("at the GPU's power limit")
    assert notes(row("a", 1, 1, 1.0)) == []
    page_rows = model([{"dir": "r", "frame": pd.DataFrame([capped]), "details": {},
                        "system": {}}])["rows"]
    assert page_rows[0]["validity_notes"].startswith("at the GPU's power limit")


def test_text_cells_read_back_from_parquet_judge_as_written(tmp_path):
    """pandas 3 reads a missing string cell as NaN: on the lent H100 every ViT row without a
    throttle reason came back 'GPU throttled (nan)' beside one power-capped row."""
    capped = {**row("a", 1, 1, 1.0), "gpu/throttled": False,
              "gpu/throttle_reasons": "sw_power_cap", "cluster/nccl_net": "Socket",
              "cluster/nodes_used": 2}
    plain = {**row("b", 1, 1, 1.0), "gpu/throttled": False, "gpu/throttle_reasons": None,
             "cluster/nccl_net": None, "cluster/nodes_used": 2}
    pd.DataFrame([capped, plain]).to_parquet(tmp_path / "r.parquet")
    back = pd.read_parquet(tmp_path / "r.parquet").to_dict("records")
    assert [validity(r) for r in back] == [[], []]
    assert notes(back[1]) == [] and "TCP sockets" in notes(back[0])[1]
    page_rows = model([{"dir": "r", "frame": pd.read_parquet(tmp_path / "r.parquet"),
                        "details": {}, "system": {}}])["rows"]
    assert [r["valid"] for r in page_rows] == [True, True]
    # throttled with no reason named: still a slowdown, read back as written
    pd.DataFrame([capped, {**plain, "gpu/throttled": True}]).to_parquet(tmp_path / "t.parquet")
    back = pd.read_parquet(tmp_path / "t.parquet").to_dict("records")
    assert [validity(r) for r in back] == [[], ["GPU throttled (see telemetry)"]]


def test_header_names_every_node_as_it_saw_itself():
    gpu_node = {"host": "dgx1", "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "driver": "580.1"}] * 8,
                "cuda": {"torch_cuda": "13.0", "nccl": "2.28.9"}, "cpu": {"model": "AMD EPYC",
                "logical": 256}, "memory_gb": 2015.6, "versions": {"torch": "2.15.0"},
                "nccl_env": {"NCCL_IB_HCA": "mlx5"}, "gpu_topology": "GPU0 X NV12"}
    system = {"nodes": {"10.0.0.5": gpu_node, "10.0.0.6": {"error": "no answer in 120 s"}}}
    header = model([{"dir": "r", "frame": pd.DataFrame([row("a", 1, 1, 1.0)]), "details": {},
                     "system": system}])["header"]
    assert header[1] == ("node 10.0.0.5 (dgx1): 8x NVIDIA A100-SXM4-80GB, driver 580.1; CUDA "
                         "13.0, NCCL 2.28.9 (NCCL_IB_HCA=mlx5); CPU AMD EPYC x256, 2015.6 GB; "
                         "torch 2.15.0; topology in system_info.json")
    assert header[2] == "node 10.0.0.6: facts unavailable (no answer in 120 s)"


def test_recommendations_skip_invalid_and_respect_budget():
    rec = recommend(FRAME, memory_budget_mb=5000)
    assert rec["fastest"]["trial_key"] == "d"  # "f" is faster but its CV makes it invalid
    assert rec["fastest_within_budget"]["trial_key"] == "c"
    assert rec["best_accuracy_per_s"] is None
    scored = FRAME.assign(**{"det/map50": [0.5, 0.4, 0.5, 0.2, None, 0.9]})
    assert recommend(scored)["best_accuracy_per_s"] is None  # no row names it its accuracy
    scored = scored.assign(**{"eval/accuracy_metric": "det/map50"})
    best = recommend(scored)["best_accuracy_per_s"]
    assert best["trial_key"] == "c" and best["accuracy_metric"] == "det/map50"  # 0.5 x 190


def test_measure_columns_that_follow_an_axis_are_not_axes():
    df = pd.DataFrame({"workload.mode": ["inference", "inference", "train", "train"],
                       "workload.tile": [256, 512, 256, 512],
                       "measure.warmup_steps": [10, 10, 5, 5],  # set per mode
                       "hardware.num_gpus": [1, 1, 1, 1]})
    assert varied_columns(df) == ["workload.mode", "workload.tile"]
    assert config_label(df.iloc[0].to_dict(), varied_columns(df)) == "mode=inference, tile=256"
    swept = pd.concat([df.assign(**{"measure.measure_steps": n}) for n in (20, 50)])
    assert varied_columns(swept)[-1] == "measure.measure_steps"  # swept on its own: an axis


def test_tiles_are_ranked_by_the_headline_their_workload_declares():
    """vit_tiles declares pixels/s its headline (tiles of different sizes are not the same
    sample); rows name it, and rows of runs older than that column find it by workload.name."""
    declared = {"perf/headline_metric": "train/pixels_per_s", "perf/size_axis": "workload.tile"}
    small = {**row("s", 8, 1, 978.0), "workload.tile": 384, "train/pixels_per_s": 978.0 * 384**2}
    large = {**row("l", 8, 1, 602.0), "workload.tile": 512, "train/pixels_per_s": 602.0 * 512**2}
    rec = recommend(pd.DataFrame([small | declared, large | declared]))
    assert rec["ranked_by"] == "train/pixels_per_s" and rec["fastest"]["trial_key"] == "l"
    assert "(157.8 Mpixels/s)" in page.rate_text(rec["fastest"])
    old_run = pd.DataFrame([small | {"workload.name": "vit_tiles"},
                            large | {"workload.name": "vit_tiles"}])
    assert recommend(old_run)["fastest"]["trial_key"] == "l"
    # a workload that declares nothing (or no workload named): samples/s, tiles or not
    assert recommend(pd.DataFrame([small, large]))["fastest"]["trial_key"] == "s"
    assert recommend(FRAME)["ranked_by"] == "train/samples_per_s"


def test_pareto_front():
    pts = [(1.0, 10.0), (2.0, 5.0), (2.0, 20.0), (3.0, 15.0), (4.0, 30.0)]
    assert figures.pareto_front(pts) == [0, 2, 4]


def test_scaling_efficiency_against_one_rank():
    fig = figures.scaling_efficiency(FRAME)
    series = {t.name: dict(zip(t.x, t.y, strict=True)) for t in fig.data}
    assert series["ideal"] == {1: 100.0, 2: 100.0}
    assert series["batch_size=16"][2] == pytest.approx(95.0)  # 190 / (2 x 100)
    assert series["batch_size=32"][2] == pytest.approx(340 / 360 * 100)


def test_figures_absent_where_they_do_not_apply():
    single = FRAME[FRAME["train/world_size"] == 1]
    assert figures.scaling_efficiency(single) is None
    assert figures.throughput_vs_batch(FRAME.iloc[:1]) is None
    assert figures.preprocess_stage(FRAME) is None
    assert figures.step_time_distributions({}, FRAME) is None


def test_throughput_series_by_ranks():
    fig = figures.throughput_vs_batch(FRAME)
    names = sorted(t.name for t in fig.data)
    assert names == ["world_size=1", "world_size=2"]


def test_html_escapes_user_text():
    evil = "<script>alert(1)</script>"
    frame = FRAME.assign(sweep=evil)
    m = model([{"dir": "/tmp/run", "frame": frame, "details": {}, "system": {}}])
    text = page.render(m, figures.all_figures(m["frame"], m["details"]))
    assert evil not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # figure JSON never closes the script element it sits in
    tail = text.split("</script>", 1)[1]  # past the embedded plotly.js
    assert "alert(1)</script>" not in tail


def test_markdown_and_json_outputs(tmp_path):
    from raybench.report import write

    run = tmp_path / "run"
    run.mkdir()
    FRAME.to_parquet(run / "results.parquet")
    out = write([run], run / "report.html", memory_budget_mb=5000)
    text = out.read_text()
    assert text.count("Plotly.newPlot") >= 3
    assert "<script src=" not in text  # plotly.js is inline: the page works offline
    summary = json.loads((run / "benchmark_report.json").read_text())
    assert summary["recommendations"]["fastest_within_budget"]["trial_key"] == "c"
    md = (run / "benchmark_report.md").read_text()
    assert md.startswith("# s") and "| valid |" in md


def history_frame(values, n=6, cv_pct=0.5, seed=0):
    """One configuration's runs, a day apart, each with `n` windows around its value."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame([
        {**row("k", 16, 1, v), "run_id": f"w{i}", "recorded_at": f"2026-11-{10 + i:02d}T00:00",
         "train/window_samples_per_s": list(v * (1 + cv_pct / 100 * rng.standard_normal(n))),
         "code_version": "abc"}
        for i, v in enumerate(values)])


def test_history_rows_judged_against_their_earlier_runs():
    from raybench.report.judge import judge_history

    judged = judge_history(history_frame([100.0, 101.0, 99.0, 90.0]))
    assert list(judged["run_id"]) == ["w1", "w2", "w3"]  # the first has nothing before it
    assert list(judged["verdict"]) == ["unchanged", "unchanged", "slower"]
    assert judged["p"].iloc[2] < 0.05 and judged["ratio"].iloc[2] == pytest.approx(0.9, abs=0.01)
    # a configuration whose runs moved 100, 110, 95, 105 (CV 6.3%): twice that spread is the
    # threshold, and a run at 92 (10% below their mean) is within it, though its windows
    # differ significantly
    noisy = judge_history(history_frame([100.0, 110.0, 95.0, 105.0, 92.0]))
    last = noisy.iloc[-1]
    assert last["threshold"] == "run-to-run spread"
    assert last["threshold_pct"] == pytest.approx(12.6, abs=0.05)
    assert last["verdict"] == "unchanged" and last["p"] < 0.05
    # rows without windows (written before raybench kept them) decide nothing
    bare = history_frame([100.0, 80.0]).assign(**{"train/window_samples_per_s": None})
    assert list(judge_history(bare)["verdict"]) == ["inconclusive"]


def test_history_compares_a_machine_only_with_itself_and_names_the_upgrade():
    """An H100 history at 3,000 samples/s and an A100 row at 1,500 of the same configuration:
    neither judged against the other; a real drop on the H100 after a torch upgrade: slower
    against the H100's own runs, the upgrade named."""
    from raybench.report.judge import judge_history

    def on(gpu, values, torch_versions, seed):
        frame = history_frame(values, seed=seed)
        return frame.assign(**{"system/fingerprint": f"fp-{gpu}", "system/accelerator": gpu,
                               "system/torch": torch_versions})

    h100 = on("H100", [3000.0, 3010.0, 2990.0], ["2.14.1"] * 3, 1)
    a100 = on("A100", [1500.0], ["2.14.1"], 2).assign(recorded_at="2026-11-20T00:00",
                                                       run_id="a")
    judged = judge_history(pd.concat([h100, a100], ignore_index=True))
    assert "a" not in set(judged["run_id"]) and (judged["verdict"] != "slower").all()
    slower = on("H100", [2600.0], ["2.15.0"], 3).assign(recorded_at="2026-11-21T00:00",
                                                          run_id="upgrade")
    judged = judge_history(pd.concat([h100, a100, slower], ignore_index=True))
    flagged = judged[judged["verdict"] == "slower"]
    assert list(flagged["run_id"]) == ["upgrade"]
    assert flagged["ratio"].iloc[0] == pytest.approx(2600 / 3000, abs=0.01)  # its own runs
    assert flagged["software_change"].iloc[0] == "torch 2.14.1 -> 2.15.0"


def test_fingerprint_of_a_cluster_and_of_one_machine():
    from raybench.results import fingerprint

    def node(gpus, torch_version="2.15.0", driver="560.35"):
        return {"cpu": {"model": "Xeon 8480"}, "cuda": {"torch_cuda": "12.8", "nccl": "2.27.3"},
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": driver}] * gpus,
                "versions": {"torch": torch_version, "ray": "2.60.0", "raybench": "0.1.0"}}

    cluster = {**node(0), "nodes": {"10.0.0.1": node(0), "10.0.0.2": node(8),
                                    "10.0.0.3": node(8, driver="550.90")}}
    fp = fingerprint.of(cluster)
    assert fp["system/accelerator"] == "NVIDIA H100 80GB HBM3"
    assert fp["system/accelerators_per_node"] == 8 and fp["system/nodes"] == 3
    assert fp["system/driver"] == "550.90|560.35"  # nodes that differ are shown to differ
    laptop = fingerprint.of({"cpu": {"model": "i7"}, "gpus": [], "versions": {"torch": "2.15"}})
    assert laptop["system/accelerator"] == "cpu" and laptop["system/nodes"] == 1
    assert laptop["system/fingerprint"] != fp["system/fingerprint"]
    # software is not hardware: an upgrade keeps the fingerprint
    upgraded = {**cluster, "nodes": {k: {**v, "versions": {**v["versions"], "torch": "2.16"}}
                                     for k, v in cluster["nodes"].items()}}
    assert fingerprint.of(upgraded)["system/fingerprint"] == fp["system/fingerprint"]
    assert fingerprint.software_changes(fp, fingerprint.of(upgraded)) == "torch 2.15.0 -> 2.16"


def test_comparison_normalises_per_rank():
    two = pd.concat([FRAME.assign(**{"train/samples_per_s_per_worker": FRAME["train/samples_per_s"]
                                     / FRAME["train/world_size"]}),
                     FRAME.assign(run_id="r2", system="y", **{
                         "train/samples_per_s_per_worker": 1.0})], ignore_index=True)
    fig = figures.comparison_per_rank(two)
    assert [t.name for t in fig.data] == ["r1 (x)", "r2 (y)"]
    assert figures.comparison_per_rank(FRAME) is None


def test_index_and_history_pages(tmp_path):
    from raybench.report import write, write_history, write_index

    for name in ("a", "b"):
        run = tmp_path / "sweep" / name
        run.mkdir(parents=True)
        FRAME.assign(run_id=name).to_parquet(run / "results.parquet")
        write([run], run / "report.html")
    index = write_index(tmp_path).read_text()
    assert index.count("<a href='./sweep/") == 2
    assert "data-v='400.0'" in index  # best samples/s of each run
    history_frame([100.0, 101.0, 80.0]).to_parquet(tmp_path / "history.parquet")
    hist = write_history(tmp_path, tmp_path / "history.html").read_text()  # read in place
    assert "Slower than the earlier runs" in hist and "w2" in hist


def test_accuracy_chart_only_with_accuracy():
    assert figures.accuracy_vs_throughput(FRAME) is None
    scored = FRAME.assign(**{"det/map50": [0.5, 0.4, 0.5, 0.2, None, 0.9]})
    assert figures.accuracy_vs_throughput(scored) is None  # no row names it its accuracy
    fig = figures.accuracy_vs_throughput(scored.assign(**{"eval/accuracy_metric": "det/map50"}))
    assert fig.layout.title.text == "det/map50 vs throughput"
    assert len(fig.data[0].x) == 5  # the OOM trial has no accuracy and is not drawn


def test_gpu_timelines_from_trial_telemetry():
    from tests.test_telemetry import stream

    assert figures.gpu_timelines({"k": {"records": [{"rank": 0, "telemetry": []}]}}) is None
    details = {"k": {"records": [{"rank": 0, "telemetry": stream()},
                                 {"rank": 1, "telemetry": stream(power=200.0)}]}}
    fig = figures.gpu_timelines(details)
    assert len(fig.data) == 4  # utilisation and power for each rank
    assert list(fig.data[1].y)[:2] == [300.0, 300.0]
    assert fig.data[0].x[0] == 0.0


def test_epoch_curves_from_rank0_epochs():
    assert figures.epoch_curves({"k": {"records": [{"rank": 0, "epochs": None}]}}) is None
    epochs = [{"epoch": 1, "train_s": 30.0, "xview3/aggregate": 0.1},
              {"epoch": 2, "train_s": 28.0, "xview3/aggregate": 0.4}]
    details = {"k": {"records": [{"rank": 1, "epochs": []}, {"rank": 0, "epochs": epochs}],
                     "row": {"eval/accuracy_metric": "xview3/aggregate"}}}
    fig = figures.epoch_curves(details)
    assert len(fig.data) == 2
    assert list(fig.data[0].y) == [0.1, 0.4] and list(fig.data[1].y) == [30.0, 28.0]
    assert fig.data[0].name == "k xview3/aggregate"


def tile_row(key, tile, batch, thr, rss, mode="train", fwd=None, bwd=None, opt=None, step=None):
    r = {**row(key, batch, 1, thr, rss=rss), "workload.tile": tile, "workload.mode": mode,
         "perf/size_axis": "workload.tile"}
    r.update({"train/forward_mean_ms": fwd, "train/backward_mean_ms": bwd,
              "train/optimizer_mean_ms": opt, "train/step_time_mean_ms": step})
    return r


def test_tile_figures_draw_a_line_per_batch():
    from raybench.report import tiles

    df = pd.DataFrame([tile_row("a", 64, 4, 90.0, 500.0), tile_row("b", 128, 4, 30.0, 900.0),
                       tile_row("c", 64, 8, 120.0, 700.0), tile_row("d", 128, 8, 40.0, 1500.0),
                       tile_row("e", 256, 8, 0.0, 0.0) | {"status": "oom"}])
    thr = tiles.throughput_vs_size(df)
    assert [t.name for t in thr.data] == ["batch_size=4", "batch_size=8"]
    assert list(thr.data[1].x) == [64, 128] and list(thr.data[1].y) == [120.0, 40.0]
    mem = tiles.memory_vs_size(df)
    assert list(mem.data[0].y) == [500.0, 900.0]  # the process peak on CPU rows
    with_gpu = df.assign(**{"mem/peak_allocated_mb": [100.0, 300.0, 150.0, 450.0, None]})
    assert list(tiles.memory_vs_size(with_gpu).data[1].y) == [150.0, 450.0]  # device peak
    assert tiles.throughput_vs_size(df[df["workload.tile"] == 64]) is None  # no tile axis
    names = [n for n, _ in figures.all_figures(df, {})]
    assert "size_throughput" in names and "size_memory" in names


def test_step_breakdown_stacks_the_timed_phases_and_the_rest():
    from raybench.report import tiles

    df = pd.DataFrame([
        tile_row("a", 64, 4, 90.0, 500.0, fwd=10.0, bwd=20.0, opt=5.0, step=40.0),
        tile_row("b", 128, 4, 30.0, 900.0, fwd=30.0, bwd=60.0, opt=5.0, step=94.0),
        tile_row("c", 64, 4, 200.0, 400.0, mode="inference", fwd=8.0, step=9.0)])
    fig = tiles.step_breakdown(df)
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["forward", "backward", "optimizer",
                                          "rest of the step"]
    assert list(fig.data[0].y) == [10.0, 30.0, 8.0]
    assert list(fig.data[2].y) == [5.0, 5.0, 0.0]  # inference has no optimizer phase
    # the rest: 40 - 35, and never negative where phases add up to more than the mean step
    assert list(fig.data[3].y) == pytest.approx([5.0, 0.0, 1.0])
    assert tiles.step_breakdown(FRAME) is None  # no workload timed phases


def test_published_reference_figures_beside_the_best_valid_matching_row():
    from raybench.report import reference

    rn50 = {"workload.name": "resnet", "workload.depth": 50, "workload.image_size": 224}

    def trained(key, device, precision, per_gpu, valid=True):
        return {**rn50, "trial_key": key, "device": device, "hardware.precision": precision,
                "train/samples_per_s_per_worker": per_gpu, "valid": valid}

    judged = pd.DataFrame([
        trained("a", "NVIDIA A100-SXM4-80GB", "amp_fp16", 2223.0),
        trained("b", "NVIDIA A100-SXM4-80GB", "amp_fp16", 1900.0),
        trained("c", "NVIDIA A100-SXM4-80GB", "amp_fp16", 3000.0, valid=False),  # not trusted
        trained("d", "Tesla V100-SXM2-32GB", "fp32", 320.4),
        trained("e", "NVIDIA L40S", "bf16", 1500.0),  # no published figure: not shown
        {**rn50, "trial_key": "f", "device": "Tesla T4", "hardware.precision": "fp32",
         "workload.batch_size": 64, "infer/samples_per_s": 800.0, "infer/replicas_used": 2,
         "valid": True},
        {**rn50, "trial_key": "g", "device": "Tesla T4", "hardware.precision": "fp32",
         "workload.batch_size": 32, "infer/samples_per_s": 900.0, "infer/replicas_used": 1,
         "valid": True},  # another batch than the source's
    ])
    got = {(r["gpu"], r["mode"], r["precision"]): r for r in reference.compare(judged)}
    assert set(got) == {("A100", "train", "amp_fp16"), ("V100-SXM2-32GB", "train", "fp32"),
                        ("T4", "inference", "fp32")}
    a100 = got[("A100", "train", "amp_fp16")]
    assert a100["trial_key"] == "a" and a100["ratio"] == pytest.approx(2223.0 / 2470.0, abs=1e-3)
    assert got[("V100-SXM2-32GB", "train", "fp32")]["published_per_gpu"] == 356.0  # not 16GB's
    t4 = got[("T4", "inference", "fp32")]
    assert t4["trial_key"] == "f" and t4["measured_per_gpu"] == 400.0 and t4["batch"] == 64
    assert "DeepLearningExamples" in t4["source"]
    # a quick row is shown beside a published figure, but not as a ratio unless asked
    quick = judged.assign(**{"trial/category": "quick"})
    q = {(r["gpu"], r["mode"]): r for r in reference.compare(quick)}[("A100", "train")]
    assert q["ratio"] is None and "quick row" in q["note"] and q["measured_per_gpu"] == 2223.0
    assert {(r["gpu"], r["mode"]): r for r in reference.compare(quick, allow_quick=True)}[
        ("A100", "train")]["ratio"] == a100["ratio"]
    m = {"title": "t", "header": [], "columns": ["trial_key"], "rows": [],
         "references": reference.compare(judged)}
    assert "Published reference figures" in page.render(m, [])


def test_report_command_options(tmp_path, capsys):
    from raybench.report.__main__ import main

    run = tmp_path / "run"
    run.mkdir()
    FRAME.to_parquet(run / "results.parquet")
    assert main([str(run), "--allow-quick", "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["--history", str(tmp_path / "nothing")]) == 2
    assert "holds no history" in capsys.readouterr().err
    # issue 41, item 13: exit 2 naming the path, never a traceback
    assert main(["--index", str(tmp_path / "nothing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    FRAME.iloc[:0].to_parquet(empty / "results.parquet")
    assert main([str(empty)]) == 2
    assert f"{empty / 'results.parquet'} holds no rows" in capsys.readouterr().err
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "results.parquet").write_bytes((run / "results.parquet").read_bytes()[:300])
    assert main([str(cut)]) == 2
    err = capsys.readouterr().err
    assert f"{cut / 'results.parquet'} cannot be read" in err and "raybench.rebuild" in err


def test_index_lists_a_damaged_run_and_links_only_paths(tmp_path):
    """A run directory named like a URL scheme is linked as a path; a damaged table is listed
    as such and the other runs still are (issue 41, items 13 and 14)."""
    from raybench.report import write, write_index

    for name in ("javascript:alert(1)", "cut"):
        run = tmp_path / "s" / name
        run.mkdir(parents=True)
        FRAME.to_parquet(run / "results.parquet")
        write([run], run / "report.html")
    cut = tmp_path / "s" / "cut" / "results.parquet"
    cut.write_bytes(cut.read_bytes()[:300])
    index = write_index(tmp_path).read_text()
    assert "href='./s/javascript%3Aalert%281%29/report.html'" in index
    assert "href='javascript" not in index
    assert "unreadable" in index and "cut/results.parquet cannot be read" in index


def test_markdown_shows_values_as_text_never_markup(tmp_path):
    from raybench.report import write

    run = tmp_path / "run"
    run.mkdir()
    evil = "<b onmouseover=alert(1)>x</b><!--"
    FRAME.assign(**{"workload.note": [evil, "a", "b", "c", "d", "e"], "sweep": evil}
                 ).to_parquet(run / "results.parquet")
    write([run], run / "report.html")
    md = (run / "benchmark_report.md").read_text()
    assert "<b" not in md and "<!--" not in md
    assert "&lt;b onmouseover=alert(1)&gt;x&lt;/b&gt;&lt;!--" in md


def test_a_report_killed_while_written_leaves_the_old_page_whole(tmp_path, monkeypatch):
    """Issue 41, item 3: the page, benchmark_report.* and the run files are written to a
    temporary and renamed; a kill at the rename leaves the old file and no temporary."""
    from raybench import store
    from raybench.report import write

    run = tmp_path / "run"
    run.mkdir()
    FRAME.to_parquet(run / "results.parquet")
    page_path = write([run], run / "report.html")
    before = page_path.read_text()

    def killed(src, dst):
        raise KeyboardInterrupt  # SIGINT as the new page is renamed into place

    monkeypatch.setattr(store.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write([run.parent / "run"], run / "report.html")
    assert page_path.read_text() == before
    assert [p.name for p in run.iterdir() if ".tmp" in p.name] == []


def test_loadgen_runs_stand_beside_raybench_s_own_with_their_verdict():
    from raybench.report import inference

    rows = pd.DataFrame([
        {"trial_key": "a", "status": "ok", "inference.scenario": "server",
         "workload.service_ms": 5.0, "server/rate_qps": 40.0,
         "loadgen/scheduled_samples_per_s": 38.8, "loadgen/validity": "INVALID",
         "loadgen/early_stopping_met": False, "loadgen/perf_constraints_met": True,
         "loadgen/min_duration_met": True},
        {"trial_key": "b", "status": "ok", "inference.scenario": "offline",
         "workload.service_ms": 10.0, "infer/samples_per_s": 74.3,
         "loadgen/samples_per_s": 74.2, "loadgen/validity": "VALID",
         "loadgen/early_stopping_met": True, "loadgen/perf_constraints_met": None,
         "loadgen/min_duration_met": True},
        {"trial_key": "c", "status": "ok", "inference.scenario": "server",
         "workload.service_ms": 20.0, "server/rate_qps": 9.0},  # LoadGen not asked
    ])
    fig = inference.loadgen_runs(rows)
    own, theirs = fig.data
    assert list(own.y) == [40.0, 74.3] and list(theirs.y) == [38.8, 74.2]
    assert own.x[0].endswith("(server)") and own.x[1].endswith("(offline)")
    assert list(theirs.text) == ["LoadGen: INVALID", "LoadGen: VALID"]
    assert "early stopping not met, latency constraint met" in theirs.hovertext[0]
    assert list(theirs.marker.color) == ["darkorange", "seagreen"]
    assert inference.loadgen_runs(rows.iloc[2:]) is None
    assert inference.loadgen_runs(rows.drop(columns=[c for c in rows if "loadgen" in c])) is None

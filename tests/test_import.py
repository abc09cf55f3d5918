"""`raybench import` (raybench/results/imported.py): a LoadGen log folder LoadGen itself wrote, and
vLLM `bench serve` and AIPerf results in their documented formats, become rows of a run and of
the history; two imports of one configuration pair in `compare`; a file of none of them is exit
2 with its fix, and nothing is written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from raybench import compare
from raybench.records import present
from raybench.report.__main__ import main as report_main
from raybench.results import history
from raybench.results.imported import main, trial_key
from raybench.store import read_rows

# `vllm bench serve --save-result` (vllm/benchmarks/serve.py: main() writes date, backend,
# label, model_id, num_prompts, request_rate, burstiness, max_concurrency, then benchmark()'s
# result dict; the statistics are mean/median/std_<metric>_ms and p<N>_<metric>_ms for the
# percentiles asked for, 99 by default; --save-detailed adds the per-request lists)
VLLM = {
    "date": "20261128-101500", "backend": "vllm", "label": None,
    "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 200, "request_rate": "inf",
    "burstiness": 1.0, "max_concurrency": 64, "duration": 20.0, "completed": 200, "failed": 0,
    "total_input_tokens": 25_600, "total_output_tokens": 25_600, "request_throughput": 10.0,
    "request_goodput": None, "output_throughput": 1280.0, "total_token_throughput": 2560.0,
    "max_output_tokens_per_s": 1400.0, "max_concurrent_requests": 64,
    "mean_ttft_ms": 50.0, "median_ttft_ms": 45.0, "std_ttft_ms": 10.0, "p99_ttft_ms": 120.0,
    "mean_tpot_ms": 20.0, "median_tpot_ms": 19.5, "std_tpot_ms": 2.0, "p99_tpot_ms": 30.0,
    "mean_itl_ms": 19.8, "median_itl_ms": 19.0, "std_itl_ms": 3.0, "p99_itl_ms": 41.0,
    "mean_e2el_ms": 2590.0, "median_e2el_ms": 2570.0, "std_e2el_ms": 90.0,
    "p99_e2el_ms": 2900.0,
}

# AIPerf's profile_export_aiperf.json (docs/tutorials/working-with-profile-exports.md in
# ai-dynamo/aiperf): one object per metric, its unit and statistics; the run's summary as
# objects with `avg`; start/end times; the GPU telemetry of --gpu-telemetry; input_config
AIPERF = {
    "request_throughput": {"unit": "requests/sec", "avg": 13.16},
    "request_latency": {"unit": "ms", "avg": 6550.4, "p50": 5799.9, "p90": 8594.2,
                        "p99": 9381.6, "min": 4996.2, "max": 9383.4, "std": 1171.1},
    "time_to_first_token": {"unit": "ms", "avg": 1588.8, "p50": 787.5, "p90": 3695.1,
                            "p99": 4119.3},
    "inter_token_latency": {"unit": "sec", "avg": 0.05176, "p50": 0.05198, "p99": 0.05587},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 1274.6},
    "output_token_throughput_per_user": {"unit": "tokens/sec/user", "avg": 19.3},
    "output_sequence_length": {"unit": "tokens", "avg": 96.85},
    "input_sequence_length": {"unit": "tokens", "avg": 550.0},
    "benchmark_duration": {"unit": "sec", "avg": 15.2},
    "request_count": {"unit": "requests", "avg": 200.0},
    "total_isl": {"unit": "tokens", "avg": 110_000.0},
    "start_time": "2025-10-17T20:22:08.939332", "end_time": "2025-10-17T20:22:24.967633",
    "error_summary": [], "goodput": None, "error_request_count": None,
    "telemetry_data": {"endpoints": {"localhost:9401": {"gpus": {
        "gpu_0": {"gpu_index": 0, "gpu_name": "NVIDIA H100 80GB HBM3"},
        "gpu_1": {"gpu_index": 1, "gpu_name": "NVIDIA H100 80GB HBM3"}}}}},
    "input_config": {"endpoint": {"model_names": ["openai/gpt-oss-20b"], "streaming": True},
                     "loadgen": {"concurrency": 100}},
}


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def only_run(root: Path, name: str = "imported") -> Path:
    (run,) = (root / name).iterdir()
    return run


def test_a_vllm_result_is_a_row_of_the_run_and_the_history_and_pairs_in_compare(tmp_path):
    src = write(tmp_path / "vllm.json", VLLM)
    root = tmp_path / "results"
    assert main([str(src), "--output", str(root), "--accelerator", "NVIDIA H100 80GB HBM3",
                 "--gpus", "8"]) == 0
    run = only_run(root)
    (row,) = read_rows(run / "results.parquet").to_dict("records")
    assert row["status"] == "ok" and row["stage"] == "benchmark" and row["run_id"] == run.name
    assert row["import.tool"] == "vllm" and row["import.model"] == VLLM["model_id"]
    assert row["import.sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert row["import.scenario"] == "concurrency" and row["import.concurrency"] == 64
    assert (row["import.input_tokens"], row["import.output_tokens"]) == (128, 128)
    assert row["serve/output_tokens_per_s"] == 1280.0 and row["serve/requests_per_s"] == 10.0
    assert row["serve/ttft_p50_ms"] == 45.0 and row["serve/ttft_p99_ms"] == 120.0
    assert row["serve/tpot_mean_ms"] == 20.0 and row["serve/e2e_p99_ms"] == 2900.0
    assert row["serve/itl_p50_ms"] == 19.0 and row["serve/input_tokens_per_s"] == 1280.0
    # what the file does not give stays empty: no p90 asked for, no per-user speed
    assert not present(row["serve/ttft_p90_ms"])
    assert not present(row.get("serve/tokens_per_s_per_user"))
    assert row["system/accelerator"] == "NVIDIA H100 80GB HBM3"
    assert row["system/accelerators_per_node"] == 8 and row["start_time"] == "2026-11-28T10:15:00"
    assert row["serve/output_tokens_per_s_per_gpu"] == 1280.0 / 8
    assert (run / "trials" / f"0000_{row['trial_key']}.json").is_file()
    assert list(history.read(root)["trial_key"]) == [row["trial_key"]]

    # the same configuration measured again (another day, other figures): the same key, so
    # compare pairs the two runs (no windows in either: it cannot judge them, and says so)
    again = write(tmp_path / "again.json", {**VLLM, "date": "20261129-090000",
                                            "output_throughput": 1100.0})
    assert main([str(again), "--output", str(root), "--accelerator", "NVIDIA H100 80GB HBM3",
                 "--gpus", "8"]) == 0
    first, second = sorted((root / "imported").iterdir())
    (result,) = compare.compare_runs(compare.load_run(str(first)), compare.load_run(str(second)))
    assert result["trial_key"] == row["trial_key"] and result["verdict"] == "inconclusive"
    assert len(history.read(root)) == 2


def detailed(gap_s: float, users: int = 8, per_user: int = 25, tokens: int = 64) -> dict:
    """A `--save-detailed` result of a closed loop: `users` requests in flight, each of 50 ms
    to its first token and `gap_s` between its next tokens, the next request on its end (the
    per-request lists as vllm/benchmarks/serve.py's benchmark() keeps them, in seconds)."""
    starts, ttfts, itls = [], [], []
    for u in range(users):
        t = 0.001 * u
        for _ in range(per_user):
            starts.append(t)
            ttfts.append(0.05)
            itls.append([gap_s] * (tokens - 1))
            t += 0.05 + gap_s * (tokens - 1)
    n = len(starts)
    end = max(s + 0.05 + gap_s * (tokens - 1) for s in starts)
    return {**VLLM, "num_prompts": n, "completed": n, "max_concurrency": users,
            "duration": end, "total_output_tokens": n * tokens, "total_input_tokens": n * 128,
            "output_throughput": n * tokens / end, "start_times": starts, "ttfts": ttfts,
            "itls": itls, "output_lens": [tokens] * n, "errors": [""] * n,
            "latencies": [0.05 + gap_s * (tokens - 1)] * n}


def test_detailed_vllm_results_have_windows_and_compare_judges_them(tmp_path):
    """Two closed-loop runs of one configuration, the second's tokens 20% slower: their
    windows of output tokens/s make compare call it slower; a rerun of the first is
    unchanged; a Server run (a finite rate) has no windows: its throughput is the rate."""
    root = tmp_path / "results"
    for name, gap in (("base", 0.010), ("slower", 0.012), ("rerun", 0.010)):
        write(tmp_path / f"{name}.json", detailed(gap))
        assert main([str(tmp_path / f"{name}.json"), "--output", str(root), "--name",
                     name]) == 0
    base, slower, rerun = (compare.load_run(str(only_run(root, n)))
                           for n in ("base", "slower", "rerun"))
    windows = base.iloc[0]["serve/window_output_tokens_per_s"]
    assert len(windows) == 8
    # 8 users, a request of 64 tokens each 0.68 s: about 753 tokens/s in the steady part
    assert sum(windows) / 8 == pytest.approx(8 * 64 / (0.05 + 0.63), rel=0.05)
    (worse,) = compare.compare_runs(base, slower)
    assert worse["verdict"] == "slower" and worse["ratio"] == pytest.approx(0.68 / 0.806,
                                                                             rel=0.05)
    assert worse["base"] == base.iloc[0]["serve/output_tokens_per_s"]
    (same,) = compare.compare_runs(base, rerun)
    assert same["verdict"] == "unchanged"
    write(tmp_path / "server.json", {**detailed(0.010), "request_rate": 4.0})
    assert main([str(tmp_path / "server.json"), "--output", str(root), "--name", "srv"]) == 0
    (row,) = read_rows(only_run(root, "srv") / "results.parquet").to_dict("records")
    assert not present(row.get("serve/window_output_tokens_per_s"))


def aiperf_records(gap_ms: float, users: int = 8, per_user: int = 25, tokens: int = 64) -> str:
    """AIPerf's profile_export.jsonl of the same closed loop: a record per request (metadata
    request_start_ns; metrics time_to_first_token, inter_chunk_latency, output_sequence_length,
    as the export docs show them), a warm-up record and a failed one besides."""
    lines = [{"metadata": {"request_start_ns": 0, "benchmark_phase": "warmup"},
              "metrics": {"time_to_first_token": {"value": 1.0, "unit": "ms"},
                          "inter_chunk_latency": {"value": [1.0], "unit": "ms"},
                          "output_sequence_length": {"value": 5000, "unit": "tokens"}},
              "error": None},
             {"metadata": {"request_start_ns": 10**9, "benchmark_phase": "profiling"},
              "metrics": {"error_isl": {"value": 550, "unit": "tokens"}},
              "error": {"code": 499, "type": "RequestCancellationError", "message": "x"}}]
    for u in range(users):
        t = 0.001 * u
        for _ in range(per_user):
            lines.append({"metadata": {"request_start_ns": int(t * 1e9),
                                       "benchmark_phase": "profiling"},
                          "metrics": {"time_to_first_token": {"value": 50.0, "unit": "ms"},
                                      "inter_chunk_latency": {"value": [gap_ms] * (tokens - 1),
                                                              "unit": "ms"},
                                      "output_sequence_length": {"value": tokens,
                                                                 "unit": "tokens"}},
                          "error": None})
            t += 0.05 + gap_ms / 1e3 * (tokens - 1)
    return "\n".join(json.dumps(x) for x in lines) + "\nnot a record\n"


def test_aiperf_s_per_request_records_give_windows_compare_judges(tmp_path):
    root = tmp_path / "results"
    for name, gap in (("base", 10.0), ("slower", 12.0)):
        folder = tmp_path / name
        write(folder / "profile_export_aiperf.json", AIPERF)
        (folder / "profile_export.jsonl").write_text(aiperf_records(gap))
        assert main([str(folder), "--output", str(root), "--name", name]) == 0
    base, slower = (compare.load_run(str(only_run(root, n))) for n in ("base", "slower"))
    windows = base.iloc[0]["serve/window_output_tokens_per_s"]
    assert sum(windows) / 8 == pytest.approx(8 * 64 / (0.05 + 0.63), rel=0.05)
    (worse,) = compare.compare_runs(base, slower)
    assert worse["verdict"] == "slower" and worse["ratio"] == pytest.approx(0.68 / 0.806,
                                                                             rel=0.05)


def test_an_aiperf_export_is_a_row_in_raybench_s_units_on_its_telemetry_s_gpus(tmp_path):
    folder = tmp_path / "artifacts" / "run1"
    write(folder / "profile_export_aiperf.json", AIPERF)
    root = tmp_path / "results"
    assert main([str(folder), "--output", str(root), "--name", "aiperf"]) == 0
    (row,) = read_rows(only_run(root, "aiperf") / "results.parquet").to_dict("records")
    assert row["import.tool"] == "aiperf" and row["import.model"] == "openai/gpt-oss-20b"
    assert row["import.scenario"] == "concurrency" and row["serve/concurrency"] == 100
    assert row["serve/ttft_p50_ms"] == 787.5 and row["serve/e2e_p90_ms"] == 8594.2
    # AIPerf's inter-token latency is a request's TPOT; this one in seconds
    assert row["serve/tpot_p50_ms"] == pytest.approx(51.98)
    assert not present(row["serve/itl_p50_ms"])  # no inter_chunk_latency in the file
    assert row["serve/tokens_per_s_per_user"] == 19.3 and row["serve/requests"] == 200
    assert row["serve/input_tokens_per_s"] == pytest.approx(110_000 / 15.2)
    assert row["serve/failed"] == 0 and row["status"] == "ok"
    assert row["system/accelerator"] == "NVIDIA H100 80GB HBM3"
    assert row["system/accelerators_per_node"] == 2
    assert row["serve/output_tokens_per_s_per_gpu"] == pytest.approx(1274.6 / 2)
    # the run's report: the imported row on the throughput-per-GPU against per-user curve
    page = tmp_path / "report.html"
    assert report_main([str(only_run(root, "aiperf")), "-o", str(page)]) == 0
    assert "per user, by concurrency (label: users; star: on the Pareto front)" in page.read_text()


def test_a_loadgen_log_folder_reads_as_raybench_s_own_loadgen_trials(tmp_path):
    """LoadGen's own run (two 4 ms replicas, 60 queries/s, 0.5 s): the row's loadgen/* are the
    columns a raybench trial that ran LoadGen would carry."""
    pytest.importorskip("mlperf_loadgen")
    from raybench.scenarios import loadgen
    from tests.scenarios.test_loadgen import Inference, sleeper

    logs = tmp_path / "loadgen"
    logs.mkdir()
    run = loadgen.run([sleeper(4), sleeper(4)], Inference(loadgen_seconds=0.5, min_queries=20),
                      "server", 60.0, logs, max_batch=1, samples=32)
    root = tmp_path / "results"
    assert main([str(logs), "--output", str(root), "--format", "loadgen"]) == 0
    (row,) = read_rows(only_run(root) / "results.parquet").to_dict("records")
    assert row["import.tool"] == "loadgen" and row["import.scenario"] == "Server"
    assert row["import.rate_qps"] == 60.0 and row["status"] == "ok"
    for key, value in loadgen.columns(run, str(logs.resolve())).items():
        assert row[key] == value or not (present(value) or present(row[key])), key


@pytest.mark.parametrize("bad", ["missing", "list", "foreign", "empty_dir", "not_json"])
def test_a_file_of_no_tool_is_exit_2_with_its_fix_and_nothing_written(tmp_path, capsys, bad):
    good = write(tmp_path / "good.json", VLLM)
    path = tmp_path / bad
    if bad == "list":
        path.write_text("[1, 2]")
    elif bad == "foreign":
        write(path, {"completed": 3, "throughput": 5})
    elif bad == "empty_dir":
        path.mkdir()
    elif bad == "not_json":
        path.write_bytes(b"\x89PNG\r\n")
    root = tmp_path / "results"
    assert main([str(good), str(path), "--output", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "Fix:" in err and len(err.strip().splitlines()) == 1
    assert not root.exists()  # the good file waited for the bad one: no half a run
    assert main([str(good), "--output", str(root), "--format", "aiperf"]) == 2
    assert "reads as vllm" in capsys.readouterr().err and not root.exists()


def test_the_key_is_what_was_measured_not_which_file():
    config = {"import.tool": "vllm", "import.model": "m", "import.rate_qps": 4.0}
    assert trial_key({**config, "import.source": "/a", "import.sha256": "1"}) == trial_key(
        {**config, "import.source": "/b", "import.sha256": "2"})
    assert trial_key(config) != trial_key({**config, "import.rate_qps": 8.0})

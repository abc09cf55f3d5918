"""The three tools' result files read into raybench's columns: (config, metrics, when) each.

Where each field comes from: vLLM, the result dict of `benchmark()` and `main()` in
vllm/benchmarks/serve.py (`{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms` for the percentiles
the run asked for, 99 by default); AIPerf, docs/tutorials/working-with-profile-exports.md in
ai-dynamo/aiperf (one object per metric: unit, avg, p50, p90, p99, ...); LoadGen, its detail
log's MLLOG keys as scenarios/loadgen.py reads them for raybench's own LoadGen trials. Pure but
for reading the files.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from raybench.scenarios import loadgen
from raybench.scenarios.llm import figures  # the serve/* columns, token windows

AIPERF_FILE = "profile_export_aiperf.json"
AIPERF_RECORDS = "profile_export.jsonl"  # beside it: a record per request
TOOLS = ("loadgen", "vllm", "aiperf")
# vLLM's statistic prefixes and AIPerf's statistic keys -> raybench's suffixes
VLLM_STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}
AIPERF_STATS = {"avg": "mean", "p50": "p50", "p90": "p90", "p99": "p99"}
VLLM_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
AIPERF_NAMES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot",
                "inter_chunk_latency": "itl", "request_latency": "e2e"}
TO_MS = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}


class BadSource(Exception):
    """A path that is none of the three tools' results: the message names it and the fix."""


def detect(path: Path) -> tuple[str, Path]:
    """(tool, the file or folder to read) of one path given on the command line."""
    if path.is_dir():
        if (path / loadgen.DETAIL).is_file():
            return "loadgen", path
        if (path / AIPERF_FILE).is_file():
            return "aiperf", path / AIPERF_FILE
        raise BadSource(f"{path} is a folder without {loadgen.DETAIL} (MLPerf LoadGen) or "
                        f"{AIPERF_FILE} (AIPerf). Fix: pass a LoadGen log folder, an AIPerf "
                        "artefact folder, or a vLLM `bench serve --save-result` JSON file")
    data = read_json(path)
    if path.name == AIPERF_FILE or ("input_config" in data and _stat(data, "request_count")):
        return "aiperf", path
    if {"completed", "duration"} <= set(data) and "request_throughput" in data:
        return "vllm", path
    raise BadSource(f"{path} is JSON but neither a vLLM `bench serve` result (it has no "
                    "completed, duration and request_throughput keys) nor an AIPerf "
                    f"{AIPERF_FILE}. Fix: pass the file `vllm bench serve --save-result` "
                    "or `aiperf profile` wrote, unchanged")


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BadSource(f"{path} does not exist. Fix: pass a LoadGen log folder, an AIPerf "
                        f"{AIPERF_FILE} or a vLLM `bench serve --save-result` JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadSource(f"{path} is not JSON ({e}). Fix: pass the file the tool wrote, "
                        "unchanged, or a LoadGen log folder") from None
    if not isinstance(data, dict):
        raise BadSource(f"{path} holds a JSON {type(data).__name__}, not the object a vLLM or "
                        "AIPerf result is. Fix: pass the file the tool wrote, unchanged")
    return data


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _stat(data: dict[str, Any], tag: str, stat: str = "avg") -> float | None:
    entry = data.get(tag)
    return _num(entry.get(stat)) if isinstance(entry, dict) else None


def from_vllm(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(config, metrics, when) of a `vllm bench serve` result."""
    done, failed = _num(data.get("completed")) or 0.0, _num(data.get("failed"))
    wall = _num(data.get("duration"))
    rate = data.get("request_rate")
    metrics: dict[str, Any] = {
        "serve/requests": done + (failed or 0.0), "serve/failed": failed,
        "serve/wall_s": wall,
        "serve/requests_per_s": _num(data.get("request_throughput")),
        "serve/output_tokens_per_s": _num(data.get("output_throughput")),
        "serve/input_tokens_per_s": _per(data.get("total_input_tokens"), wall),
        "serve/goodput_rps": _num(data.get("request_goodput")),
        "serve/input_tokens": _per(data.get("total_input_tokens"), done),
        "serve/output_tokens": _per(data.get("total_output_tokens"), done),
        "serve/concurrency": _num(data.get("max_concurrency")),
    }
    for name, ours in VLLM_NAMES.items():
        for stat, suffix in VLLM_STATS.items():
            metrics[f"serve/{ours}_{suffix}_ms"] = _num(data.get(f"{stat}_{name}_ms"))
    users = _num(data.get("max_concurrency"))
    # a finite rate: Poisson arrivals (raybench's Server); "inf" (as vLLM writes it): every
    # request at once, up to max_concurrency in flight when one is set (closed-loop users)
    scenario = "server" if _num(rate) is not None else "concurrency" if users else "offline"
    config = {"import.model": data.get("model_id"), "import.scenario": scenario,
              "import.rate_qps": _num(rate), "import.concurrency": users,
              "import.tool_version": data.get("version")}
    config.update(_lengths(metrics))
    if scenario != "server":  # a closed-loop or offline run's throughput is the engine's
        metrics["serve/window_output_tokens_per_s"] = _vllm_windows(data)
    return config, metrics, _vllm_date(data.get("date"))


def _vllm_windows(data: dict[str, Any]) -> list[float] | None:
    """Output tokens/s windows from a `--save-detailed` result's per-request lists: each
    request's chunks arrive at start + TTFT, then after each inter-token gap (seconds, as
    RequestFuncOutput keeps them); its output tokens spread over its chunks (a chunk may carry
    several). None without those lists."""
    starts, ttfts, itls, lens = (data.get(k) for k in ("start_times", "ttfts", "itls",
                                                       "output_lens"))
    if not all(isinstance(x, list) for x in (starts, ttfts, itls, lens)) or not (
            len(starts) == len(ttfts) == len(itls) == len(lens)):
        return None
    errors = data.get("errors") if isinstance(data.get("errors"), list) else [""] * len(starts)
    stamps: list[float] = []
    tokens: list[float] = []
    for start, ttft, gaps, n, error in zip(starts, ttfts, itls, lens, errors, strict=False):
        if error or _num(start) is None or not _num(ttft) or not _num(n) or \
                not isinstance(gaps, list):
            continue  # a failed request (TTFT 0): no tokens
        _chunks(start + ttft, gaps, n, stamps, tokens)
    return figures.token_windows(stamps, tokens) if stamps else None


def _chunks(first_s: float, gaps_s: list[Any], n: float, stamps: list[float],
            tokens: list[float]) -> None:
    """One request's chunks onto `stamps`: its first at `first_s`, the next after each gap
    (seconds); and onto `tokens`, its `n` output tokens spread evenly over them (a streamed
    chunk may carry several)."""
    times = [first_s]
    for gap in gaps_s:
        times.append(times[-1] + (_num(gap) or 0.0))
    stamps += times
    tokens += [n / len(times)] * len(times)


def _per(total: Any, n: float | None) -> float | None:
    t = _num(total)
    return t / n if t is not None and n else None


def _lengths(metrics: dict[str, Any]) -> dict[str, Any]:
    """Input/output tokens per request, rounded, as the configuration they measured."""
    return {f"import.{k}_tokens": None if metrics[f"serve/{k}_tokens"] is None
            else round(metrics[f"serve/{k}_tokens"]) for k in ("input", "output")}


def _vllm_date(text: Any) -> str | None:
    """vLLM's `%Y%m%d-%H%M%S`, the client's local time: kept as it is, without a zone."""
    try:
        return datetime.strptime(str(text), "%Y%m%d-%H%M%S").isoformat()
    except ValueError:
        return None


def from_aiperf(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(config, metrics, when) of an AIPerf `profile_export_aiperf.json`."""
    count, errors = _stat(data, "request_count"), _stat(data, "error_request_count")
    metrics: dict[str, Any] = {
        "serve/requests": None if count is None else count + (errors or 0.0),
        "serve/failed": errors if errors is not None else (0.0 if count else None),
        "serve/wall_s": _stat(data, "benchmark_duration"),
        "serve/requests_per_s": _stat(data, "request_throughput"),
        "serve/output_tokens_per_s": _stat(data, "output_token_throughput"),
        "serve/tokens_per_s_per_user": _stat(data, "output_token_throughput_per_user"),
        "serve/goodput_rps": _stat(data, "goodput"),
        "serve/input_tokens": _stat(data, "input_sequence_length"),
        "serve/output_tokens": _stat(data, "output_sequence_length"),
    }
    wall = metrics["serve/wall_s"]
    total_isl = _stat(data, "total_isl")
    metrics["serve/input_tokens_per_s"] = total_isl / wall if total_isl and wall else None
    for tag, ours in AIPERF_NAMES.items():
        entry = data.get(tag)
        factor = TO_MS.get(entry.get("unit", "ms")) if isinstance(entry, dict) else None
        for stat, suffix in AIPERF_STATS.items():
            v = _stat(data, tag, stat)
            metrics[f"serve/{ours}_{suffix}_ms"] = None if v is None or factor is None \
                else v * factor
    cfg = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    load = cfg.get("loadgen") if isinstance(cfg.get("loadgen"), dict) else {}
    endpoint = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}
    models = endpoint.get("model_names") or [None]
    config = {"import.model": models[0], "import.scenario": "server"
              if _num(load.get("request_rate")) is not None else "concurrency"
              if _num(load.get("concurrency")) is not None else None,
              "import.rate_qps": _num(load.get("request_rate")),
              "import.concurrency": _num(load.get("concurrency")),
              "import.tool_version": data.get("aiperf_version")}
    metrics["serve/concurrency"] = config["import.concurrency"]
    config.update(_lengths(metrics))
    return config, metrics, data.get("start_time")


def aiperf_windows(path: Path) -> list[float] | None:
    """Output tokens/s windows from AIPerf's per-request records (`profile_export.jsonl`, the
    same docs): each profiling request's chunks arrive at request_start_ns + time_to_first_token,
    then after each inter_chunk_latency (ms); its output_sequence_length spread over them. A
    failed request (`error` set, no metrics) and warm-up records bring none; a line that is not
    a record is skipped."""
    stamps: list[float] = []
    tokens: list[float] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        meta, m = (rec.get(k) if isinstance(rec, dict) else None for k in ("metadata", "metrics"))
        if not isinstance(meta, dict) or not isinstance(m, dict) or rec.get("error") or \
                meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        start, ttft = _num(meta.get("request_start_ns")), _value_ms(m, "time_to_first_token")
        n = _num((m.get("output_sequence_length") or {}).get("value"))
        chunks = m.get("inter_chunk_latency") or {}
        gaps, to_s = chunks.get("value") or [], TO_MS.get(chunks.get("unit", "ms"), 0.0) / 1e3
        if start is None or ttft is None or not n or not isinstance(gaps, list) or not to_s:
            continue
        _chunks(start / 1e9 + ttft / 1e3, [(_num(g) or 0.0) * to_s for g in gaps], n, stamps,
                tokens)
    return figures.token_windows(stamps, tokens) if stamps else None


def _value_ms(metrics: dict[str, Any], tag: str) -> float | None:
    entry = metrics.get(tag)
    if not isinstance(entry, dict) or TO_MS.get(entry.get("unit", "ms")) is None:
        return None
    v = _num(entry.get("value"))
    return None if v is None else v * TO_MS[entry.get("unit", "ms")]


def aiperf_gpus(data: dict[str, Any]) -> list[str]:
    """The GPU names of AIPerf's telemetry (`--gpu-telemetry`), one per GPU it sampled."""
    endpoints = (data.get("telemetry_data") or {}).get("endpoints") or {}
    return [g.get("gpu_name") for e in endpoints.values() if isinstance(e, dict)
            for g in (e.get("gpus") or {}).values() if isinstance(g, dict) and g.get("gpu_name")]


def from_loadgen(folder: Path) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(config, metrics, when) of a LoadGen log folder: the columns raybench's own LoadGen
    trials carry, read the same way."""
    try:
        log = loadgen.read_log(folder)
    except (OSError, ValueError) as e:
        raise BadSource(f"{folder}: {e}. Fix: pass the folder LoadGen wrote its logs to "
                        "(log_output.outdir), with its mlperf_log_detail.txt whole") from None
    metrics = loadgen.columns(log, str(folder.resolve()))
    config = {"import.model": log.get("sut_name"),
              "import.scenario": metrics["loadgen/scenario"],
              "import.rate_qps": metrics["loadgen/target_qps"], "import.concurrency": None,
              "import.input_tokens": None, "import.output_tokens": None,
              "import.tool_version": metrics["loadgen/version"]}
    when = datetime.fromtimestamp((folder / loadgen.DETAIL).stat().st_mtime, timezone.utc)
    return config, metrics, when.isoformat(timespec="seconds")


def read_source(tool: str, target: Path
                ) -> tuple[dict[str, Any], dict[str, Any], str | None, list[str], Path]:
    """(config, metrics, when, the GPUs it names, the file its digest is of) of a source
    `detect` found: each tool's own reading, AIPerf's per-request records beside its export
    included."""
    if tool == "loadgen":
        return (*from_loadgen(target), [], target / loadgen.DETAIL)
    data = read_json(target)
    if tool == "vllm":
        return (*from_vllm(data), [], target)
    config, metrics, when = from_aiperf(data)
    records = target.parent / AIPERF_RECORDS
    if config["import.scenario"] != "server" and records.is_file():
        metrics["serve/window_output_tokens_per_s"] = aiperf_windows(records)
    return config, metrics, when, aiperf_gpus(data), target

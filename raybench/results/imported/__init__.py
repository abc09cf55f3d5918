"""`raybench import`: what MLPerf's LoadGen, vLLM's `bench serve` and NVIDIA AIPerf wrote, as
rows beside raybench's own.

Owns reading three tools' result files and writing them as one run, as a sweep writes its own:
`<root>/<name>/<run_id>/results.parquet` (and CSV), a trial file per source, and the history
under `<root>`, so that `history`, `report --history` and `compare` read them as they read a
sweep's. The sources:

- a LoadGen log folder (`mlperf_log_detail.txt`, as raybench's own LoadGen trials keep):
  read by scenarios/loadgen.py, the same `loadgen/*` columns as those trials;
- a `vllm bench serve --save-result` JSON: the keys of the result dict of `benchmark()` and
  of `main()` in vllm/benchmarks/serve.py (duration, completed, failed, total_input_tokens,
  total_output_tokens, request_throughput, request_goodput, output_throughput,
  max_concurrency, request_rate, model_id, date, and `{mean,median,std,pNN}_{ttft,tpot,itl,
  e2el}_ms` for the percentiles the run asked for, 99 by default);
- an AIPerf `profile_export_aiperf.json` (or the artefact folder holding it): one object per
  metric with its unit and statistics (avg, p50, p90, p99, ...), benchmark_duration,
  request_count, start_time/end_time and input_config (docs/tutorials/
  working-with-profile-exports.md in ai-dynamo/aiperf).

A vLLM or AIPerf figure lands in raybench's own `serve/*` column where it means the same
(AIPerf's inter_token_latency is a request's (latency - TTFT) / (tokens - 1): raybench's
TPOT; vLLM's ITL is every gap: raybench's ITL); a figure the file does not give stays empty,
never derived from another that means something else (vLLM writes no per-user speed). Each row
names its tool, file and the file's SHA-256 (`import.*`), and its key hashes the tool and what
was measured (model, scenario, rate, concurrency, lengths), so two imports of one
configuration pair in `compare`. The hardware is what `--accelerator`/`--gpus` say, or AIPerf's
GPU telemetry where it has some: none of these files names the machine otherwise.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from raybench import console
from raybench.records import now
from raybench.results import fingerprint
from raybench.results.history import History
from raybench.results.imported.tools import TOOLS, BadSource, detect, read_source
from raybench.results.rows import complete
from raybench.results.rundir import new_run_dir
from raybench.results.table import ResultsTable
from raybench.version import code_version


def read(path: Path, tool: str = "auto") -> dict[str, Any]:
    """One source as {config, metrics, when, gpus}."""
    found, target = detect(path)
    if tool != "auto" and tool != found:
        raise BadSource(f"{path} reads as {found}, not the {tool} that --format asked for. "
                        f"Fix: drop --format, or pass {tool}'s own result")
    config, metrics, when, gpus, digest_of = read_source(found, target)
    config = {"import.tool": found, "import.source": str(target.resolve()),
              "import.sha256": hashlib.sha256(digest_of.read_bytes()).hexdigest(), **config}
    return {"config": config, "metrics": metrics, "when": when, "gpus": gpus}


def trial_key(config: dict[str, Any]) -> str:
    """What was measured, not which file said so: two imports of one configuration pair."""
    what = {k: v for k, v in config.items() if k not in ("import.source", "import.sha256")}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def system_columns(gpus: list[str]) -> dict[str, Any]:
    """`system/*` of the GPUs the user or the file named; none where nothing names them."""
    return fingerprint.of({"gpus": [{"name": g} for g in gpus]}) if gpus else {}


def import_runs(paths: list[Path], root: Path, name: str, system: str, tool: str = "auto",
                gpus: list[str] | None = None) -> ResultsTable:
    """Every source read first (one bad path writes nothing), then one run of their rows:
    its table."""
    sources = [read(p, tool) for p in paths]
    out = new_run_dir(root / name)
    table, history = ResultsTable(out), History(root, code_version())
    for i, src in enumerate(sources):
        key = trial_key(src["config"])
        m = src["metrics"]
        ok = bool((m.get("serve/requests") or 0) - (m.get("serve/failed") or 0) > 0
                  or m.get("loadgen/queries"))
        stamp = src["when"] or now()
        row = {"sweep": name, "run_id": out.name, "stage": "benchmark", "trial_index": i,
               "trial_key": key, "system": system, "start_time": stamp, "end_time": stamp,
               "status": "ok" if ok else "error",
               "error": None if ok else "the file records no completed request",
               **src["config"], **src["metrics"]}
        on = gpus or src["gpus"]
        rate = m.get("serve/output_tokens_per_s")
        if rate is not None:  # a serving row: per GPU where the GPUs are known
            row["serve/output_tokens_per_s_per_gpu"] = rate / len(on) if on else None
        complete(row, system_columns(on), {}, src["config"]["import.source"])
        table.write_detail(i, key, {"import": src["config"], "row": row})
        table.append(row)
        history.append(row)
    history.compact()
    return table


def main(argv: list[str] | None = None, prog: str = "python -m raybench.results.imported") -> int:
    p = console.parser(prog, "Results of MLPerf LoadGen, vLLM `bench serve` or AIPerf as rows "
                       "of a run beside raybench's own.")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                   help="a LoadGen log folder, vLLM result, AIPerf export")
    p.add_argument("--output", default="results", metavar="ROOT",
                   help="results root: the run in ROOT/NAME/ (default %(default)s)")
    p.add_argument("--name", default="imported", help="the run's sweep name (%(default)s)")
    p.add_argument("--system", default="imported", metavar="LABEL",
                   help="the rows' system label (default %(default)s)")
    p.add_argument("--format", choices=["auto", *TOOLS], default="auto", metavar="TOOL",
                   help="refuse another tool's file (auto, loadgen, vllm, aiperf)")
    p.add_argument("--accelerator", metavar="NAME",
                   help="GPU model the results ran on: the system fingerprint")
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="GPUs they ran on, with --accelerator (default %(default)s)")
    args = p.parse_args(argv)
    if args.gpus < 1:
        p.error("--gpus must be 1 or more")
    try:
        table = import_runs(args.paths, Path(args.output), args.name, args.system,
                            args.format, [args.accelerator] * args.gpus if args.accelerator
                            else None)
    except BadSource as e:
        print(f"raybench: {e}", file=sys.stderr)
        return 2
    for r in table.rows:
        print(f"{r['import.tool']}: {r['import.source']} -> trial {r['trial_key']} ({r['status']})")
    print(f"{len(table.rows)} rows -> {table.dir}")
    return 0

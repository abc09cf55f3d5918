"""`python -m raybench.validate`: is every GPU of this machine or cluster healthy and as fast as
it should be? The acceptance run before any benchmark.

Owns the suite's runs and the verdict's outputs. The suite (validate/suites/<version>/, one
sweep file per probe) runs through the same sweep loop as any sweep, one trial per GPU of the
cluster side by side (per node on a CPU cluster), and all-reduces within each node and across
nodes; its rows land in the history like any run's, so `compare` holds two validations of one
machine against each other. The verdict (verdict.py) reads the rows and each node's facts
(NVML health, versions, RDMA devices). Output under --output: a run directory per probe,
`validation.html` (a line per GPU, worst first; the nodes), `validation.json`, and a last
stdout line `{"raybench_validate": {...}}`. Exit 0: every GPU and node passes or warns; 1:
something fails; 2: bad input (an unreachable address, --expect-gpus on a cluster without GPUs,
a margins file with an unknown key).
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from raybench import cli, console
from raybench.report.page import STYLE
from raybench.runners.on_ray import cluster
from raybench.sweep import command as sweep
from raybench.validate.verdict import LEVELS, Margins, MarginsError, Verdict, judge, load_margins

SUITE = "v1"
RESULTS = "results"  # the suite's sweeps set no output.root: the default one
SUITES = Path(__file__).parent / "suites" / SUITE
LAUNCH = "execution."  # the keys `--set` may change in every probe
EXIT_FAILED = 1


def main(argv: list[str] | None = None, prog: str = "python -m raybench.validate") -> int:
    args = _parser(prog).parse_args(argv)
    cli.setup_logging()
    try:
        margins = load_margins(args.margins)
    except MarginsError as e:
        print(f"raybench: {e}", file=sys.stderr)
        return cli.EXIT_INVALID
    foreign = [x for x in args.set if not x.startswith(LAUNCH)]
    if foreign:
        print(f"raybench: --set {foreign[0]}: validate's probes are its suite's ({SUITE}), so "
              "that two validations of a machine measure the same; only how they launch may "
              f"change. Fix: set {LAUNCH}* keys only (execution.start_timeout_s, "
              "execution.max_retries, execution.trial_timeout_s), or run the probe's sweep "
              f"file itself ({SUITES}) with python -m raybench.sweep", file=sys.stderr)
        return cli.EXIT_INVALID

    with console.held():  # stdout for the verdict's JSON line alone (console.py)
        try:
            started = cluster.connect(args.address)
        except cluster.Unreachable as e:
            print(f"raybench: {e}", file=sys.stderr)
            return cli.EXIT_INVALID
        try:
            return _validate(args, margins)
        except Interrupted as e:  # one line and the sweep's exit code, as the sweep ends
            print(f"raybench: {e}", file=sys.stderr)
            return e.code
        finally:
            if started:
                cluster.shutdown()


def _validate(args: argparse.Namespace, margins: Margins) -> int:
    t0 = time.monotonic()
    nodes = cluster.nodes()
    gpus = int(sum(n.get("GPU", 0) for n in nodes))
    if args.expect_gpus and not gpus:
        print(f"raybench: --expect-gpus {args.expect_gpus}: the cluster at "
              f"{cluster.target(args.address) or 'this machine'} has no GPUs. Fix: validate "
              "a cluster whose nodes Ray sees GPUs on, or leave --expect-gpus out to validate "
              "its CPUs", file=sys.stderr)
        return cli.EXIT_INVALID
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.output or Path(RESULTS) / "validate" / stamp)
    runs = {}
    for path, sets in suite(gpus, nodes):
        # --output DIR: the runs in DIR, their history DIR's; else each where a sweep of its
        # own would be, in the results root whose history later sweeps read (results/peaks.py)
        run = out / path.stem if args.output else Path(RESULTS) / f"validate_{path.stem}" / stamp
        runs[path.stem] = _run(path, [*sets, *args.set], run, args.address)
    rows = _rows(runs)
    facts = _facts(runs)
    gpu_v, node_v = judge(facts, rows, margins, args.expect_gpus)
    summary = _summary(gpu_v, node_v, out, time.monotonic() - t0, margins)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.json").write_text(json.dumps(
        {**summary, "devices": [asdict(v) for v in gpu_v], "nodes": [asdict(v) for v in node_v]},
        indent=1, default=str))
    (out / "validation.html").write_text(page(gpu_v, node_v, summary))
    console.emit({"raybench_validate": summary})
    return EXIT_FAILED if summary["verdict"] == "fail" else cli.EXIT_OK


def suite(gpus: int, nodes: list[dict[str, float]]) -> list[tuple[Path, list[str]]]:
    """The suite's sweep files with what this cluster sets in them: a trial per GPU (per node
    without GPUs), side by side; all-reduces over a node's GPUs and over the cluster's."""
    if not gpus:
        # each probe trial pinned to its node: per_node concurrency alone keeps two trials
        # off one node only while both run, and a trial that started late (a loaded 2-core
        # CI machine) went to the node the first had just left, leaving the other unprobed
        per_node = [f"grid.node={node_ips(nodes)}"]
        return [(SUITES / "cpu" / "matmul.yaml", per_node),
                (SUITES / "cpu" / "membw.yaml", per_node),
                (SUITES / "cpu" / "allreduce.yaml", [])]
    per_gpu = [f"grid.seed={list(range(gpus))}"]
    widths = sorted({int(n.get("GPU", 0)) for n in nodes if n.get("GPU")} | {gpus})
    widths = [w for w in widths if w > 1]
    out = [(SUITES / "gpu" / f"{p}.yaml", per_gpu) for p in ("matmul", "membw", "transfer")]
    if widths:
        out.append((SUITES / "gpu" / "allreduce.yaml", [f"grid.num_gpus={widths}"]))
    return out


def node_ips(nodes: list[dict[str, float]]) -> list[str]:
    """Each node's IP address, from Ray's own `node:<ip>` resource of it."""
    return sorted(k.split(":", 1)[1] for n in nodes for k in n
                  if k.startswith("node:") and not k.startswith("node:__"))


def _run(path: Path, sets: list[str], out: Path, address: str | None) -> Path:
    """One probe's sweep, through the sweep loop on the Ray this process joined."""
    argv = [str(path), "--output", str(out), *[a for s in sets for a in ("--set", s)]]
    if address:
        argv += ["--address", address]
    code = sweep.main(argv)
    if code >= 128:  # SIGINT or SIGTERM: the probe's sweep stopped between rows, as asked
        raise Interrupted(code, path.name)
    if code not in (cli.EXIT_OK, cli.EXIT_TRIALS_FAILED):  # a failed trial is a row
        raise RuntimeError(f"the suite's sweep {path.name} ended with exit code {code}")
    return out


class Interrupted(Exception):
    """A signal stopped the suite in one of its probes' sweeps (exit 128 + the signal)."""

    def __init__(self, code: int, probe: str):
        super().__init__(f"validate interrupted by signal {code - 128} in {probe}: no verdict; "
                         "the probes' rows so far are written. Run it again for a verdict")
        self.code = code


def _rows(runs: dict[str, Path]) -> pd.DataFrame:
    frames = [pd.read_parquet(p / "results.parquet") for p in runs.values()
              if (p / "results.parquet").exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _facts(runs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each node's facts, as the first probe's run read them (system_info.json)."""
    for p in runs.values():
        info = p / "system_info.json"
        if info.exists():
            return json.loads(info.read_text()).get("nodes") or {}
    return {}


def _summary(gpus: list[Verdict], nodes: list[Verdict], out: Path, elapsed: float,
             margins: Margins) -> dict[str, Any]:
    worst = LEVELS[max((v.rank for v in gpus + nodes), default=0)]
    count = lambda vs, lv: sum(v.level == lv for v in vs)  # noqa: E731
    return {"suite": SUITE, "verdict": worst, "output": str(out),
            "devices": {lv: count(gpus, lv) for lv in LEVELS},
            "nodes": {lv: count(nodes, lv) for lv in LEVELS},
            "elapsed_s": round(elapsed, 1), "margins": margins.model_dump(),
            "page": str(out / "validation.html")}


def page(gpus: list[Verdict], nodes: list[Verdict], summary: dict[str, Any]) -> str:
    """The validation page in the report's style: the verdict, then a line per GPU and per
    node, worst first, with its figures and reasons. Pure; every text escaped."""
    e = html.escape
    badge = {"pass": "valid", "warn": "quick", "fail": "invalid"}

    def table(title: str, verdicts: list[Verdict]) -> str:
        keys = sorted({k for v in verdicts for k in v.figures})
        head = "".join(f"<th>{e(k)}</th>" for k in ("", "verdict", *keys, "reasons"))
        body = "".join(
            f"<tr><td>{e(v.subject)}</td><td><span class='badge {badge[v.level]}'>"
            f"{e(v.level)}</span></td>"
            + "".join(f"<td>{e(_fmt(v.figures.get(k)))}</td>" for k in keys)
            + f"<td style='text-align:left'>{'<br>'.join(e(r) for r in v.reasons)}</td></tr>"
            for v in verdicts)
        return (f"<h2>{e(title)}</h2><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")

    counts = ", ".join(f"{n} {lv}" for lv, n in summary["devices"].items() if n)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>raybench validate</title>"
            f"<style>{STYLE}</style></head><body>"
            f"<h1>raybench validate: <span class='badge {badge[summary['verdict']]}'>"
            f"{e(summary['verdict'])}</span></h1>"
            f"<div class='meta'>suite {e(summary['suite'])}; devices: {e(counts or 'none')}; "
            f"{summary['elapsed_s']} s; margins {e(json.dumps(summary['margins']))}</div>"
            + table("Devices: each GPU (a node's CPU where it has none), worst first", gpus)
            + table("Nodes", nodes) + "</body></html>")


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _parser(prog: str) -> argparse.ArgumentParser:
    p = console.parser(prog, "Is every GPU of this machine or cluster healthy and as fast as it "
                       "should be?")
    p.add_argument("--address", help="Ray cluster (default: RAY_ADDRESS, else embedded)")
    p.add_argument("--output", metavar="DIR",
                   help="runs and verdict (default results/validate/<UTC time>)")
    p.add_argument("--expect-gpus", type=int, metavar="N",
                   help="GPUs every node must have; another count fails")
    p.add_argument("--margins", metavar="FILE",
                   help="YAML file of the verdict's margins (verdict.Margins)")
    p.add_argument("--set", action="append", default=[], metavar="execution.KEY=VALUE",
                   help="how every probe launches (e.g. start_timeout_s=120)")
    return p

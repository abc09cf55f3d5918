"""`python -m raybench.bench`: trials in-process without Ray; the harness tax; the chip stage.

`run SWEEP.yaml` executes a sweep's trials with the same workload code, timed loop, metrics and
results table as the Ray path, in this process (ranks > 1 are spawned locally with
torch.distributed): for machines without Ray, such as a lent GPU box. `overhead` compares a bare
PyTorch loop with a full raybench trial (harness.py holds both sides); `chips` compares Ray Data
chipping with the reference's serial whole-band chipping (data/chipbench.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from raybench import cli, metrics
from raybench.context import WorkerContext
from raybench.failures import failure
from raybench.grid import TrialSpec, artifact_dir, trace_path
from raybench.results import (
    History,
    ResultsTable,
    RowWriter,
    history_root,
    now,
    write_report,
    write_run_files,
)
from raybench.search import search_all
from raybench.worker import run_worker

log = logging.getLogger("raybench.bench")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raybench.bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a sweep's trials in-process, without Ray")
    run.add_argument("sweep")
    run.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    run.add_argument("--trials", help="comma-separated trial indices (default: all)")
    run.add_argument("--output", help="run directory (default as for raybench.sweep)")
    run.add_argument("--resume", action="store_true",
                     help="finish an interrupted run; trials that have a row are not rerun")
    over = sub.add_parser("overhead", help="bare PyTorch loop vs a raybench trial")
    over.add_argument("sweep", nargs="?", default="sweeps/overhead_cpu.yaml")
    over.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    over.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side")
    fwd = sub.add_parser("forward-check",
                         help="vit_tiles forward time vs torch.utils.benchmark.Timer")
    fwd.add_argument("sweep")
    fwd.add_argument("--set", action="append", default=[], metavar="dotted.key=value")
    fwd.add_argument("--trials", help="comma-separated trial indices (default: all inference)")
    chips = sub.add_parser("chips", help="Ray Data chipping vs the reference's serial chipping")
    chips.add_argument("--data", default="results/chipbench_data",
                       help="scene root (generated there if it has no labels yet)")
    chips.add_argument("--scenes", type=int, default=3)
    chips.add_argument("--size", default="8000x8000", help="ROWSxCOLS of generated scenes")
    chips.add_argument("--chip-size", type=int, default=800)
    chips.add_argument("--cpus", type=int, help="Ray CPUs (default: all cores)")
    chips.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    cli.setup_logging()
    if args.cmd == "chips":
        from raybench.data.chipbench import compare

        result = compare(Path(args.data), args.scenes, args.size, args.chip_size, args.cpus,
                         args.seed)
        print(json.dumps({"raybench_chips_bench": result}))
        return 0
    loaded = cli.load(args.sweep, args.set)
    if loaded is None:
        return cli.EXIT_INVALID
    spec, trials = loaded
    if args.cmd == "forward-check":
        from raybench.harness import forward_check

        wanted = {int(i) for i in args.trials.split(",")} if args.trials else None
        for t in trials:
            chosen = t.index in wanted if wanted else t.workload.mode == "inference"
            if chosen:
                print(json.dumps({"raybench_forward_check": forward_check(t)}), flush=True)
        return 0
    if args.cmd == "overhead":
        from raybench.harness import overhead

        print(json.dumps({"raybench_overhead": overhead(spec, trials[0], args.rounds)}))
        return 0
    if args.trials:
        wanted = {int(i) for i in args.trials.split(",")}
        trials = [t for t in trials if t.index in wanted]
    out = cli.output_dir(spec, args.output, args.resume)
    if out is None:
        return cli.EXIT_INVALID
    t0 = time.monotonic()
    history = History(history_root(spec, args.output))
    writer = RowWriter(spec, out.name, ResultsTable(out), history)
    if not writer.resumed:  # a resumed run keeps the system facts its first rows came from
        write_run_files(out, spec, {"mode": "in-process, no Ray"})
    if not spec.search:  # a resumed search replays its probes' rows (run_and_write)
        trials = [t for t in trials if t.key not in writer.done]

    def run_and_write(trial: TrialSpec) -> dict[str, Any]:
        if trial.key in writer.outcomes:  # a resumed search's probe that already has a row
            return writer.outcomes[trial.key]
        start = now()
        outcome = run_local(trial, str(out / "trials"))
        outcome.update(start_time=start, end_time=now())
        writer.write(trial, outcome)
        return outcome

    if spec.search and spec.search.largest_batch:
        search_all(spec.search.largest_batch, trials, run_and_write, writer)
    else:
        for trial in trials:
            run_and_write(trial)
    summary = writer.summary(out, time.monotonic() - t0)
    return cli.finish({**summary, "report": write_report(out)})


def run_local(trial: TrialSpec, trace_dir: str | None = None) -> dict[str, Any]:
    """One trial in this process (or spawned ranks); returns the same fields as trial.run_trial."""
    if trial.inference is not None:
        from raybench.scenarios.run import run_trial as run_scenario

        return run_scenario(trial, "local")
    hw = trial.hardware
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if hw.num_gpus > gpus:
        why = f"needs {hw.num_gpus} GPUs but this machine has {gpus}"
        return {"status": "infeasible", "error": why, "metrics": {}}
    try:
        if hw.world_size == 1:
            device = torch.device("cuda", 0) if hw.use_gpu else torch.device("cpu")
            ctx = WorkerContext(0, 0, 1, 0, device, hw, trace_path=trace_path(trace_dir, trial),
                                artifact_dir=artifact_dir(trace_dir, trial))
            return metrics.outcome(run_worker(trial, ctx))
        return metrics.outcome(_spawn(trial, trace_dir))
    except Exception as e:  # a failed trial is a row here too
        return failure(e, trial.resources())


def _spawn(trial: TrialSpec, trace_dir: str | None) -> list[dict[str, Any]]:
    """Ranks as local processes over torch.distributed (gloo on CPU, nccl on GPU)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "records.json"
        mp.spawn(_rank_main, args=(trial.to_dict(), port, str(result), trace_dir),
                 nprocs=trial.hardware.world_size, join=True)
        return json.loads(result.read_text())


def _rank_main(rank: int, trial_dict: dict[str, Any], port: int, result: str,
               trace_dir: str | None) -> None:
    trial = TrialSpec.from_dict(trial_dict)
    hw = trial.hardware
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("nccl" if hw.use_gpu else "gloo", rank=rank,
                                         world_size=hw.world_size)
    try:
        device = torch.device("cuda", rank) if hw.use_gpu else torch.device("cpu")
        ctx = WorkerContext(rank, rank, hw.world_size, 0, device, hw,
                            trace_path=trace_path(trace_dir, trial),
                            artifact_dir=artifact_dir(trace_dir, trial))
        records = run_worker(trial, ctx)
        if rank == 0:
            Path(result).write_text(json.dumps(records))
        # Rank 0 hosts the group's store: a rank that tears its group down after rank 0 has
        # exited aborted ("terminate called without an active exception", seen under load).
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

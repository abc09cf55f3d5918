"""Entry-point plumbing shared by `raybench.sweep.command` and `raybench.bench.command`.

Owns logging set-up (once, by the entry point), turning input errors into one paragraph on
stderr with exit code 2, the closing `{"raybench": summary}` line with exit 0 or 3 (or
128 + the signal's number when the sweep was interrupted: 130 for Ctrl-C, 143 for SIGTERM),
and the exit itself.
"""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

from raybench import console, store
from raybench.data.stage import check_inputs
from raybench.grid import expand, stage_variants
from raybench.results import tracking
from raybench.results.rundir import run_directory
from raybench.spec import SpecError, SweepSpec, load_sweep
from raybench.trials import TrialSpec

EXIT_OK, EXIT_INVALID, EXIT_TRIALS_FAILED = 0, 2, 3


def exit(code: int) -> NoReturn:
    """The entry points' `sys.exit`, their objects frozen first (gc.freeze).

    At exit Python's last garbage collections walk every object torch, Ray, pandas and plotly
    made, for nothing: the process ends and its memory with it. That was 1.4 s of a core after
    every sweep here (0.3 s frozen). Files are closed and atexit handlers run as before. Not
    where triton is loaded (with torch._dynamo: a workload run in this process, bench's bare
    loop): its nanobind bindings count the objects left at exit and print each as a leak."""
    if "triton" not in sys.modules:
        gc.freeze()
    sys.exit(code)


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")


def load(path: str, overrides: list[str]) -> tuple[SweepSpec, list[TrialSpec]] | None:
    """The validated spec and its trials, or None after printing why (exit 2 follows)."""
    try:
        spec = load_sweep(path, overrides)
        variants = stage_variants(spec)  # validated here too, before anything starts
        trials = expand(spec)
        _check_stage_inputs(spec, variants)
        if spec.output.storage:
            _check_storage(spec)
        if spec.output.mlflow:
            tracking.check(spec)  # an unreachable tracking URI is input to fix, before any run
        return spec, trials
    except SpecError as e:
        print(f"raybench: invalid sweep: {e}", file=sys.stderr)
        return None


def _check_stage_inputs(spec: SweepSpec, variants: list) -> None:
    """A corrupt GeoTIFF or a bad label CSV is input to fix, not a failed stage row."""
    seen = set()
    for v in variants:
        if (v.scenes, v.labels, tuple(v.channels)) in seen:
            continue
        seen.add((v.scenes, v.labels, tuple(v.channels)))
        problem = check_inputs(v)
        if problem:
            key, what = problem
            value = getattr(v, key.split(".")[1])
            fix = (f"repair or replace that file (or regenerate the scenes), or point {key} at "
                   "another split")
            if what.startswith("cannot write to"):
                fix = STORAGE_FIX
            raise SpecError(spec.source, key, value, what, fix)


STORAGE_FIX = ("check the URI's bucket and path, the credentials in the environment "
               "(AWS_ACCESS_KEY_ID, GOOGLE_APPLICATION_CREDENTIALS ...) and, for an "
               "S3-compatible server, AWS_ENDPOINT_URL; or use a path every node mounts")


def _check_storage(spec: SweepSpec) -> None:
    """Shared storage that cannot take a write would lose the run's copy at its very end."""
    problem = store.check_writable(spec.output.storage)
    if problem:
        raise SpecError(spec.source, "output.storage", spec.output.storage,
                        f"cannot write to {spec.output.storage}: {problem}", STORAGE_FIX)


def output_dir(spec: SweepSpec, override: str | None, resume: bool = False) -> Path | None:
    try:
        return run_directory(spec, override, resume)
    except SpecError as e:
        print(f"raybench: {e}", file=sys.stderr)
        return None


def finish(summary: dict[str, Any]) -> int:
    """Print the machine-readable last line; 0 when every trial is ok, else 3."""
    console.emit({"raybench": summary})
    if summary.get("interrupted"):
        return 128 + summary["interrupted"]
    return EXIT_OK if summary["failed"] == 0 else EXIT_TRIALS_FAILED

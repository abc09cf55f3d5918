"""The results table: one row per trial, failures included, appended after every trial.

Owns the row layout (identity columns, then every config value, then metrics with units in their
names, then status and error), atomic writes of `results.parquet` (its schema metadata carries
the metric columns' units: columns.py) + `results.csv` and the per-trial JSON with raw step
times; a row's metric columns must be declared where they are produced. Never parses strings
back into objects: Parquet and JSON only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from raybench import columns, console, interrupts, peaks, store, workloads
from raybench.records import Status, TrialOutcome, now, present, uniform_cells
from raybench.report.assess import validity
from raybench.spec import SweepSpec
from raybench.trials import SECTIONS, TrialSpec

log = logging.getLogger(__name__)
ID_COLUMNS = ["sweep", "run_id", "stage", "trial_index", "trial_key", "system", "start_time",
              "end_time", "status", "error"]


def make_row(*, sweep: str, run_id: str, system: str, trial: TrialSpec, status: Status,
             error: str | None, start: str, end: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "sweep": sweep, "run_id": run_id, "stage": "benchmark", "trial_index": trial.index,
        "trial_key": trial.key,
        "system": system, "start_time": start, "end_time": end, "status": status,
        "error": error, **trial.config(), **metrics,
    }


class ResultsTable:
    """`<dir>/results.parquet` and `results.csv`, rewritten atomically on every append. On
    opening a run that has rows (a resume), the CSV is written again from the Parquet table,
    which is written first: a driver killed between the two left the CSV a row short."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.parquet = self.dir / "results.parquet"
        self.csv = self.dir / "results.csv"
        self.rows: list[dict[str, Any]] = []
        if self.parquet.exists():
            frame = store.read_rows(self.parquet)
            self.rows = frame.to_dict("records")
            _atomic(self.csv, lambda p: frame.to_csv(p, index=False))

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        write_table(self.dir, to_frame(self.rows))

    def write_trial(self, trial: TrialSpec, detail: dict[str, Any]) -> Path:
        path = self.dir / "trials" / f"{trial.index:04d}_{trial.key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(_jsonable(detail), indent=1, sort_keys=False)
        _atomic(path, lambda p: Path(p).write_text(text))
        return path


class RowWriter:
    """Turns trial outcomes into rows and trial files; remembers what is written."""

    def __init__(self, spec: SweepSpec, run_id: str, table: ResultsTable,
                 history: Any = None, jsonl: bool = False,
                 sinks: list[Callable[[dict[str, Any], Path], None]] | None = None):
        self.spec, self.run_id, self.table, self.history = spec, run_id, table, history
        # system/* columns added to every row (fingerprint.py), once the run's facts are known
        self.system: dict[str, Any] = {}
        self.measured_peaks: dict[str, float] = {}  # peaks.latest: this system's validation
        self.jsonl = jsonl  # print each trial's row as a JSON line on stdout as it is written
        # each is given a trial's row and trial file once both are on disk (tracking.Tracker)
        self.sinks = list(sinks or [])
        self.done: dict[str, str] = {}
        self.outcomes: dict[str, TrialOutcome] = {}
        self.stages: list[dict[str, Any]] = []
        self.searches: list[dict[str, Any]] = []
        # A resumed run starts from the rows on disk: those trials and stages are not rerun.
        self.resumed = 0
        self._stage_rows: set[str] = set()
        for row in table.rows:
            if row.get("stage") == "benchmark":
                self.done[row["trial_key"]] = row["status"]
                self.outcomes[row["trial_key"]] = TrialOutcome(
                    status=row["status"],
                    metrics={k: v for k, v in row.items() if "/" in k and present(v)})
                self.resumed += 1
            elif row.get("stage") in ("preprocess", "search") and row.get("status") == "ok":
                self._stage_rows.add(row["trial_key"])
        if table.rows and history is not None:
            self._reconcile_history()

    def _reconcile_history(self) -> None:
        """Append to the history the rows of this run that the table has and it lacks: a
        driver killed between the two writes, or a history write that failed (a full disk).
        A row is known by its stage, key and end time, stamped once when it was made."""
        from raybench import history as store_of_history

        def ident(r: dict[str, Any]) -> tuple[str, str, str]:
            return (str(r.get("stage")), str(r.get("trial_key")), str(r.get("end_time")))

        try:
            had = store_of_history.read(self.history.root, ds.field("run_id") == self.run_id,
                                        ["stage", "trial_key", "end_time"])
            known = {ident(r) for r in had.to_dict("records")}
            missing = [r for r in self.table.rows if ident(r) not in known]
            for r in missing:
                self.history.append(dict(r))
        except Exception as e:  # the history is a sink: the run goes on without it
            log.warning("could not bring the history under %s up to this run's table: %s",
                        self.history.root, e)
            return
        if missing:
            log.info("history: added %d row(s) of %s that it lacked", len(missing), self.run_id)

    def write(self, trial: TrialSpec, outcome: TrialOutcome, say: bool = True) -> None:
        """`say`: log the trial's line (`finished`); False where a progress line says it."""
        with interrupts.row_section():  # a Ctrl-C waits until row, trial file and history agree
            row, trial_file = self._write(trial, outcome)
        if say:
            log.info("%s", finished(trial, outcome))
        for sink in self.sinks:
            sink(row, trial_file)

    def _write(self, trial: TrialSpec, outcome: TrialOutcome) -> tuple[dict[str, Any], Path]:
        from raybench.metrics import with_interval
        from raybench.metrics.overhead import fixed_cost

        stamp = now()
        metrics = outcome.metrics
        # from the runner's stamps and the ranks': computed here, for every runner (inference
        # trials' records are their replicas' calls, not ranks)
        if outcome.ok and trial.inference is None:
            metrics = {**metrics, **fixed_cost(outcome.records, outcome.stamps)}
        row = make_row(
            sweep=self.spec.name, run_id=self.run_id, system=self.spec.system.label, trial=trial,
            status=outcome.status, error=outcome.error, metrics=with_interval(metrics),
            start=outcome.start_time or stamp, end=outcome.end_time or stamp,
        )
        trial_file = self.table.write_trial(trial, {
            "trial": trial.to_dict(), "row": row, "ranks": outcome.ranks,
            "records": outcome.records,
        })
        self._append(row)
        if self.jsonl:
            console.emit({"raybench_trial": trial_line(row)})
        self.done[trial.key] = outcome.status
        # what a search needs to judge a probe; raw records stay in the trial JSON only
        self.outcomes[trial.key] = TrialOutcome(status=outcome.status, metrics=outcome.metrics)
        return row, trial_file

    def write_stage(self, key: str, outcome: TrialOutcome, start: str) -> None:
        """A preprocess stage run as a row: `stage=preprocess`, its config and figures (once per
        run: a resumed run that finds the stage's row does not add another)."""
        row = {
            "sweep": self.spec.name, "run_id": self.run_id, "stage": "preprocess",
            "trial_index": None, "trial_key": key, "system": self.spec.system.label,
            "start_time": start, "end_time": now(), "status": outcome.status,
            "error": outcome.error, **(outcome.config or {}), **outcome.metrics,
        }
        if key not in self._stage_rows or not outcome.ok:
            self._append(row)
        self.stages.append({"key": key, "status": outcome.status, "output": outcome.output,
                            "chips_per_s": outcome.metrics.get("preprocess/chips_per_s"),
                            "cached": outcome.metrics.get("preprocess/cached")})

    def write_search(self, group: TrialSpec, result: dict[str, Any], start: str) -> None:
        """The answer of a largest-batch search as a `stage=search` row (probes are trials)."""
        config = {k: v for k, v in group.config().items() if k != "workload.batch_size"}
        found = result["largest_batch"] > 0
        row = {
            "sweep": self.spec.name, "run_id": self.run_id, "stage": "search",
            "trial_index": None, "trial_key": group.key, "system": self.spec.system.label,
            "start_time": start, "end_time": now(), "status": "ok" if found else "error",
            "error": None if found else "not even batch size 1 fits", **config,
            "search/largest_batch": result["largest_batch"],
            # what a step then trains: accumulation multiplies the batch that fits
            "search/largest_samples_per_step": result["largest_batch"]
            * group.hardware.grad_accum_steps,
            "search/first_failing_batch": result["first_failing_batch"],
            "search/probes": len(result["probes"]),
            "search/memory_budget_mb": result["memory_budget_mb"],
        }
        if group.key not in self._stage_rows:  # a resumed run keeps its finished searches' rows
            self._append(row)
        self.searches.append({"config": group.overrides, **result,
                              "probes": {str(k): v for k, v in result["probes"].items()}})
        log.info("largest batch for %s: %d (probes %s)", group.overrides or group.key,
                 result["largest_batch"], result["probes"])

    def _append(self, row: dict[str, Any]) -> None:
        row.update(self.system)
        row.update(peaks.mfu_measured(row, self.measured_peaks))
        if row.get("workload.name"):  # its module declares its own columns (on import)
            workloads.get(row["workload.name"])
        columns.check(list(row), f"{self.table.dir} row {row.get('trial_key')}")
        with interrupts.row_section():
            self.table.append(row)
            if self.history is not None:
                try:
                    self.history.append(row)
                except Exception as e:  # a sink: the run's own table has the row
                    if store.no_space(e):
                        raise  # the next row could not be written either: stop here
                    log.warning("could not add trial %s to the history under %s (%s); "
                                "`--resume` on this run adds it", row.get("trial_key"),
                                self.history.root, e)

    def summary(self, out: Path, elapsed_s: float) -> dict[str, Any]:
        statuses = list(self.done.values())
        stages_failed = sum(s["status"] != "ok" for s in self.stages)
        if self.searches:  # a probe that does not fit is how a search ends, not a failure
            statuses = [s for s in statuses if s == "ok"]
            stages_failed += sum(s["largest_batch"] == 0 for s in self.searches)
        ok = [r for r in self.table.rows if r["status"] == "ok" and r["stage"] == "benchmark"]
        # the report's rule, for rows without a rate too (a Server search that met no rate)
        valid = [r for r in ok if not validity(r)]
        best = max((r for r in valid if headline(r)), key=headline, default=None)
        return {
            "sweep": self.spec.name, "run_id": self.run_id, "output": str(out),
            "results": str(self.table.parquet), "trials": len(statuses),
            "ok": statuses.count("ok"),
            "failed": len(statuses) - statuses.count("ok") + stages_failed,
            "status_counts": {s: statuses.count(s) for s in sorted(set(statuses))},
            "invalid": len(ok) - len(valid),
            "best": None if best is None else {
                "trial_key": best["trial_key"], "samples_per_s": headline(best)},
            "preprocess": self.stages,
            **({"largest_batch": self.searches} if self.searches else {}),
            **({"resumed_rows": self.resumed} if self.resumed else {}),
            "elapsed_s": round(elapsed_s, 1),
        }


def finished(trial: TrialSpec, outcome: TrialOutcome) -> str:
    """A finished trial in a line: `trial 3 70ba71e0b3cc: ok, 119.8 samples/s`."""
    thr = headline(outcome.metrics)
    return (f"trial {trial.index} {trial.key}: {outcome.status}"
            + (f", {thr:.1f} samples/s" if thr else f" ({(outcome.error or '')[:200]})"))


def trial_line(row: dict[str, Any]) -> dict[str, Any]:
    """A finished trial for a pipeline, as the ResNet suite prints one: samples per second,
    samples measured, the trial's elapsed seconds, its configuration, then the whole row."""
    steps, gbs = row.get("train/measured_steps"), row.get("train/global_batch_size")
    elapsed = (datetime.fromisoformat(row["end_time"]) -
               datetime.fromisoformat(row["start_time"])).total_seconds()
    return _jsonable({
        "trial_index": row["trial_index"], "trial_key": row["trial_key"],
        "status": row["status"], "error": row["error"],
        "samples_per_s": headline(row),
        "total_samples": steps * gbs if steps and gbs else row.get("infer/samples"),
        "elapsed_seconds": elapsed,
        "config": {k: v for k, v in row.items() if k.split(".", 1)[0] in SECTIONS},
        "row": row,
    })


def headline(metrics: dict[str, Any]) -> float | None:
    """A row's samples per second: training, offline inference, or the Server rate found."""
    for key in ("train/samples_per_s", "infer/samples_per_s", "server/samples_per_s"):
        if present(metrics.get(key)):
            return float(metrics[key])
    return None


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with identity columns first and a stable, sorted rest."""
    frame = uniform_cells(pd.DataFrame(rows))
    config = sorted(c for c in frame.columns if "." in c and c not in ID_COLUMNS)
    metrics = sorted(c for c in frame.columns if "/" in c)
    rest = [c for c in frame.columns if c not in {*ID_COLUMNS, *config, *metrics}]
    return frame[[*ID_COLUMNS, *config, *metrics, *rest]]


def write_table(directory: Path, frame: pd.DataFrame) -> None:
    """`results.parquet`, then `results.csv`, each whole or not at all."""
    _atomic(Path(directory) / "results.parquet", lambda p: write_parquet(frame, p))
    _atomic(Path(directory) / "results.csv", lambda p: frame.to_csv(p, index=False))


def write_parquet(frame: pd.DataFrame, path: str | Path) -> None:
    """The frame as Parquet, with its metric columns' units in the schema metadata."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = {**(table.schema.metadata or {}), **columns.metadata(list(frame.columns))}
    pq.write_table(table.replace_schema_metadata(meta), path)


def _atomic(path: Path, write) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj

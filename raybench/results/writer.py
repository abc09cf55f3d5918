"""The row writer: each finished trial, stage and search written as it ends, and what is written.

Owns when and where rows go: the run's table (table.py), its trial file, the long-lived
history (history.py) and any sinks (an MLflow tracker), a row's writes never split by Ctrl-C
(interrupts.row_section); on a resumed run, which trials already have rows and the history
brought up to the table. Rows are made and completed by rows.py; the run's summary is the
sweep loop's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from raybench import console, interrupts, store
from raybench.records import TrialOutcome, present
from raybench.results import history as history_store
from raybench.results.rows import complete, finished, search_row, stage_row, trial_line, trial_row
from raybench.results.table import ResultsTable
from raybench.spec import SweepSpec
from raybench.trials import TrialSpec

log = logging.getLogger(__name__)

Sink = Callable[[dict[str, Any], Path], None]


class RowWriter:
    """Turns trial outcomes into rows and trial files; remembers what is written."""

    def __init__(self, spec: SweepSpec, run_id: str, table: ResultsTable,
                 history: Any = None, jsonl: bool = False, sinks: list[Sink] | None = None):
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
        def ident(r: dict[str, Any]) -> tuple[str, str, str]:
            return (str(r.get("stage")), str(r.get("trial_key")), str(r.get("end_time")))

        try:
            had = history_store.read(self.history.root, ds.field("run_id") == self.run_id,
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

    def _ids(self) -> dict[str, str]:
        return {"sweep": self.spec.name, "run_id": self.run_id, "system": self.spec.system.label}

    def write(self, trial: TrialSpec, outcome: TrialOutcome, say: bool = True) -> None:
        """`say`: log the trial's line (`finished`); False where a progress line says it."""
        with interrupts.row_section():  # a Ctrl-C waits until row, trial file and history agree
            row, trial_file = self._write(trial, outcome)
        if say:
            log.info("%s", finished(trial, outcome))
        for sink in self.sinks:
            sink(row, trial_file)

    def _write(self, trial: TrialSpec, outcome: TrialOutcome) -> tuple[dict[str, Any], Path]:
        row = trial_row(trial, outcome, **self._ids())
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
        """A preprocess stage run as a row (once per run: a resumed run that finds the stage's
        row does not add another)."""
        if key not in self._stage_rows or not outcome.ok:
            self._append(stage_row(key, outcome, start, **self._ids()))
        self.stages.append({"key": key, "status": outcome.status, "output": outcome.output,
                            "chips_per_s": outcome.metrics.get("preprocess/chips_per_s"),
                            "cached": outcome.metrics.get("preprocess/cached")})

    def write_search(self, group: TrialSpec, result: dict[str, Any], start: str) -> None:
        """The answer of a largest-batch search as a `stage=search` row (probes are trials)."""
        if group.key not in self._stage_rows:  # a resumed run keeps its finished searches' rows
            self._append(search_row(group, result, start, **self._ids()))
        self.searches.append({"config": group.overrides, **result,
                              "probes": {str(k): v for k, v in result["probes"].items()}})
        log.info("largest batch for %s: %d (probes %s)", group.overrides or group.key,
                 result["largest_batch"], result["probes"])

    def _append(self, row: dict[str, Any]) -> None:
        if self.spec.system.gpu_hour_usd is not None:  # a serving row's cost: priced GPUs only
            # the serving figures (scipy, through MLPerf's rules): only where GPUs have a price
            from raybench.scenarios.llm.figures import usd_per_m_tokens

            cost = usd_per_m_tokens(self.spec.system.gpu_hour_usd,
                                    row.get("serve/output_tokens_per_s_per_gpu"))
            if cost is not None:
                row["serve/usd_per_m_output_tokens"] = cost
        complete(row, self.system, self.measured_peaks,
                 f"{self.table.dir} row {row.get('trial_key')}")
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

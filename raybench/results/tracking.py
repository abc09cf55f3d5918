"""MLflow tracking of a sweep (`output.mlflow`), through MLflow's own client (`mlflow-skinny`, the
`raybench[mlflow]` extra).

One MLflow run per trial, nested under one run for the sweep. A trial's run gets the
configuration (the row's workload/hardware/measure/inference columns) as parameters, the row's
numeric figures as metrics under the table's own keys (`train/samples_per_s`), its text figures,
status and error as tags and its trial JSON as an artefact, and ends FINISHED when the trial is ok,
FAILED otherwise. The sweep's run gets the report, `system_info.json`, `sweep.yaml` and the results
table when the sweep ends (one report for the sweep: a copy in every trial's run would repeat the
whole page N times). A resumed sweep goes on in the sweep run it started.

The results table stays the record: a tracking URI that cannot be reached is an input error
before anything runs (`check`), and a server that fails mid-sweep costs a warning and the later
trials' MLflow runs, never a row.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from raybench.spec import SpecError, SweepSpec
from raybench.trials import SECTIONS

log = logging.getLogger("raybench.tracking")

KEY = "output.mlflow.tracking_uri"
# MLflow's HTTP client retries a failed request 7 times with growing back-off and waits 120 s
# for an answer: minutes of a stalled driver for a side channel. A user's own settings win.
CHECK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
SWEEP_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# MLflow's limits: log_batch takes 100 parameters and 1000 entries in all per call; a
# parameter's value 6000 characters, a tag's 8000
BATCH_PARAMS, BATCH_ALL, PARAM_LEN, TAG_LEN = 100, 1000, 6000, 8000
SWEEP_FILES = ("report.html", "system_info.json", "sweep.yaml", "results.parquet")
# MLflow's usage telemetry, off unless the user turns it on: where its endpoint cannot be reached
# (a cluster without the internet), its config thread removes an environment variable
# (_MLFLOW_TELEMETRY_SESSION_ID) while this process's requests read the environment, and one of
# raybench's requests failed with that name as a KeyError (a clean clone's make test here).
TELEMETRY_OFF = ("MLFLOW_DISABLE_TELEMETRY", "true")


def _mlflow_client() -> type:
    """MLflow's client class, MLflow imported with its telemetry off unless set otherwise."""
    os.environ.setdefault(*TELEMETRY_OFF)  # read once, as MLflow is imported
    # MLflow: an optional dependency (the mlflow extra)
    from mlflow.tracking import MlflowClient

    return MlflowClient


def check(spec: SweepSpec) -> None:
    """Raises SpecError unless MLflow's client is installed and reaches the tracking URI."""
    cfg = spec.output.mlflow
    if cfg is None:
        return
    try:
        client_class = _mlflow_client()
    except ImportError as e:
        raise SpecError(spec.source, KEY, cfg.tracking_uri,
                        f"output.mlflow needs MLflow's client, which is not installed ({e})",
                        "pip install 'raybench[mlflow]' (mlflow-skinny) into this environment, "
                        "or remove output.mlflow") from None
    try:
        with _http(CHECK_HTTP):
            client_class(cfg.tracking_uri).search_experiments(max_results=1)
    except Exception as e:
        raise SpecError(spec.source, KEY, cfg.tracking_uri,
                        f"MLflow cannot use it ({type(e).__name__}: {_first_line(e)})",
                        "start the tracking server (e.g. `mlflow server --host 127.0.0.1 "
                        "--port 5000`) or correct the URI, then run the sweep again; or remove "
                        "output.mlflow") from None


def split(row: dict[str, Any]) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """A results row as MLflow sees it: (parameters, metrics, tags). Configuration columns are
    parameters, numeric figures metrics, text figures and the row's own fields tags; empty
    cells and NaN are left out (MLflow has no missing value)."""
    params, metrics, tags = {}, {}, {}
    for key, value in row.items():
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()  # numpy scalars from pandas
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if key.split(".", 1)[0] in SECTIONS:
            params[key] = str(value)[:PARAM_LEN]
        elif "/" in key and isinstance(value, (bool, int, float)) and math.isfinite(value):
            metrics[key] = float(value)
        else:
            tags[key if "/" in key else f"raybench.{key}"] = str(value)[:TAG_LEN]
    return params, metrics, tags


class Tracker:
    """The MLflow side of one sweep run: `start` once the run directory has its files,
    `log_trial` as each row is written (a RowWriter sink), `finish` with the summary."""

    def __init__(self, spec: SweepSpec, out: Path):
        self.cfg = spec.output.mlflow
        self.spec, self.out = spec, Path(out).resolve()
        self.client = _mlflow_client()(self.cfg.tracking_uri)
        self.experiment_id: str | None = None
        self.sweep_run: str | None = None
        self.trial_runs = 0
        self.error: str | None = None

    def start(self) -> None:
        with self._guard("open the sweep's run"):
            name = self.cfg.experiment or self.spec.name
            self.experiment_id = self._experiment(name)
            tags = {"raybench.role": "sweep", "raybench.sweep": self.spec.name,
                    "raybench.run_id": self.out.name, "raybench.output": str(self.out),
                    "raybench.system": self.spec.system.label,
                    "raybench.sweep_file": self.spec.source}
            again = self._resumed()
            if again:
                self.sweep_run = again
                self.client.update_run(again, status="RUNNING")
            else:
                self.sweep_run = self.client.create_run(
                    self.experiment_id, tags=tags,
                    run_name=f"{self.spec.name} {self.out.name}").info.run_id

    def log_trial(self, row: dict[str, Any], trial_file: Path) -> None:
        if self.sweep_run is None:
            return
        with self._guard(f"log trial {row.get('trial_key')}"):
            # MLflow: an optional dependency (the mlflow extra)
            from mlflow.entities import Metric, Param, RunTag

            params, metrics, tags = split(row)
            end = _ms(row["end_time"])
            run = self.client.create_run(
                self.experiment_id, start_time=_ms(row["start_time"]),
                run_name=f"{row['trial_index']:04d}_{row['trial_key']}",
                tags={"mlflow.parentRunId": self.sweep_run, "raybench.role": "trial",
                      # where this trial's report is once the sweep ends
                      "raybench.report": f"runs:/{self.sweep_run}/report.html"})
            rid = run.info.run_id
            for batch in _batches([Param(k, v) for k, v in params.items()],
                                  [Metric(k, v, end, 0) for k, v in metrics.items()],
                                  [RunTag(k, v) for k, v in tags.items()]):
                self.client.log_batch(rid, **batch)
            self.client.log_artifact(rid, str(trial_file))
            self.client.set_terminated(rid, "FINISHED" if row["status"] == "ok" else "FAILED",
                                       end_time=end)
            self.trial_runs += 1

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Closes the sweep's run with the run's files; returns what the summary line shows."""
        if self.sweep_run is not None:
            with self._guard("close the sweep's run"):
                for name in SWEEP_FILES:
                    if (self.out / name).is_file():
                        self.client.log_artifact(self.sweep_run, str(self.out / name))
                for key in ("trials", "ok", "failed", "invalid", "elapsed_s"):
                    if isinstance(summary.get(key), (int, float)):
                        self.client.log_metric(self.sweep_run, f"sweep/{key}", summary[key])
                status = ("KILLED" if summary.get("interrupted") else
                          "FINISHED" if summary.get("failed") == 0 else "FAILED")
                self.client.set_terminated(self.sweep_run, status)
        return {"tracking_uri": self.cfg.tracking_uri, "experiment_id": self.experiment_id,
                "sweep_run_id": self.sweep_run, "trial_runs": self.trial_runs,
                **({"error": self.error} if self.error else {})}

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # another sweep created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _resumed(self) -> str | None:
        """The sweep run an interrupted session of this run directory opened, if any."""
        if "'" in str(self.out):
            return None  # not expressible in MLflow's filter syntax: a new sweep run
        runs = self.client.search_runs(
            [self.experiment_id], max_results=1,
            filter_string=f"tags.`raybench.role` = 'sweep' and "
                          f"tags.`raybench.output` = '{self.out}'")
        return runs[0].info.run_id if runs else None

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """MLflow errors end the tracking, never the sweep: the table has every row."""
        try:
            with _http(SWEEP_HTTP):
                yield
        except Exception as e:
            self.error = f"could not {what}: {type(e).__name__}: {_first_line(e)}"
            log.warning("MLflow (%s): %s; the results table is complete, later trials are not "
                        "sent to MLflow", self.cfg.tracking_uri, self.error)
            self.sweep_run = None


def _batches(params: list, metrics: list, tags: list) -> Iterator[dict[str, list]]:
    """log_batch calls within MLflow's limits: the parameters 100 a call, then metrics and
    tags 1000 a call."""
    for i in range(0, len(params), BATCH_PARAMS):
        yield {"params": params[i:i + BATCH_PARAMS]}
    rest = len(metrics) + len(tags)
    for i in range(0, rest, BATCH_ALL):
        yield {"metrics": metrics[i:i + BATCH_ALL],
               "tags": tags[max(0, i - len(metrics)):max(0, i + BATCH_ALL - len(metrics))]}


@contextlib.contextmanager
def _http(settings: dict[str, str]) -> Iterator[None]:
    """MLflow reads its HTTP settings from the environment at each request."""
    saved = {k: os.environ.get(k) for k in settings}
    for k, v in settings.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).timestamp() * 1000)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else "no message"

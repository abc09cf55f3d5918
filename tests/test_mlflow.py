"""output.mlflow against a real MLflow tracking server: MLflow's own `mlflow server` (SQLite
backend, artefacts served through it) on 127.0.0.1, started here and stopped at the end. A sweep
of one ok and one failing trial runs through the CLI (the local runner: the tracking is the
sweep loop's, the same for both runners), then the runs are read back with MLflow's client."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient  # the dev extra installs mlflow-skinny

from raybench.results import tracking
from raybench.sweep import command as sweep
from tests.conftest import ROOT, TINY_SWEEP
from tests.integration.ray_nodes import free_port

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    url = f"http://127.0.0.1:{free_port()}"
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
         "--port", url.rsplit(":", 1)[1], "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


def run_cli(tmp_path: Path, text: str, *args: str) -> tuple[int, str, str]:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    out, err, cwd = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = sweep.main([str(path), *args])
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def test_each_trial_is_an_mlflow_run_under_the_sweeps_run(server, tmp_path):
    empty = tmp_path / "no_classes"
    empty.mkdir()
    text = TINY_SWEEP.replace("grid: {batch_size: [4, 8]}",
                              "grid: {data: [synthetic, imagefolder]}") + (
        f"output: {{mlflow: {{tracking_uri: '{server}', experiment: raybench-test}}}}\n")
    out = tmp_path / "run"
    code, stdout, _ = run_cli(tmp_path, text, "--runner", "local", "--output", str(out),
                              "--set", f"workload.data_path={empty}")
    assert code == 3, stdout[-2000:]  # the imagefolder trial fails: a row, and a FAILED run
    summary = json.loads(stdout.strip().splitlines()[-1])["raybench"]
    assert summary["mlflow"]["trial_runs"] == 2 and "error" not in summary["mlflow"]

    client = MlflowClient(server)
    exp = client.get_experiment_by_name("raybench-test")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags["raybench.role"] == "sweep"]
    trials = {r.data.params["workload.data"]: r for r in runs
              if r.data.tags["raybench.role"] == "trial"}
    assert parent.info.run_id == summary["mlflow"]["sweep_run_id"]
    assert parent.info.status == "FAILED" and parent.data.metrics["sweep/ok"] == 1
    assert parent.data.tags["raybench.output"] == str(out.resolve())
    assert set(trials) == {"synthetic", "imagefolder"}
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials.values())
    assert all(r.data.tags["raybench.report"] == f"runs:/{parent.info.run_id}/report.html"
               for r in trials.values())

    import pandas as pd

    rows = pd.read_parquet(out / "results.parquet").set_index("workload.data")
    ok, bad = trials["synthetic"], trials["imagefolder"]
    assert ok.info.status == "FINISHED" and bad.info.status == "FAILED"
    # the configuration as parameters, the row's figures as metrics, the row's fields as tags
    assert ok.data.params["workload.batch_size"] == "4"
    assert ok.data.params["measure.measure_steps"] == "3"
    assert ok.data.metrics["train/samples_per_s"] == pytest.approx(
        rows.loc["synthetic", "train/samples_per_s"])
    assert ok.data.metrics["train/step_time_p50_ms"] > 0
    assert ok.data.tags["raybench.trial_key"] == rows.loc["synthetic", "trial_key"]
    assert bad.data.tags["raybench.status"] == "error"
    assert "FileNotFoundError" in bad.data.tags["raybench.error"]
    assert "train/samples_per_s" not in bad.data.metrics

    # artefacts: each trial's JSON in its run, the report and the table in the sweep's
    for name, run in (("synthetic", ok), ("imagefolder", bad)):
        key = rows.loc[name, "trial_key"]
        (local,) = (out / "trials").glob(f"*_{key}.json")
        got = client.download_artifacts(run.info.run_id, local.name, str(tmp_path / name))
        assert Path(got).read_bytes() == local.read_bytes()
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert names == {"report.html", "system_info.json", "sweep.yaml", "results.parquet"}
    got = client.download_artifacts(parent.info.run_id, "report.html", str(tmp_path))
    assert Path(got).read_bytes() == (out / "report.html").read_bytes()


def test_an_unreachable_tracking_uri_is_an_input_error_before_anything_runs(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    text = TINY_SWEEP + f"output: {{root: {tmp_path / 'results'}, mlflow: {{tracking_uri: '{uri}'}}}}\n"
    t0 = time.monotonic()
    code, stdout, stderr = run_cli(tmp_path, text)
    assert code == 2, stdout[-2000:] + stderr[-2000:]
    err = stderr.strip().splitlines()[-1]
    assert str(tmp_path / "sweep.yaml") in err and "output.mlflow.tracking_uri" in err
    assert uri in err and "Fix:" in err and "mlflow server" in err
    assert not (tmp_path / "results").exists()  # no run directory, no table
    # no minutes of MLflow's default retries; the CLI's own start (Python, MLflow's client)
    # took 33 s in a `make test` run beside another one on these two cores
    assert time.monotonic() - t0 < 60


def test_split_puts_config_figures_and_fields_where_mlflow_wants_them():
    row = {"sweep": "s", "status": "ok", "error": None, "workload.batch_size": np.int64(8),
           "hardware.env.NCCL_ALGO": "Ring", "train/samples_per_s": np.float64(12.5),
           "train/ok": True, "train/loss": float("nan"), "train/epoch_times_s": "[1.0, 2.0]",
           "cluster/rank_nodes": "a,b", "memory/peak_mb": float("inf")}
    params, metrics, tags = tracking.split(row)
    assert params == {"workload.batch_size": "8", "hardware.env.NCCL_ALGO": "Ring"}
    assert metrics == {"train/samples_per_s": 12.5, "train/ok": 1.0}
    assert tags == {"raybench.sweep": "s", "raybench.status": "ok",
                    "train/epoch_times_s": "[1.0, 2.0]", "cluster/rank_nodes": "a,b",
                    "memory/peak_mb": "inf"}


def test_batches_keep_mlflows_per_call_limits():
    from mlflow.entities import Metric, Param, RunTag

    params = [Param(f"p{i}", "v") for i in range(250)]
    metrics = [Metric(f"m{i}", 1.0, 0, 0) for i in range(1500)]
    tags = [RunTag(f"t{i}", "v") for i in range(700)]
    calls = list(tracking._batches(params, metrics, tags))
    sent = [e for c in calls for part in c.values() for e in part]
    assert sent == params + metrics + tags  # everything, once, in order
    assert all(sum(map(len, c.values())) <= 1000 and len(c.get("params", [])) <= 100
               for c in calls)


def test_a_server_failing_mid_sweep_costs_the_tracking_not_the_sweep(server, tmp_path,
                                                                     caplog):
    from raybench.spec import load_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(TINY_SWEEP + f"output: {{mlflow: {{tracking_uri: '{server}'}}}}\n")
    tracker = tracking.Tracker(load_sweep(path, []), tmp_path / "run")
    tracker.start()
    assert tracker.sweep_run is not None

    def gone(*a, **k):
        raise ConnectionError("server went away")

    tracker.client.create_run = gone
    row = {"trial_index": 0, "trial_key": "k", "status": "ok", "start_time":
           "2026-11-24T00:00:00.000+00:00", "end_time": "2026-11-24T00:00:01.000+00:00"}
    tracker.log_trial(row, tmp_path / "none.json")  # does not raise
    assert tracker.sweep_run is None and "server went away" in tracker.error
    assert "later trials are not sent to MLflow" in caplog.text
    tracker.log_trial(row, tmp_path / "none.json")  # and does not try again
    assert tracker.finish({"failed": 0})["error"] == tracker.error


def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on(monkeypatch):
    """MLflow's telemetry thread removes an environment variable where its endpoint cannot be
    reached, while raybench's requests read the environment (a KeyError in one of them, seen
    in a clean clone's make test): raybench imports MLflow with it off, a user's setting wins."""
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    assert tracking._mlflow_client() is MlflowClient
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    tracking._mlflow_client()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"

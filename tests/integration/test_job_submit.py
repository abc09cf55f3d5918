"""`ray start --head` + `ray job submit --working-dir .` of the local sweep, with Ray 2.60's token
authentication, as the README's cluster section shows; and the live dashboard as
dashboards/README.md sets it up: Debian's Prometheus scrapes the cluster through the scrape
configuration Ray writes while the job runs, then every panel's query in
dashboards/raybench_grafana.json must return a series. The cluster is stopped afterwards."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.ray_nodes import BIN, LocalCluster, free_port

pytestmark = pytest.mark.ray

PROMETHEUS = shutil.which("prometheus")
# the panels that need a GPU's series: on a machine without one they are said, not checked
GPU_SERIES = re.compile(r"ray_node_(gpus?_|gram_)")


class Prometheus:
    """A Prometheus server on 127.0.0.1 with its own data folder, scraping what Ray's own
    `metrics/prometheus/prometheus.yml` names (the file the dashboards README points at), at 1 s
    instead of Ray's 10 s so that a one-minute job gives it enough samples."""

    def __init__(self, ray_config: Path, workdir: Path):
        config = yaml.safe_load(ray_config.read_text())
        config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = workdir / "prometheus.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str, **params) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # Prometheus says why in the body
            raise AssertionError(f"{url}: {e.code} {e.read().decode(errors='replace')}") from e
        assert body["status"] == "success", body
        return body["data"]

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"Prometheus not ready after {timeout} s: "
                           f"{self.log.read_text()[-3000:]}")

    def series(self, expr: str, start: float, end: float) -> list[dict]:
        """What Grafana asks for a panel: a range query over the job's time, 1 s apart."""
        return self.get("/api/v1/query_range", query=expr, start=start, end=end,
                        step="1s")["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One cluster, and Prometheus where it is installed, through one submitted job: the job's
    own checks and the dashboard's are separate tests, so a machine without Prometheus still
    checks `ray job submit` (and says only the dashboard half was skipped)."""
    tmp_path = tmp_path_factory.mktemp("job")
    cluster = LocalCluster()
    prometheus = None
    try:
        cluster.start_head("--num-cpus=3", f"--metrics-export-port={free_port()}")
        cluster.wait_for_nodes(1)
        session = Path(cluster.temp_dir, "session_latest").resolve()
        if PROMETHEUS:
            ray_config = session / "metrics" / "prometheus" / "prometheus.yml"
            deadline = time.monotonic() + 60
            while not ray_config.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            prometheus = Prometheus(ray_config, tmp_path)
            prometheus.wait_ready()
        out = tmp_path / "jobrun"
        start = time.time()
        cmd = [str(BIN / "ray"), "job", "submit", "--address", cluster.dashboard,
               "--working-dir", ".",
               # step 4 of dashboards/README.md: Ray Train's own metrics for the start panel
               "--runtime-env-json", '{"env_vars": {"RAY_TRAIN_METRICS_ENABLED": "1"}}',
               "--", "python", "-m", "raybench.sweep",
               "sweeps/local_cpu.yaml", "--output", str(out),
               "--set", "measure.measure_steps=4", "--set", "measure.warmup_steps=1",
               "--set", "measure.repeats=1",
               # 1 of its 4 trials: the job path is the test
               "--set", "grid={batch_size: [8], cpu_workers: [1]}"]
        proc = subprocess.run(cmd, cwd=ROOT, env=cluster.env, capture_output=True, text=True,
                              timeout=600)
        yield {"cluster": cluster, "prometheus": prometheus, "session": session.name,
               "start": start, "out": out, "proc": proc, "tmp": tmp_path}
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


def test_job_submit_runs_the_local_sweep_with_token_authentication(job):
    proc, cluster = job["proc"], job["cluster"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout
    df = pd.read_parquet(job["out"] / "results.parquet")
    assert len(df) == 1 and (df["status"] == "ok").all()
    assert (df["train/samples_per_s"] > 0).all()
    # a client without the token is turned away
    env = {k: v for k, v in cluster.env.items() if k != "RAY_AUTH_TOKEN"}
    env["RAY_AUTH_TOKEN_PATH"] = str(job["tmp"] / "no-token")
    denied = subprocess.run([str(BIN / "ray"), "job", "list", "--address",
                             cluster.dashboard], env=env, capture_output=True, text=True,
                            timeout=120)
    assert denied.returncode != 0


def test_the_dashboard_shows_the_job(job):
    if job["prometheus"] is None:
        pytest.skip("no `prometheus` on PATH (Debian package `prometheus`; .ci/run installs "
                    "it): the dashboard's queries were not checked (the job's own test ran)")
    assert job["proc"].returncode == 0, job["proc"].stderr[-3000:]
    _every_panel_has_a_series(job["prometheus"], job["session"], job["start"])


def _every_panel_has_a_series(prometheus: Prometheus, session: str, start: float) -> None:
    dash = json.loads((ROOT / "dashboards" / "raybench_grafana.json").read_text())
    # the session picker's query, label_values(METRIC, SessionName), is this API call
    (variable,) = [v for v in dash["templating"]["list"] if v["name"] == "session"]
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]).groups()
    time.sleep(3)  # the last scrape after the job's end
    end = time.time()
    assert session in prometheus.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
    gpu_panels, checked = [], []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            # a session name is letters, digits, '_' and '-': itself as a regex, as Grafana
            # puts it
            assert re.fullmatch(r"[\w-]+", session), session
            expr = target["expr"].replace("$session", session)
            if GPU_SERIES.search(expr) and not _have_gpu():
                gpu_panels.append(panel["title"])
                continue
            found = prometheus.series(expr, start, end)
            assert found, f"panel {panel['title']!r}: no series for {expr}"
            checked.append(panel["title"])
    assert checked and set(checked) >= {"Host CPU utilisation", "Host memory used",
                                        "Network received / sent",
                                        "Train worker-group start time (per trial)"}
    if gpu_panels:
        warnings.warn(f"no GPU here: the panels {gpu_panels} were not checked against "
                      "Prometheus (their series exist only on a node with a GPU)", stacklevel=1)


def _have_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0

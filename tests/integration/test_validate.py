"""`python -m raybench.validate` end to end on a local Ray cluster of two logical nodes (CPU):
the suite runs a probe trial on each node at once and the all-reduce, the verdict names both
nodes, the rows land in the history, where a later sweep of the same system finds the matmul
peak measured there. Bad input is exit 2 with its fix, before any trial."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.integration.ray_nodes import LocalCluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

NODES = ["127.0.0.2", "127.0.0.3"]
# two logical nodes share this machine's two cores, and their probes run at once beside the
# other test worker's tests: a margin for that, not for real nodes (defaults: verdict.Margins;
# the peer rule's own thresholds are tested on made-up rows in tests/test_verdict.py). In a clean
# clone's `make test` one node's 40 ms matmul window read 75% below the other's.
SHARED_CORES = "peer_warn_pct: 30\npeer_fail_pct: 90\n"


@pytest.fixture(scope="module")
def two_nodes():
    cluster = LocalCluster(head_ip=NODES[0])
    token = '--resources={"raybench_node": 1}'
    try:
        cluster.start_head("--num-cpus=2", token)
        cluster.add_node(NODES[1], "--num-cpus=2", token)
        cluster.wait_for_nodes(2)
        yield cluster
    finally:
        cluster.stop()


def validate(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raybench.validate", *args], cwd=ROOT,
                          env=cluster.env, capture_output=True, text=True, timeout=500)


@pytest.fixture(scope="module")
def validated(two_nodes, tmp_path_factory):
    """One validation. Its probes get 90 s to be placed and as long again to start (`--set`,
    where the suite's default gives 30): two cores shared with the other test worker's sweeps
    once left a probe's workers unstarted 60 s after its trial began (a clean clone's make
    test), which validate reports as it should, and the test is of everything else."""
    out = tmp_path_factory.mktemp("validate") / "run"
    margins = out.parent / "margins.yaml"
    margins.write_text(SHARED_CORES)
    proc = validate(two_nodes, "--address", two_nodes.address, "--output", str(out),
                    "--margins", str(margins), "--set", "execution.start_timeout_s=90")
    return out, proc


def test_validate_runs_the_suite_on_every_node_and_gives_a_verdict(validated):
    out, proc = validated
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["raybench_validate"]
    assert summary["suite"] == "v1" and summary["verdict"] in ("pass", "warn")
    assert sum(summary["nodes"].values()) == 2 and summary["nodes"]["fail"] == 0
    report = json.loads((out / "validation.json").read_text())
    subjects = {v["subject"] for v in report["devices"]}
    assert subjects == {f"{ip} CPU" for ip in NODES}  # a probe row from each node
    for v in report["devices"]:
        assert v["figures"].get("probe/matmul_tflops", 0) > 0, report["devices"]
        assert v["figures"].get("probe/copy_gb_s", 0) > 0, report["devices"]
    page = (out / "validation.html").read_text()
    assert all(ip in page for ip in NODES) and "raybench validate" in page
    # the per-node probes: `concurrency: per_node`, each trial alone on its node, side by side
    assert "concurrency per_node: 2 of 2 nodes" in proc.stderr
    matmul = pd.read_parquet(out / "matmul" / "results.parquet")
    assert (matmul["cluster/placement_strategy"] == "STRICT_PACK").all()
    start = [pd.Timestamp(x) for x in matmul["start_time"]]
    end = [pd.Timestamp(x) for x in matmul["end_time"]]
    assert max(start) < min(end), "the two trials did not overlap in time"
    assert sorted(matmul["cluster/rank_nodes"]) == NODES
    allreduce = pd.read_parquet(out / "allreduce" / "results.parquet")
    assert (allreduce["status"] == "ok").all() and allreduce["comm/busbw_gb_s"].gt(0).all()
    print(summary)


def test_the_validations_history_gives_this_systems_measured_peak(validated):
    """What a later sweep in the same results root reads (peaks.latest, once per sweep): the
    matmul rows of this validation, by the system's fingerprint; RowWriter then states each
    row's MFU against it (tests/test_verdict.py). Read here rather than by a second sweep on
    the cluster (20 s of CI)."""
    from raybench.results import peaks
    from raybench.results.history import History

    out, proc = validated
    assert proc.returncode == 0, proc.stderr[-3000:]
    matmul = pd.read_parquet(out / "matmul" / "results.parquet")
    assert matmul["perf/peak_probe"].all()
    measured = peaks.latest(History(out, "test"), matmul["system/fingerprint"].iloc[0])
    assert measured == {"fp32": pytest.approx(matmul["perf/achieved_tflops_per_gpu"].median())}
    assert peaks.latest(History(out, "test"), "another system") == {}


def test_bad_input_is_exit_2_with_its_fix(two_nodes, tmp_path):
    proc = validate(two_nodes, "--address", two_nodes.address, "--expect-gpus", "8",
                    "--output", str(tmp_path / "gpus"))
    assert proc.returncode == 2 and "has no GPUs" in proc.stderr and "Fix:" in proc.stderr
    margins = tmp_path / "m.yaml"
    margins.write_text("peer_margin: 5\n")
    proc = validate(two_nodes, "--margins", str(margins), "--output", str(tmp_path / "m"))
    assert proc.returncode == 2 and "peer_margin" in proc.stderr and "peer_warn_pct" in \
        proc.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = validate(two_nodes, "--address", f"127.0.0.1:{port}")
    assert proc.returncode == 2 and f"no Ray cluster answers at 127.0.0.1:{port}" in \
        proc.stderr
    assert not any(Path(tmp_path).glob("*/*/results.parquet"))

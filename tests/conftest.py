"""Shared fixtures: sweep files written on the fly, the GPU skip, and two spawned gloo ranks."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# Every row any test writes (here or in a sweep it starts) has each metric column declared
# with its unit (raybench/columns.py): a new figure without its declaration fails a test.
os.environ["RAYBENCH_STRICT_COLUMNS"] = "1"

TINY_SWEEP = """
name: tiny
system: {label: test-cpu, nodes: 1, gpus_per_node: 0}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 4,
           synthetic_samples: 256}
hardware: {num_gpus: 0, cpu_workers: 1, dataloader_workers: 0}
grid: {batch_size: [4, 8]}
measure: {warmup_steps: 1, measure_steps: 3}
"""


@pytest.fixture
def write_sweep(tmp_path: Path):
    """Write YAML text (dedented) to a file and return its path."""

    def _write(text: str = TINY_SWEEP, name: str = "sweep.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


def pytest_configure(config):
    """Under pytest-xdist, one Ray token before any worker starts a cluster. Each `ray.init`
    that starts a local cluster and finds no token writes a new one to ~/.ray/auth_token
    (Ray 2.59+); on a fresh machine two workers starting clusters at the same moment could
    each write their own, and one cluster would hold a token the file no longer has."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker, or no workers at all
    if os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").exists():
        return
    subprocess.run([str(Path(sys.executable).parent / "ray"), "get-auth-token", "--generate"],
                   check=True, capture_output=True)


# A test marked background runs at SCHED_IDLE beside the other parts (Makefile): the xView3
# detector, 113-182 s alone here, took 849 s so, most of it waiting while the parallel part
# held both cores. Not a hang before this.
BACKGROUND_TIMEOUT_S = 2400

# The parallel part's modules, costliest first (seconds on a worker in `make test` here,
# 2026-12-02: 371, 200, 189, 76, 72, 66, 59), and every other after them in collection order,
# with xdist's own reordering by test count turned off (Makefile, --no-loadscope-reorder). A
# worker takes its next module when two tests of its current one are left, so a module of few
# long tests that comes late ends the part alone: by test count the two-node module started
# 150 s in and the part's two workers ended 58 s apart (744 and 802 s); longest first, as a
# list scheduler balances best, the short modules fill in at the end.
COSTLIEST = ("integration/test_multinode.py", "integration/test_validate.py",
             "reliability/test_faults_ray.py", "test_mlflow.py",
             "integration/test_placement_ray.py", "integration/test_preprocess_stage.py",
             "integration/test_job_submit.py")


def _cost_rank(item) -> int:
    path = item.path.as_posix()
    return next((i for i, m in enumerate(COSTLIEST) if path.endswith("tests/" + m)),
                len(COSTLIEST))


def pytest_collection_modifyitems(config, items):
    # `make test`'s serial and background parts collect only the files where `mark.serial` /
    # `mark.background` is written (Makefile, SERIAL_FILES and BACKGROUND_FILES); a test
    # marked so from anywhere else would run in no part
    for mark in ("serial", "background"):
        marked = {item.path for item in items if item.get_closest_marker(mark)}
        unseen = sorted(str(p) for p in marked if f"mark.{mark}" not in p.read_text())
        if unseen:
            raise pytest.UsageError(
                f"tests marked {mark} from outside their file (in {unseen}): write "
                f"pytest.mark.{mark} in the test's own file, as the Makefile's {mark} part "
                "finds its files by that text")
    both = [i.nodeid for i in items
            if i.get_closest_marker("serial") and i.get_closest_marker("background")]
    if both:  # the parallel part leaves out both marks, and each of the others runs one
        raise pytest.UsageError(f"{both[0]} is marked both serial and background: mark it "
                                "one of the two")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the parallel part: its workers collect
        items.sort(key=_cost_rank)  # stable: each module's tests keep their order
    for item in items:  # a background test waits for CPU through the parallel part
        if item.get_closest_marker("background") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(BACKGROUND_TIMEOUT_S))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; this machine has no GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_env():
    """An S3-compatible server (moto) on 127.0.0.1 for this test session, with a bucket named
    `raybench`: the environment that points pyarrow, GDAL and raybench at it."""
    import logging

    from moto.server import ThreadedMotoServer
    from pyarrow import fs as pafs

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], access_key="test",
                          secret_key="test", region="us-east-1",
                          allow_bucket_creation=True).create_dir("raybench")
        yield env
    finally:
        server.stop()


@pytest.fixture
def on_s3(s3_env, monkeypatch):
    """This process pointed at the session's S3 server."""
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    return s3_env


def spawn_ranks(fn: Callable[..., None], *args: object, ranks: int = 2) -> None:
    """Run `fn(rank, port, *args)` in `ranks` spawned processes, which meet at 127.0.0.1:port
    (gloo_group); returns when all have ended, raises if one failed."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(fn, args=(port, *args), nprocs=ranks, join=True)


@contextlib.contextmanager
def gloo_group(rank: int, port: int, ranks: int = 2) -> Iterator[None]:
    """A spawned rank's process group for the body; after it, a barrier (neither rank tears the
    group down while the other still uses it), the group's end and the rank's exit."""
    import torch.distributed as dist

    from raybench.rank.launched import leave_rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave_rank()

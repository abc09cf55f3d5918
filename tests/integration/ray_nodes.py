"""Ray nodes this test process starts and stops itself: `ray start --block` children in their own
process groups, on their own ports, temp dir and token, so stopping them touches no other Ray."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_mounts_work(path: Path) -> bool:
    """Can this process give a child its own tmpfs at `path` (unshare --mount, CAP_SYS_ADMIN)?"""
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f'mount -t tmpfs tmpfs "{path}"']
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class LocalCluster:
    """A head (and optional worker nodes) on loopback addresses, with token authentication."""

    def __init__(self, head_ip: str = "127.0.0.1", private: str | None = None):
        self.head_ip = head_ip
        # each node (and a driver run through `private_cmd`) in its own mount namespace with
        # its own tmpfs at this path: the same folder name, a different disk on every node
        self.private = private
        self.port, self.dashboard_port = free_port(), free_port()
        # short: Ray's unix socket paths live under it and have a length limit
        self.temp_dir = tempfile.mkdtemp(prefix="rb", dir="/tmp")
        self.env = {**os.environ, "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_USAGE_STATS_ENABLED": "0",
                    "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.head_ip}:{self.dashboard_port}"

    def start_head(self, *args: str) -> None:
        self._start("--head", f"--node-ip-address={self.head_ip}", f"--port={self.port}",
                    f"--dashboard-port={self.dashboard_port}", f"--dashboard-host={self.head_ip}",
                    f"--ray-client-server-port={free_port()}",
                    f"--temp-dir={self.temp_dir}", "--include-dashboard=true", *args)

    def add_node(self, ip: str, *args: str) -> None:
        self._start(f"--address={self.address}", f"--node-ip-address={ip}", *args)

    def _start(self, *args: str) -> None:
        # Ray's fixed default ports (the agent's HTTP 52365, which serves job submission; the
        # client server's 10001) are taken by whichever Ray on this machine started first:
        # with `make test`'s tests two at a time, a job submitted here got "No available
        # agent to submit job". Every node of this cluster gets free ports of its own.
        cmd = [str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
               f"--dashboard-agent-listen-port={free_port()}", *args]
        if self.private:
            cmd = self.private_cmd(cmd)
        self.procs.append(subprocess.Popen(cmd, env=self.env, start_new_session=True,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def private_cmd(self, cmd: list[str], then: str = "") -> list[str]:
        """`cmd` in a mount namespace of its own, `self.private` a fresh tmpfs there (gone
        when its last process ends); `then`: a shell line run after it, its exit code kept."""
        script = (f'mount -t tmpfs tmpfs "{self.private}" && "$@"; rc=$?; {then or ":"}; '
                  'exit $rc')
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                *cmd]

    def wait_for_nodes(self, n: int, timeout: float = 120) -> None:
        """Until `n` nodes are alive. Each look is a driver of its own, started once the head's
        GCS port takes connections. One look hung in `ray.init` past its 60 s on Ray 2.55.1
        beside a loaded `make test` (2026-11-27; alone, a look started before the head had
        connected within 12 s), which failed the module's set-up: a look that hangs is now
        given up after 45 s and made again while time is left."""
        from raybench.runners.on_ray import (
            cluster,  # here: ray_nodes' other users need no Ray imported
        )
        from raybench.runners.on_ray.cluster import Unreachable

        code = ("import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                "print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                cluster.check_reachable(self.address, timeout_s=2)
            except Unreachable:
                time.sleep(0.5)
                continue
            try:
                r = subprocess.run([sys.executable, "-c", code, self.address], env=self.env,
                                   capture_output=True, text=True, timeout=min(45, left))
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(2)
        raise TimeoutError(f"{n} Ray nodes not up after {timeout} s")

    def stop(self) -> None:
        """SIGTERM to each `ray start --block` group (it stops its own node), then SIGKILL."""
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # one grace for all nodes: a test cluster saves nothing. `ray start --block` has never
        # ended within 10 s of SIGTERM here (every teardown took the whole grace), so short.
        deadline = time.monotonic() + 3
        for p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # the whole group: under `private` the leader is the shell, which ends at once
            # while its `ray start` is still stopping
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        # Ray gives each worker a process group of its own, so the killpg above misses them;
        # they end when their raylet does, except one that hangs on its way out (seen once in a
        # CI run: a TrainController whose core worker had shut down, alive an hour later). They
        # keep the session of the `ray start` that started them: end what is left of those,
        # killed again on every look: a worker forked after a look (its parent killed a moment
        # later) is not in that look's list. And read from one look: a clean clone of 937a1e6
        # failed with "outlived it: []", the check and its message having looked twice while a
        # SIGKILLed process was still being torn down (on 2 busy cores, freeing a trial's memory
        # takes seconds); a process that ends within the grace has not outlived the cluster.
        deadline = time.monotonic() + 30
        while (left := session_processes({p.pid for p in self.procs})):
            for proc in left:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError("processes of this test cluster outlived it by 30 s: "
                                   + ", ".join(describe(p) for p in left))
            time.sleep(0.2)

    def leftovers(self) -> list[int]:
        """Processes still running in the sessions of this cluster's `ray start` children."""
        return [p.pid for p in session_processes({p.pid for p in self.procs})]


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {p.name()} ({p.status()})"
    except psutil.Error:
        return f"{p.pid} (gone)"


def session_processes(sessions: set[int]) -> list[psutil.Process]:
    """Processes running in these sessions: the ones a test started with a new session, and
    theirs, Ray's workers included (each in a process group of its own, but not a session);
    nobody else's. A zombie has ended; its reaping is its parent's business."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) in sessions and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found

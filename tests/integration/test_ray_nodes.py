"""The test cluster's teardown: nothing it started outlives it, and nothing else is touched."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.integration.ray_nodes import LocalCluster

# a stand-in for a Ray worker that hangs on its way out: a process group of its own (so a
# killpg of its node's group misses it), SIGTERM ignored, its parent gone
STRAY = ("import os, signal, subprocess, sys, time; "
         "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; os.setpgid(0, 0); "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); "
         "time.sleep(600)'], stdout=sys.stdout); time.sleep(600)")


def test_stop_ends_a_process_that_left_its_nodes_group_and_spares_others():
    cluster = LocalCluster()
    node = subprocess.Popen([sys.executable, "-c", STRAY], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    cluster.procs.append(node)
    stray = int(node.stdout.readline())
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert psutil.Process(stray).status() != psutil.STATUS_ZOMBIE
        assert set(cluster.leftovers()) == {node.pid, stray}
        t0 = time.monotonic()
        cluster.stop()
        assert not psutil.pid_exists(stray) or psutil.Process(stray).status() == \
            psutil.STATUS_ZOMBIE
        assert cluster.leftovers() == []
        assert bystander.poll() is None  # not of the cluster's sessions: untouched
        assert time.monotonic() - t0 < 15
    finally:
        bystander.kill()
        bystander.wait()

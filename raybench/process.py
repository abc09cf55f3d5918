"""A process over a measured window: CPU time, page faults, time waiting for a core.

Read at a window's edges by a rank's timed loop (rank/loop.py: the row's `host/*` figures) and
by a serving replica over its run (scenarios/llm/host.py: `serve/replica_*`): whether the
process had the CPU the trial assumed, or shared it; for a replica also its busiest thread
(the engine's loop), whose share of the run says whether the engine was bound by its host.
A shared leaf, since both use it. Linux's counters; None where the kernel keeps no such
count.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any


def usage() -> dict[str, Any]:
    """This process's counters at a window's edge: CPU time of it and its finished children
    (DataLoader workers count once they exit; live ones are measured by the OS, not here), its
    minor page faults (heap pages handed back to the OS and touched again: glibc's malloc,
    memory.steady_heap), its threads' time ready to run but waiting for a core (another
    process's work, or more threads than cores), each thread's own times, and the clock."""
    t = os.times()
    threads = thread_times()
    wait = None if threads is None else sum(w for _, w in threads.values())
    return {"cpu": t.user + t.system + t.children_user + t.children_system,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
            "wait": wait, "threads": threads, "wall": time.perf_counter()}


def window_usage(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    """The process's figures over a window from `usage()` at its edges."""
    s = after["wall"] - before["wall"]
    wait = (None if after["wait"] is None or before["wait"] is None
            else 100.0 * max(0.0, after["wait"] - before["wait"]) / s)
    return {"cpu_util_pct": 100.0 * (after["cpu"] - before["cpu"]) / s,
            "minor_faults_per_s": (after["faults"] - before["faults"]) / s,
            "run_wait_pct": wait}


def thread_times() -> dict[int, tuple[float, float]] | None:
    """Each live thread of this process: seconds it ran and seconds it waited for a core
    (Linux schedstat); None where the kernel keeps no such count. A thread that ended
    between two readings takes its times with it: the window's threads are the rank's own."""
    out: dict[int, tuple[float, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ran, waited = f.read().split()[:2]
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[int(tid)] = (int(ran) / 1e9, int(waited) / 1e9)
    return out


def busiest_thread(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float | None]:
    """The thread that ran most over a window, from `usage()` at its edges (one that started
    in it counts from zero; one that ended in it is not seen): its share of the window
    running and waiting for a core. A serving engine's loop is one such thread: near 100%
    running, the engine was bound by its host's CPU (or by the GIL the other threads took),
    not by its device. Where the process shares the GIL with others, what it lost to them
    shows here and not in the process's total: the async Ray actor's event loop and executor
    took 1-3 points of the engine loop's 99% (journal, 2026-12-06)."""
    was, now, seconds = before["threads"], after["threads"], after["wall"] - before["wall"]
    if was is None or now is None or not now or seconds <= 0:
        return {"busiest_thread_pct": None, "busiest_thread_wait_pct": None}

    def since(tid: int, ran: float, waited: float) -> tuple[float, float]:
        ran0, waited0 = was.get(tid, (0.0, 0.0))
        return ran - ran0, waited - waited0
    run_s, wait_s = max(since(t, r, w) for t, (r, w) in now.items())
    return {"busiest_thread_pct": 100.0 * run_s / seconds,
            "busiest_thread_wait_pct": 100.0 * max(0.0, wait_s) / seconds}

"""A process over a measured window: CPU time, page faults, time waiting for a core.

Read at a window's edges by a rank's timed loop (rank/loop.py: the row's `host/*` figures) and
by a serving replica over its run (scenarios/llm/host.py: `serve/replica_*`): whether the
process had the CPU the trial assumed, or shared it. A shared leaf, since both use it. Linux's
counters; None where the kernel keeps no such count.
"""

from __future__ import annotations

import os
import resource
import time


def usage() -> dict[str, float | None]:
    """This process's counters at a window's edge: CPU time of it and its finished children
    (DataLoader workers count once they exit; live ones are measured by the OS, not here), its
    minor page faults (heap pages handed back to the OS and touched again: glibc's malloc,
    memory.steady_heap), its threads' time ready to run but waiting for a core (another
    process's work, or more threads than cores), and the clock."""
    t = os.times()
    return {"cpu": t.user + t.system + t.children_user + t.children_system,
            "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
            "wait": run_wait_s(), "wall": time.perf_counter()}


def window_usage(before: dict[str, float | None], after: dict[str, float | None]
                 ) -> dict[str, float | None]:
    """The process's figures over a window from `usage()` at its edges."""
    s = after["wall"] - before["wall"]
    wait = (None if after["wait"] is None or before["wait"] is None
            else 100.0 * max(0.0, after["wait"] - before["wait"]) / s)
    return {"cpu_util_pct": 100.0 * (after["cpu"] - before["cpu"]) / s,
            "minor_faults_per_s": (after["faults"] - before["faults"]) / s,
            "run_wait_pct": wait}


def run_wait_s() -> float | None:
    """Seconds this process's threads have spent runnable but not running (Linux schedstat,
    summed over threads; None where the kernel keeps no such count). A thread that ended
    between two readings takes its wait with it: the window's threads are the rank's own."""
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
    except OSError:
        return None
    return total / 1e9

"""Process memory figures that mean what they say.

Owns the peak resident set of the calling process. `getrusage().ru_maxrss` survives `execve`, so a
process started from a big parent (a torch-loaded driver) would report the parent's peak; the
kernel's VmHWM belongs to the current address space only, so it is read first.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def reset_peak_rss() -> bool:
    """Start a new peak: writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS
    (Linux 4.0+), so an in-process trial's peak is its own, not its predecessors'. Freed heap
    that glibc keeps would still count as current RSS, so it is handed back first."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak may include retained heap
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False

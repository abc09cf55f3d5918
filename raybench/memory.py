"""Process memory figures that mean what they say, and a heap that behaves the same in every
process that measures.

Owns the peak resident set of the calling process (`getrusage().ru_maxrss` survives `execve`, so
a process started from a big parent, a torch-loaded driver, would report the parent's peak; the
kernel's VmHWM belongs to the current address space only, so it is read first) and glibc
malloc's thresholds while a trial measures (`steady_heap`).
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
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


# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
# The largest a heap of a thread's arena grows to on 64-bit hosts (HEAP_MAX_SIZE), and the
# highest glibc's own adjustment raises the mmap threshold to (DEFAULT_MMAP_THRESHOLD_MAX):
# larger blocks are still mapped and unmapped on every use, as in any glibc process.
HEAP_MAX_B = 64 * 2**20
MMAP_THRESHOLD_B = 32 * 2**20
TRIM_THRESHOLD_B = 2**31 - 1  # the most mallopt takes (an int): a heap's top is never trimmed
# what a user sets to tune glibc's malloc themselves: then theirs stands
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX")


def steady_heap() -> str:
    """Set glibc malloc so that a trial's steps keep the memory they free for the next step, in
    a fresh process as in one that ran other trials before. Returns what the heap is: "fixed",
    "user" (the environment tunes glibc's malloc: left alone) or "other" (not glibc).

    By default glibc gives memory back to the OS as it is freed, by rules that depend on the
    process's history: the mmap and trim thresholds follow the largest block freed so far, and a
    thread's arena unmaps any of its 64 MB heaps that falls empty. A step's activations then come
    back as new pages, each a fault and a zeroed page: 0 to 46 thousand faults/s in the same
    one-rank ResNet-18 trial by where it ran, up to 200 thousand and 40% of its throughput with
    one threshold set by hand (docs/journal/2026-11.md). All three set keep a heap's pages:
    blocks up to 32 MB from the heap, no trim, and a top pad of a whole heap, which is what
    stops an empty heap from being unmapped (glibc's heap_trim). malloc_trim still hands memory
    back between trials (reset_peak_rss). Any one set alone turns glibc's adjustment off and
    faults more."""
    if platform.libc_ver()[0] != "glibc":
        return "other"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
            k in os.environ for k in _USER_SETTINGS):
        return "user"
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = all(libc.mallopt(param, value) for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_B), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_B),
            (_M_TOP_PAD, HEAP_MAX_B)))
    except (OSError, AttributeError):
        return "other"
    return "fixed" if ok else "other"

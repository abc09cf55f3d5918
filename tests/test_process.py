"""The process counters' leaf (process.py): the busiest thread over a window."""

from __future__ import annotations

import os
import threading
import time

import pytest

from raybench import process


def test_the_busiest_thread_is_the_one_that_ran_most_in_the_window():
    """Constructed counters: a thread that started in the window counts from zero, and the
    figures are that one thread's, not the process's sum."""
    before = {1: (10.0, 1.0), 2: (50.0, 0.0)}
    after = {1: (10.5, 1.1), 2: (50.2, 0.0), 3: (0.9, 0.05)}  # 3 started in the window
    out = process.busiest_thread({"threads": before, "wall": 3.0},
                                 {"threads": after, "wall": 4.0})
    assert out["busiest_thread_pct"] == pytest.approx(90.0)
    assert out["busiest_thread_wait_pct"] == pytest.approx(5.0)
    unknown = process.busiest_thread({"threads": None, "wall": 3.0},
                                     {"threads": after, "wall": 4.0})
    assert unknown["busiest_thread_pct"] is None


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux's per-thread counters")
def test_a_spinning_thread_is_found_among_idle_ones():
    """A thread that spins through a 0.3 s window beside three that sleep and the main thread
    that waits: the busiest thread's time is most of the process's CPU time over the window
    (however busy the machine, since both are CPU time, not wall time)."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    threads.append(threading.Thread(target=spin))
    for t in threads:
        t.start()
    try:
        cpu0, u0 = os.times(), process.usage()
        time.sleep(0.3)
        cpu1, u1 = os.times(), process.usage()
    finally:
        stop.set()
        for t in threads:
            t.join()
    out = process.busiest_thread(u0, u1)
    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    ran = out["busiest_thread_pct"] / 100 * (u1["wall"] - u0["wall"])
    print(out, used)
    assert 0.8 * used - 0.02 <= ran <= used + 0.02  # os.times ticks at 10 ms
    assert 0 <= out["busiest_thread_wait_pct"] <= 100

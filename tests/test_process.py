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
    that waits: the busiest thread's time is most of the process's CPU time over the window,
    the sum of its threads' times at the same two readings (however busy the machine, since
    both are CPU time, not wall time)."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    threads.append(threading.Thread(target=spin))
    for t in threads:
        t.start()
    try:
        u0 = process.usage()
        time.sleep(0.3)
        u1 = process.usage()
    finally:
        stop.set()
        for t in threads:
            t.join()
    out = process.busiest_thread(u0, u1)
    ran = out["busiest_thread_pct"] / 100 * (u1["wall"] - u0["wall"])
    # a clock read apart from the threads' readings is no reference: the spinner holds the
    # GIL, so the main thread's next reading comes up to a switch interval (5 ms) per step
    # later, and os.times or time.process_time read 0.364 s where the spinner ran 0.393 s
    used = sum(r - u0["threads"].get(t, (0.0, 0.0))[0] for t, (r, _) in u1["threads"].items())
    print(out, ran, used)
    assert 0.8 * used - 0.02 <= ran <= used + 0.02
    assert 0 <= out["busiest_thread_wait_pct"] <= 100

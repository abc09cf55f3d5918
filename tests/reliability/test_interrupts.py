"""A signal during a row's writes waits for the row; outside them it stops at once."""

from __future__ import annotations

import os
import signal

import pytest

from raybench import interrupts


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_signal_inside_a_row_waits_for_the_row(handlers):
    written = []
    with pytest.raises(interrupts.Interrupted) as info:
        with interrupts.row_section():
            os.kill(os.getpid(), signal.SIGTERM)
            written.append("table")  # still runs: the row is finished first
            with interrupts.row_section():  # nested writes (history) too
                written.append("history")
            written.append("after")
    assert written == ["table", "history", "after"]
    assert info.value.signum == signal.SIGTERM
    assert interrupts.signal_of(KeyboardInterrupt()) == signal.SIGTERM  # re-raised plainly


def test_signal_outside_a_row_stops_at_once(handlers):
    with pytest.raises(interrupts.Interrupted) as info:
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("not reached")
    assert info.value.signum == signal.SIGINT


@pytest.mark.serial  # the ranks have 15 s to end: alone (one outlived that beside three other tests)
def test_ranks_of_a_killed_local_driver_end_with_it(tmp_path):
    """SIGKILL the driver of a `--runner local` sweep with two ranks: the ranks end too, and
    do not compete with a `--resume` for the cores (issue 41, item 8)."""
    import subprocess
    import sys
    import textwrap
    import time

    import psutil

    from tests.conftest import ROOT, TINY_SWEEP

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(TINY_SWEEP) + f"output: {{root: {tmp_path}}}\n")
    driver = subprocess.Popen(
        [sys.executable, "-m", "raybench.sweep", str(sweep), "--runner", "local", "--set",
         "grid={cpu_workers: [2]}", "--set", "measure.measure_steps=100000"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, ranks = time.monotonic() + 120, []
        while time.monotonic() < deadline and len(ranks) < 2:
            time.sleep(0.1)
            ranks = [p for p in psutil.Process(driver.pid).children() if _spawned(p)]
        assert len(ranks) == 2, "the ranks never started"
        # killed while the ranks still import: before torch's own parent-death signal
        # (SIGINT, which a rank may also catch) is set, the moment the old ranks outlived
    finally:
        driver.kill()
        driver.wait(timeout=60)
    gone, alive = psutil.wait_procs(ranks, timeout=15)
    for p in alive:
        p.kill()
    assert not alive, f"ranks outlived their driver: {[p.pid for p in alive]}"


def _spawned(p) -> bool:
    import psutil

    try:
        return "spawn_main" in " ".join(p.cmdline())
    except psutil.Error:
        return False

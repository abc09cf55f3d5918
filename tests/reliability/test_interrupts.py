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

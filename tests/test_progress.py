"""Progress lines: item i of N, elapsed, an estimate of what remains; a bar on a terminal."""

from __future__ import annotations

import io
import logging

from raybench.progress import Progress, duration


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_estimate_is_the_mean_time_per_item_times_what_is_left(caplog):
    clock = Clock()
    p = Progress(8, "trials", stream=io.StringIO(), clock=clock)
    with caplog.at_level(logging.INFO, logger="raybench.progress"):
        clock.t += 30
        p.advance("trial 0 ok")
        clock.t += 30
        p.advance("trial 1 oom")
    assert caplog.messages == [
        "progress: trials 1/8 (12%), 30 s, about 3 min 30 s left; trial 0 ok",
        "progress: trials 2/8 (25%), 1 min 00 s, about 3 min 00 s left; trial 1 oom"]
    clock.t += 5 * 30 + 10
    p.done = 7
    assert p.line() == "trials 7/8 (88%), 3 min 40 s, about 32 s left"  # (220 - 30) / (7 - 1)


def test_the_first_item_carrying_the_start_is_left_out_of_the_pace_once_a_second_is_done():
    """The default sweep: 16 s to the first row (a worker group's start in it), then 7 s,
    3 s, 4 s. With the first counted, the estimate after the second said 23 s for 7 s."""
    clock = Clock()
    p = Progress(4, "trials", stream=io.StringIO(), clock=clock)
    clock.t += 16
    p.advance()
    assert p.line().endswith("about 48 s left")  # nothing better known yet
    clock.t += 7
    p.advance()
    assert p.line().endswith("about 14 s left")
    clock.t += 3
    p.advance()
    assert p.line().endswith("about 5 s left")


def test_a_terminal_gets_one_bar_redrawn_in_place_and_ended_with_a_newline():
    clock, tty = Clock(), Tty()
    p = Progress(2, "strips", stream=tty, clock=clock)
    clock.t += 5
    p.advance("0/1 scenes, 40 chips")
    clock.t += 5
    p.advance("1/1 scenes, 75 chips")
    out = tty.getvalue()
    assert out.count("\r\033[K") == 2 and out.endswith("\n") and out.count("\n") == 1
    assert "[############------------] strips 1/2 (50%), 5 s, about 5 s left; 0/1 scenes" in out
    assert "[########################] strips 2/2 (100%), 10 s; 1/1 scenes, 75 chips" in out


def test_open_ended_work_counts_without_an_estimate():
    clock = Clock()
    p = Progress(None, "probes", stream=io.StringIO(), clock=clock)
    clock.t += 3725
    p.done = 3
    assert p.line("trial 5 ok") == "probes 3, 1 h 02 min; trial 5 ok"
    assert duration(59.6) == "1 min 00 s"


def test_finished_trials_stay_as_lines_above_the_bar_on_a_terminal():
    clock, tty = Clock(), Tty()
    p = Progress(2, "trials", stream=tty, clock=clock)
    clock.t += 5
    p.advance("trial 0 abc: ok, 10.0 samples/s", keep=True)
    clock.t += 5
    p.advance("trial 1 def: oom (out of memory)", keep=True)
    shown = [line.rsplit("\r\033[K", 1)[-1] for line in tty.getvalue().split("\n")]
    assert shown == ["trial 0 abc: ok, 10.0 samples/s", "trial 1 def: oom (out of memory)",
                     "[########################] trials 2/2 (100%), 10 s", ""]

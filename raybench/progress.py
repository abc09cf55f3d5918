"""Progress of long work: item i of N, elapsed time and an estimate of what remains.

On a terminal (stderr is a TTY) one bar redrawn in place; otherwise (CI, `ray job submit`,
a file) a plain log line per item. The estimate is the mean time per finished item times the
items left, the first item left out once a second has finished: the first carries the start of
everything (Ray's workers, a shared worker group's start: 10 of the default sweep's first 16 s),
and counted in the mean it doubled the default sweep's estimate. With items of different sizes
it is a guide, not a promise. Owns no figures: rows, not progress lines, carry the numbers.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

log = logging.getLogger(__name__)
BAR = 24


def duration(seconds: float) -> str:
    """1 h 02 min, 3 min 05 s, 42 s."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


class Progress:
    def __init__(self, total: int | None, what: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.what, self.done = total, what, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.start = clock()
        self.first_done: float | None = None  # when the first item finished

    def line(self, detail: str = "") -> str:
        now = self.clock()
        elapsed = now - self.start
        if self.total:
            pct = 100 * self.done / self.total
            text = f"{self.what} {self.done}/{self.total} ({pct:.0f}%), {duration(elapsed)}"
            left = self.total - self.done
            if self.done and left:
                text += f", about {duration(self._per_item(now) * left)} left"
        else:  # open-ended (a search decides how many probes it needs)
            text = f"{self.what} {self.done}, {duration(elapsed)}"
        return text + (f"; {detail}" if detail else "")

    def _per_item(self, now: float) -> float:
        if self.first_done is None or self.done < 2:
            return (now - self.start) / self.done
        return (now - self.first_done) / (self.done - 1)

    def advance(self, detail: str = "", n: int = 1, keep: bool = False) -> None:
        """`keep`: on a terminal the detail (a finished trial) stays as a line of its own
        above the bar, rather than being redrawn over by the next."""
        if self.done == 0 and n == 1:
            self.first_done = self.clock()
        self.done += n
        text = self.line(detail)
        if not self.tty:
            log.info("progress: %s", text)
            return
        if keep and detail:
            self.stream.write(f"\r\033[K{detail}\n")
            text = self.line()
        filled = round(BAR * self.done / self.total) if self.total else 0
        bar = f"[{'#' * filled}{'-' * (BAR - filled)}] " if self.total else ""
        end = "\n" if self.total and self.done >= self.total else ""
        self.stream.write(f"\r\033[K{bar}{text}{end}")
        self.stream.flush()

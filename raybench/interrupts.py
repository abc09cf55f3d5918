"""Ctrl-C and SIGTERM during a sweep: stop cleanly between rows, never inside one.

Owns the driver's handlers for SIGINT and SIGTERM. A signal raises `Interrupted` in the main
thread, except while a row is being written (`row_section`): then it waits until the row, its
trial file and its history entry are all on disk, so an interrupted sweep holds whole rows only
and `--resume` reruns exactly the trials without one. Tune's own SIGINT handler is turned off
(it would end the run as if it had finished, and the sweep would record the unrun trials as lost).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_depth = 0
_pending: int | None = None
received: int | None = None  # the last signal: Ray's wait() re-raises ours as a plain
# KeyboardInterrupt, so the catcher reads the signal from here


def install() -> None:
    """Route SIGINT and SIGTERM to `Interrupted` (main thread only, as Python requires)."""
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def _handler(signum: int, frame: object) -> None:
    global _pending, received
    received = signum
    if _depth:
        _pending = signum  # raised when the row in progress is whole
        return
    raise Interrupted(signum)


def signal_of(exc: KeyboardInterrupt) -> int:
    """The signal behind an interrupt, however it was re-raised on the way up."""
    return getattr(exc, "signum", None) or received or signal.SIGINT


@contextlib.contextmanager
def row_section() -> Iterator[None]:
    """Defer an interrupt until the enclosed writes are done."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum)

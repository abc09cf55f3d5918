"""One FIFO queue in front of replicas that answer calls, each replica served by a thread of
its own: what raybench's Server runs and LoadGen's SUT (scenarios/loadgen.py) send queries
through.

Owns the queue, the threads and their stop; not the arrivals, the latencies or the verdict
(server.py), nor what a call is (a replica in this process, or a Ray actor's method waited on
with `ray.get`: scenarios/run.py). A free replica's thread takes the oldest waiting query and
up to max_batch - 1 more already waiting, calls, stamps the end, and takes the next at once:
no event loop between a query's arrival and its replica, none between two calls. With an
asyncio worker per replica and the calls on executor threads, each query took two wake-ups
more (the loop's and the executor's): 0.65 ms per query at the median on a 2 ms replica here,
and as a queue's server that time adds to every query behind it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

# A replica's call: the sample indices of its queries -> the replica's record of the call
Serve = Callable[[list[int]], dict[str, Any]]
_STOP = object()
_PR_SET_TIMERSLACK = 29  # linux/prctl.h


def fine_timers() -> None:
    """This thread's sleeps end as close to their deadline as the kernel can: Linux lets a
    thread's timer fire up to its timer slack late (50 us by default), which an arrival
    schedule would count as latency. With a slack of 1 ns a 3 ms sleep overshot by 0.074 ms
    at the median here, against 0.124 ms. Elsewhere (or where prctl is refused) a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclasses.dataclass(frozen=True)
class CallEnd:
    """What the dispatcher tells of a call as it ends, on the replica's thread (monotonic
    stamps): its items, the replica's record (None: it raised `error`), when the thread took
    its first item and when the call returned, and since when the replica had been free (its
    previous call's end, or its thread's start): a query that arrived after that waited
    `start - max(arrival, free_since)` for the hand-off alone."""

    items: list[Any]
    record: dict[str, Any] | None
    start: float
    end: float
    free_since: float
    error: BaseException | None = None


Done = Callable[[CallEnd], None]


class Fifo:
    """Items put in arrival order; `index_of(item)` is the sample index a call is given."""

    def __init__(self, serves: Sequence[Serve], max_batch: int, done: Done,
                 index_of: Callable[[Any], int] = lambda item: item):
        self.max_batch, self.done, self.index_of = max_batch, done, index_of
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.halted = threading.Event()
        self.threads = [threading.Thread(target=self._serve, args=(s,), daemon=True,
                                         name=f"raybench-replica{i}")
                        for i, s in enumerate(serves)]

    def __enter__(self) -> Fifo:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def put(self, item: Any) -> None:
        self.queue.put(item)

    def stop(self, timeout_s: float = 30.0) -> list[str]:
        """Take no more queries (those waiting are dropped), let calls in progress end, and
        wait for the threads up to `timeout_s`; the names of those still in a call after it
        (a replica that never answers: its thread is a daemon, left behind)."""
        self.halted.set()
        for _ in self.threads:
            self.queue.put(_STOP)
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def _serve(self, serve: Serve) -> None:
        free_since = time.monotonic()
        while True:
            item = self.queue.get()
            picked = time.monotonic()
            if item is _STOP or self.halted.is_set():
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    self.queue.put(_STOP)  # another thread's, or ours on the next turn
                    break
                batch.append(more)
            try:
                record = serve([self.index_of(x) for x in batch])
            except Exception as e:  # told, and the next query tried: the caller decides
                record, error = None, e
            else:
                error = None
            end = time.monotonic()
            self.done(CallEnd(batch, record, picked, end, free_since, error))
            free_since = end

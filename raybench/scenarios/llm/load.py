"""The client side of LLM serving: requests sent to the replicas, every token stamped on the
client's clock as it arrives.

Three loads, as vLLM's `bench serve` and MLPerf run them: Offline (every request at once: the
engines take them as fast as they can), Server (Poisson arrivals at a rate; the search in
scenarios/rate_search.search_rate finds the highest rate whose TTFT and TPOT percentiles meet their
limits), and closed-loop users (each user sends its next request when its last one ends:
concurrency 1, 2, 4, ... draws the throughput against speed-per-user curve). A request goes to
the replica with the fewest requests in flight (ties: the one sent fewest), as a serving
router does. Latency runs from the request's scheduled arrival, so a sender that falls behind
cannot hide queueing.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raybench.scenarios import dispatch, mlperf
from raybench.scenarios.server import SWITCH_INTERVAL_S

WATCH_S = 0.02  # how often a Server probe counts its late first tokens


@dataclass
class Replica:
    """One replica as the client sees it (scenarios/llm/host.EngineHost, in-process or behind
    a Ray actor): queue a request, the stream of every request's progress, end that stream,
    stop requests."""

    submit: Callable[[str, list[int], int], Awaitable[None]]
    events: Callable[[], AsyncIterator[list[tuple]]]
    end: Callable[[], Awaitable[None]]
    cancel: Callable[[list[str]], Awaitable[None]]


CANCELLED = "cancelled: its Server probe had already failed"
FAILED = "the engine failed the request"


@dataclass
class Load:
    """What to send: `count` requests of these lengths; arrival offsets (Offline: zeros;
    Server: Poisson) or `users` closed-loop users."""

    count: int
    sizes: np.ndarray  # (count, 2): each request's input and output tokens
    prompt: Callable[[int, int], list[int]]  # request k's prompt of n tokens
    arrivals: np.ndarray | None = None
    users: int | None = None
    ttft_bound_s: float | None = None  # a Server probe stops once its TTFT cannot pass
    percentile: float = 99.0
    early_stopping: bool = True  # the rule it must pass (mlperf.late_allowed)
    tag: str = "r"


def run_sync(replicas: Sequence[Replica], load: Load, limit_s: float) -> dict[str, Any]:
    """`run` on an event loop of its own, with the interpreter's thread hand-over at 1 ms
    (server.SWITCH_INTERVAL_S: in-process engines' threads would otherwise hold the GIL for up
    to 5 ms while a token's stamp waits); a run past `limit_s` raises TimeoutError."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return asyncio.run(asyncio.wait_for(run(replicas, load), limit_s))
    finally:
        sys.setswitchinterval(previous)


async def run(replicas: Sequence[Replica], load: Load) -> dict[str, Any]:
    """Send the load; returns each request's record and whether the run stopped early."""
    inflight = [0] * len(replicas)
    sent = [0] * len(replicas)
    records: list[dict[str, Any]] = []
    outstanding: dict[str, tuple[int, dict[str, Any], asyncio.Event]] = {}
    # the Server probe's late first tokens, kept as they come rather than counted over every
    # request each watch: those that came late, and the requests still without a first token
    # (a failed one stays there, as late as time makes it)
    late_first = 0
    unstamped: dict[int, dict[str, Any]] = {}

    async def listen(i: int) -> None:
        """Replica i's progress, stamped as each item arrives; a stream that breaks fails
        the replica's requests still running."""
        try:
            await _listen(i)
        except Exception as e:
            for _, rec, done in [v for v in outstanding.values() if v[0] == i]:
                rec["error"] = f"{type(e).__name__}: {e}"
                done.set()

    async def _listen(i: int) -> None:
        nonlocal late_first
        async for batch in replicas[i].events():
            now = time.monotonic()
            for rid, count, stamp, finished, ids in batch:
                entry = outstanding.get(rid)
                if entry is None:  # a request already given up
                    continue
                _, rec, done = entry
                if count < 0:
                    rec["error"] = CANCELLED if count == -2 else FAILED
                else:
                    new = count - len(rec["engine_stamps"])
                    if new and not rec["stamps"] and unstamped.pop(rec["index"], None) and \
                            load.ttft_bound_s is not None and \
                            now - rec["arrival"] > load.ttft_bound_s:
                        late_first += 1
                    rec["engine_stamps"] += [stamp] * new
                    rec["stamps"] += [now] * new
                if ids is not None:
                    rec["tokens"] = ids
                if finished or count < 0:
                    done.set()

    async def one(k: int, arrival: float) -> None:
        i = min(range(len(replicas)), key=lambda j: (inflight[j], sent[j]))
        inflight[i] += 1
        sent[i] += 1
        rid = f"{load.tag}-{k}"
        n_in, n_out = (int(x) for x in load.sizes[k])
        rec: dict[str, Any] = {"index": k, "replica": i, "arrival": arrival,
                               "input_tokens": n_in, "output_tokens": n_out, "stamps": [],
                               "engine_stamps": [], "error": None, "tokens": None}
        records.append(rec)
        unstamped[k] = rec
        done = asyncio.Event()
        outstanding[rid] = (i, rec, done)
        try:
            await replicas[i].submit(rid, load.prompt(k, n_in), n_out)
            await done.wait()
        except Exception as e:  # a replica that fails fails its requests, not the client
            rec["error"] = f"{type(e).__name__}: {e}"
        finally:
            inflight[i] -= 1
            outstanding.pop(rid, None)

    listeners = [asyncio.ensure_future(listen(i)) for i in range(len(replicas))]
    t0 = time.monotonic() + 0.01
    tasks: list[asyncio.Task] = []
    running: set[asyncio.Task] = set()  # what the watch below waits for, without a scan

    def track(task: asyncio.Task) -> asyncio.Task:
        tasks.append(task)
        running.add(task)
        task.add_done_callback(running.discard)
        return task
    if load.users:
        counter = itertools.count()

        async def user() -> None:
            while (k := next(counter)) < load.count:
                await one(k, time.monotonic())

        for _ in range(min(load.users, load.count)):
            track(asyncio.ensure_future(user()))
        sender = None
    else:
        arrivals = load.arrivals if load.arrivals is not None else np.zeros(load.count)
        loop = asyncio.get_running_loop()
        halt = threading.Event()
        issued = asyncio.Event()

        def start(k: int) -> None:
            track(asyncio.ensure_future(one(k, t0 + float(arrivals[k]))))

        def issue() -> None:
            # A thread, not a coroutine: the event loop's timers wake up to 1 ms late (epoll's
            # millisecond timeout), which would show as time to first token; time.sleep is
            # finer (scenarios/server.py does the same)
            dispatch.fine_timers()
            for k, at in enumerate(arrivals):
                delay = t0 + at - time.monotonic()
                if delay > 0 and halt.wait(delay):
                    return
                loop.call_soon_threadsafe(start, k)
            loop.call_soon_threadsafe(issued.set)

        issuer = threading.Thread(target=issue, name="raybench-arrivals", daemon=True)
        issuer.start()
        sender = asyncio.ensure_future(issued.wait())

    stopped = False
    if load.ttft_bound_s is not None:
        allowed = mlperf.stop_after(load.count, load.percentile, load.early_stopping)
        while not (sender is None or sender.done()) or running:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            late = late_first + sum(1 for r in unstamped.values()
                                    if now - r["arrival"] > load.ttft_bound_s)
            if late > allowed:  # the rest cannot change the verdict
                stopped = True
                break
    if stopped:
        if sender is not None:
            halt.set()
            sender.cancel()
        by_replica: dict[int, list[str]] = {}
        for rid, (i, _, _) in list(outstanding.items()):
            by_replica.setdefault(i, []).append(rid)
        await asyncio.gather(*(replicas[i].cancel(rids) for i, rids in by_replica.items()))
    if sender is not None:
        await asyncio.gather(sender, return_exceptions=True)
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(r.end() for r in replicas))
    await asyncio.gather(*listeners, return_exceptions=True)
    run_s = float(load.arrivals[-1]) if load.arrivals is not None and len(load.arrivals) else None
    return {"records": sorted(records, key=lambda r: r["index"]), "stopped_early": stopped,
            "run_s": run_s}

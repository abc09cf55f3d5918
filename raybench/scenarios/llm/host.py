"""One serving replica: a `Generative` workload's engine on its device, warmed up, its tokens
checked against the fp32 reference, each request's tokens streamed to whoever asked.

The same object runs in a thread of this process (the local runner) and inside a threaded Ray
actor (one per replica, its GPU its own); it imports no Ray. `events` is an async generator
of every request's progress: in-process the client iterates it on its own event loop; through
Ray `stream`, the same for a thread, is the actor's streaming method, each item an object the
client awaits. An item holds what all requests made since the last one (with the engine's
stamp of each token count), so the way back costs an object per engine step, whatever the
number of requests: with one stream per request, tiny Llama's 16 users through Ray on 2 cores
got 0.68 of the in-process tokens/s.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import torch

from raybench import process, telemetry, workloads
from raybench.context import WorkerContext, check_env
from raybench.memory import peak_rss_mb, steady_heap
from raybench.scenarios.llm import lengths
from raybench.trials import TrialSpec

# The KV cache's use is read on the engine's own thread as it hands out tokens, at most this
# often: a reader thread of its own woke every 50 ms, and a closed loop of 9 tiny-Llama
# requests (about 60 ms) got one reading, 0 whenever it fell before the first allocation.
KV_SAMPLE_S = 0.05
# The event stream sends at most an item a millisecond, what came meanwhile joined to it: a
# token's stamp is then at most that late, and Ray carries at most a thousand objects a second
# a replica. With an item per wake-up, 16 slots of fixed_tokens each making a token every 2 ms
# (7,500 tokens/s) reached the client at 0.83 of in-process through Ray (TTFT +9.9 ms p50);
# with this, 0.91 (+4.8 ms); tiny Llama at 16 users 0.73 against 0.68 (docs/performance.md).
EVENTS_EVERY_S = 1e-3
# prompts of the warmup and of the accuracy check: indices no scenario sends
WARMUP_INDEX, ACCURACY_INDEX = 2 * 10**9, 10**9


def slots(trial: TrialSpec) -> int:
    """Requests a replica may hold at once: what its engine is sized for."""
    inf = trial.inference
    if inf.scenario == "concurrency":
        return max(1, -(-(inf.concurrency or 1) // inf.replicas))
    return max(1, min(256, -(-inf.samples // inf.replicas)))


class EngineHost:
    def __init__(self, trial: TrialSpec, index: int = 0, device: torch.device | None = None,
                 node: str | None = None, logical_gpus: bool = False):
        start = time.perf_counter()
        check_env(trial.hardware.env)
        steady_heap()
        self.trial, self.index = trial, index
        self.node = node or socket.gethostname()
        if device is None:  # under Ray the replica's one GPU is cuda:0 (CUDA_VISIBLE_DEVICES)
            gpu = trial.hardware.use_gpu and not logical_gpus
            device = torch.device("cuda", 0) if gpu else torch.device("cpu")
        self.device = device
        self.cls = workloads.get(trial.workload_name)
        ctx = WorkerContext.single(trial.hardware, device)
        ctx.set_math_mode()
        self.workload = self.cls(trial.workload, ctx)
        self.workload.setup_serving()
        inf = trial.inference
        n_in, n_out = lengths.typical(inf)
        self.check_s = 0.0  # the accuracy check's time, kept out of the start-up time
        self.matches = self.compared = 0
        prompts, reference = [], None
        if inf.accuracy_target is not None:
            # the fp32 reference first: a GPU engine then gives its KV cache most of the
            # memory left (transformers: 90% of it), where a second copy would not fit
            began = time.perf_counter()
            prompts = [self.cls.prompt(trial.workload, ACCURACY_INDEX + i, n_in)
                       for i in range(inf.accuracy_samples)]
            reference = self.workload.reference_tokens(prompts, n_out)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            self.check_s += time.perf_counter() - began
        self.engine = self.workload.engine(slots(trial), lengths.longest(inf))
        try:
            self._start(prompts, reference, n_in, n_out)
        except BaseException:
            # the engine's threads may keep a process alive (transformers' loop is not a
            # daemon): a replica that fails to start stops them before it says so
            self.close()
            raise
        self.setup_s = time.perf_counter() - start - self.check_s

    def _start(self, prompts: list[list[int]], reference: list[list[int]] | None, n_in: int,
               n_out: int) -> None:
        """What follows the engine's start: the stream's and samplers' state, the warmup
        requests, the accuracy check."""
        trial, device, inf = self.trial, self.device, self.trial.inference
        self.outbox: list[tuple] = []
        self.lock = threading.Lock()
        self.waking = False
        self.wake: Callable[[], None] | None = None  # the reader's: `events` or `stream`
        self.ended = False
        self.kv: list[float] = []
        self.kv_at = -np.inf  # when the KV cache's use was last read
        self.usage = process.usage()  # this process's counters; taken again as a run starts
        self.sampling = False
        self.nvml = telemetry.open_sampler(device.index or 0) if device.type == "cuda" \
            else None
        warm = [self.cls.prompt(trial.workload, WARMUP_INDEX + i, n_in)
                for i in range(min(slots(trial), 8))]
        self.warmup_s = [self.run_together(warm, n_out)[1] for _ in range(inf.warmup_batches)]
        if reference is not None:
            began = time.perf_counter()
            self._compare(prompts, reference, n_out)
            self.check_s += time.perf_counter() - began
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def run_together(self, prompts: list[list[int]], n: int) -> tuple[list[list[int]], float]:
        """Every prompt at once, waiting for all: their tokens and the seconds it took."""
        done = threading.Semaphore(0)
        tokens: dict[str, list[int]] = {}

        def emit(rid: str, count: int, finished: bool, stamp: float, ids: list[int] | None):
            if finished:
                tokens[rid] = ids or []
                done.release()

        began = time.perf_counter()
        for i, p in enumerate(prompts):
            self.engine.submit(f"warm{self.index}-{i}-{began}", p, n, emit)
        for _ in prompts:
            if not done.acquire(timeout=600):
                raise TimeoutError("the engine did not finish its warmup requests in 600 s")
        took = time.perf_counter() - began
        return [tokens[k] for k in sorted(tokens, key=lambda k: int(k.split("-")[1]))], took

    def _compare(self, prompts: list[list[int]], reference: list[list[int]], n: int) -> None:
        """Greedy tokens served in the trial's precision against the fp32 reference of the
        same weights, position by position."""
        served, _ = self.run_together(prompts, n)
        for s, r in zip(served, reference, strict=True):
            self.matches += int(np.sum(np.asarray(s[:len(r)]) == np.asarray(r[:len(s)])))
            self.compared += len(r)

    def _sample_kv(self) -> None:
        """The KV cache's use now, at most every KV_SAMPLE_S, while a run is measured: called
        as the engine hands out tokens, so with requests holding their blocks."""
        now = time.monotonic()
        if self.sampling and now - self.kv_at >= KV_SAMPLE_S:
            self.kv_at = now
            use = self.engine.kv_use()
            if use is not None:
                self.kv.append(use)

    def measure(self, on: bool) -> dict[str, Any]:
        """Start (or stop and return) a run's samples: the KV cache's use, this process's CPU
        time and its threads' wait for a core, and on a GPU the NVML window's energy
        (telemetry.py: empty without NVML or under a second)."""
        if on:
            self.kv, self.kv_at = [], -np.inf
            self.sampling = True
            self.usage = process.usage()
            if self.nvml is not None:
                self.nvml.samples = []
                self.nvml.start()
            return {}
        self.sampling = False
        gpu = telemetry.aggregate(self.nvml.stop(), 1) if self.nvml is not None else {}
        now = process.usage()
        used = process.window_usage(self.usage, now)
        return {"kv": list(self.kv), "energy_j": gpu.get("energy_j"),
                "power_mean_w": gpu.get("power_mean_w"), "cpu_util_pct": used["cpu_util_pct"],
                "run_wait_pct": used["run_wait_pct"], **process.busiest_thread(self.usage, now)}

    def submit(self, rid: str, prompt: list[int], n: int) -> None:
        """Queue a request; its progress comes out of `events`."""
        self.engine.submit(rid, prompt, n, self._emit)

    def _emit(self, rid: str, count: int, finished: bool, stamp: float,
              ids: list[int] | None) -> None:
        # the engine's thread: one wake-up of the events loop per batch, not per token
        if count > 0 and not finished:
            self._sample_kv()
        with self.lock:
            self.outbox.append((rid, count, stamp, finished, ids))
            wake = self.wake if not self.waking else None
            self.waking = True
        if wake is not None:
            try:
                wake()
            except RuntimeError:  # its event loop closed meanwhile: the next reader takes it
                pass

    def _attach(self, wake: Callable[[], None]) -> bool:
        """A reader starts with this wake-up; True: something already waits for it (what
        came before it, or an `end` that did)."""
        self.wake = wake
        return bool(self.outbox) or self.ended

    @staticmethod
    def _gap(last: float) -> float:
        # at most one item a millisecond: what comes meanwhile joins it
        return EVENTS_EVERY_S - (time.monotonic() - last)

    def _collect(self) -> tuple[list[tuple], bool, float]:
        """What came since the last item, whether the reader is to end after it (read first,
        so that what came before an `end` is in this item), and the time."""
        ended = self.ended
        with self.lock:
            batch, self.outbox, self.waking = self.outbox, [], False
        return batch, ended, time.monotonic()

    def _unwake(self, wake: Callable[[], None]) -> None:
        # The reader ended: its `end` is spent (one that came before the reader started
        # still ends it: a threaded actor may run the two calls in either order), and a token
        # after it waits for the next reader (waking a closed event loop would raise on the
        # engine's thread).
        with self.lock:
            if self.wake is wake:
                self.wake, self.waking, self.ended = None, False, False

    async def events(self) -> AsyncIterator[list[tuple]]:
        """Every request's progress since the last item, as it comes: (request id, tokens so
        far, the engine's stamp, finished, the token ids at the end); a count of -1: the
        engine failed it, -2: cancelled. Ends after `end`. One stream for all requests, so a
        replica behind Ray sends an object per engine step, not one per request and step.
        Read on the client's event loop (in-process); `stream` is the same for a thread."""
        loop, ready = asyncio.get_running_loop(), asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(ready.set)
        if self._attach(wake):
            ready.set()
        last, ended = 0.0, False
        try:
            while not ended:
                await ready.wait()
                ready.clear()
                if (gap := self._gap(last)) > 0:
                    await asyncio.sleep(gap)
                batch, ended, last = self._collect()
                if batch:
                    yield batch
        finally:
            self._unwake(wake)

    def stream(self) -> Iterator[list[tuple]]:
        """`events` for a thread that may block: a threaded Ray actor's streaming method,
        which hands each item to Ray from that one thread. An async actor's generator took
        its event loop and an executor thread per item, each wanting the GIL the engine's
        own Python needs: about 1.8% of a core at 20 items a second against 1.3% (journal)."""
        ready = threading.Event()
        wake = ready.set  # one bound method: `_unwake` knows its own reader by identity
        if self._attach(wake):
            ready.set()
        last, ended = 0.0, False
        try:
            while not ended:
                ready.wait()
                ready.clear()
                if (gap := self._gap(last)) > 0:
                    time.sleep(gap)
                batch, ended, last = self._collect()
                if batch:
                    yield batch
        finally:
            self._unwake(wake)

    def end(self) -> None:
        self.ended = True
        if self.wake is not None:
            self.wake()

    def cancel(self, rids: list[str]) -> None:
        """Stop these requests (a failed Server probe): the engine drops them, and each ends
        with a cancellation in `events`."""
        for rid in rids:
            self.engine.cancel(rid)
            self._emit(rid, -2, True, time.monotonic(), None)

    def stats(self) -> dict[str, Any]:
        cuda = self.device.type == "cuda"
        return {
            "replica": self.index, "node": self.node, "pid": os.getpid(),
            "setup_s": self.setup_s,
            "warmup_service_s": float(np.min(self.warmup_s)) if self.warmup_s else None,
            "warmup_requests": min(slots(self.trial), 8),
            "device_name": torch.cuda.get_device_name(self.device) if cuda else "cpu",
            "peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20
            if cuda else None,
            "rss_peak_mb": peak_rss_mb(), "flops_per_sample": None,
            "accuracy_check_s": self.check_s, "matches": self.matches,
            "compared": self.compared, "engine": self.engine.facts(), "score": None,
        }

    def close(self) -> None:
        self.engine.close()

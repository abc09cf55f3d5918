"""A token generator with known times: the calibration load for the LLM serving scenarios.

Its engine serves up to `slots` requests at once, each on a slot of its own: a request waits in
one FIFO queue for a free slot, its first token comes `prefill_ms` (plus `prefill_ms_per_token`
per prompt token) after it takes the slot, and each further token `token_ms` after the one
before, whatever the other slots do. So theory says what the scenarios must measure: time to
first token is the queue's wait plus the prefill, time per output token is `token_ms`, the
Offline rate is slots x output tokens / the request's service time, and the Server limit is an
M/D/c queue's (the tests replay its exact path). It does no work: its slots sleep to absolute
deadlines, so a late wake-up does not add up over a request's tokens.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from pydantic import Field

from raybench.workloads import Emit, Generative, TokenEngine, WorkloadParams, register


class FixedTokensParams(WorkloadParams):
    batch_size: int = Field(1, ge=1, description="unused: requests are batched by the engine")
    slots: int = Field(4, ge=1, description="requests the engine serves at once")
    prefill_ms: float = Field(20.0, ge=0, description="first token's time after a request "
                              "takes a slot")
    prefill_ms_per_token: float = Field(0.0, ge=0, description="added per prompt token")
    token_ms: float = Field(5.0, ge=0, description="time of every token after the first")
    max_positions: int = Field(4096, ge=2, description="longest prompt plus output")


class SlotEngine(TokenEngine):
    def __init__(self, params: FixedTokensParams):
        self.params = params
        self.waiting: queue.Queue[tuple[str, list[int], int, Emit] | None] = queue.Queue()
        self.busy = 0
        self.cancelled: set[str] = set()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._slot, name=f"raybench-slot{i}",
                                         daemon=True) for i in range(params.slots)]
        for t in self.threads:
            t.start()

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int,
               emit: Emit) -> None:
        self.waiting.put((request_id, prompt, max_new_tokens, emit))

    def _slot(self) -> None:
        p = self.params
        while (job := self.waiting.get()) is not None:
            rid, prompt, n, emit = job
            with self.lock:
                if rid in self.cancelled:
                    continue
                self.busy += 1
            start = time.monotonic()
            first = start + (p.prefill_ms + p.prefill_ms_per_token * len(prompt)) / 1e3
            for k in range(n):
                delay = first + k * p.token_ms / 1e3 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if rid in self.cancelled:
                    break
                done = k == n - 1
                emit(rid, k + 1, done, time.monotonic(), [0] * n if done else None)
            with self.lock:
                self.busy -= 1

    def cancel(self, request_id: str) -> None:
        with self.lock:
            self.cancelled.add(request_id)

    def kv_use(self) -> float | None:
        return self.busy / self.params.slots  # a slot stands for its share of the cache

    def facts(self) -> dict[str, Any]:
        return {"slots": self.params.slots}

    def close(self) -> None:
        for _ in self.threads:
            self.waiting.put(None)


@register
class FixedTokens(Generative):
    name = "fixed_tokens"
    Params = FixedTokensParams
    params: FixedTokensParams

    def setup(self) -> None:
        self._model = torch.nn.Identity()

    def batches(self) -> Iterator[Any]:
        raise TypeError("fixed_tokens is a serving load: give the sweep an inference: section")

    def to_device(self, batch: Any) -> Any:
        return batch

    def step(self, batch: Any) -> None:
        return None

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def trains(self) -> bool:
        return False

    @classmethod
    def max_positions(cls, params: FixedTokensParams) -> int | None:
        return params.max_positions

    def engine(self, slots: int, max_tokens: int) -> TokenEngine:
        return SlotEngine(self.params)

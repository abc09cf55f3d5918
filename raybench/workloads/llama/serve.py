"""Serving a Llama preset: transformers' continuous batching (its `ContinuousBatchingManager`:
a paged KV cache, requests joining and leaving the running batch at every step) as a
`TokenEngine`, and the fp32 greedy reference the accuracy gate compares its tokens with.

Why transformers' engine: vLLM and SGLang are not on the lent GPU image and cannot be brought
there (their wheels are hundreds of megabytes), and transformers' manager serves the same
`LlamaForCausalLM` the training workload builds, on CPU too; 5.17 (the GPU image) and 5.24
(here) have the same calls used below. It is not vLLM: its figures are transformers'.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation import ContinuousBatchingConfig

from raybench.workloads import Emit, TokenEngine
from raybench.workloads.llama.layout import materialize
from raybench.workloads.llama.shape import build

DTYPES = {"bf16": torch.bfloat16, "amp_fp16": torch.float16}


def model(shape: dict[str, Any], device: torch.device, seed: int, precision: str
          ) -> torch.nn.Module:
    """The preset's weights (the training workload's seeded initialisation, whole on one
    device) in the trial's precision, for inference."""
    with torch.device("meta"):
        net = build(shape)
    materialize(net, device, seed, std=0.02)
    net.config.use_cache = True
    return net.to(DTYPES.get(precision, torch.float32)).eval()


class ContinuousBatching(TokenEngine):
    """transformers' manager with a thread of ours routing its streamed outputs: each output
    holds the request's tokens so far, so a request's `emit` gets the count, not a delta."""

    def __init__(self, net: torch.nn.Module, slots: int, max_tokens: int,
                 page_tokens: int | None = None, max_batch_tokens: int | None = None):
        cb: dict[str, Any] = {}
        if net.device.type != "cuda":
            # sized by GPU memory where none is: give the cache what `slots` requests need
            page = page_tokens or 256
            cb["num_blocks"] = slots * math.ceil(max_tokens / page) + slots
            cb["max_batch_tokens"] = max_batch_tokens or max(256, min(4096, slots * 64))
        elif max_batch_tokens:
            cb["max_batch_tokens"] = max_batch_tokens
        self.config = cb
        gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                               max_new_tokens=max_tokens)
        self.manager = net.init_continuous_batching(
            generation_config=gen, continuous_batching_config=ContinuousBatchingConfig(**cb))
        self.emits: dict[str, Emit] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        with torch.inference_mode():  # the manager runs its loop in the caller's mode
            self.manager.start()
        self.router = threading.Thread(target=self._route, name="raybench-cb-router",
                                       daemon=True)
        self.router.start()

    def submit(self, request_id: str, prompt: list[int], max_new_tokens: int,
               emit: Emit) -> None:
        with self.lock:
            self.emits[request_id] = emit
        self.manager.add_request(prompt, request_id=request_id, max_new_tokens=max_new_tokens,
                                 streaming=True)

    def cancel(self, request_id: str) -> None:
        with self.lock:
            self.emits.pop(request_id, None)
        self.manager.cancel_request(request_id)

    def _route(self) -> None:
        while not self.stopping.is_set():
            out = self.manager.get_result(timeout=0.05)
            if out is None:
                if not self.manager.is_running():  # its loop died: end every request now
                    self._fail_all()
                    return
                continue
            now = time.monotonic()
            done = out.is_finished()
            with self.lock:  # a cancelled request's last output finds no one
                emit = self.emits.pop(out.request_id, None) if done else \
                    self.emits.get(out.request_id)
            if emit is None:
                continue
            if out.error:
                emit(out.request_id, -1, True, now, None)  # the scenario records the failure
                continue
            emit(out.request_id, len(out.generated_tokens), done, now,
                 list(out.generated_tokens) if done else None)

    def _fail_all(self) -> None:
        with self.lock:
            emits, self.emits = self.emits, {}
        for rid, emit in emits.items():
            emit(rid, -1, True, time.monotonic(), None)

    def kv_use(self) -> float | None:
        cache = getattr(getattr(self.manager, "batch_processor", None), "cache", None)
        if cache is None:
            return None
        if hasattr(cache, "compute_free_capacity"):  # transformers 5.24
            return 1.0 - float(cache.compute_free_capacity(relative=True))
        if hasattr(cache, "get_num_free_blocks"):  # 5.17
            return 1.0 - cache.get_num_free_blocks() / max(cache.num_blocks, 1)
        return None

    def facts(self) -> dict[str, Any]:
        cache = getattr(getattr(self.manager, "batch_processor", None), "cache", None)
        return {"kv_blocks": getattr(cache, "num_blocks", None),
                "max_batch_tokens": getattr(cache, "max_batch_tokens", None), **{
                    f"asked_{k}": v for k, v in self.config.items()}}

    def close(self) -> None:
        self.stopping.set()
        self.manager.stop(block=True, timeout=30, hard_stop=True)
        self.router.join(timeout=5)


def reference_tokens(shape: dict[str, Any], device: torch.device, seed: int,
                     prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy tokens of the same weights in fp32, one prompt at a time, no batching, no
    paged cache: the reference the served tokens are compared with."""
    net = model(shape, device, seed, "fp32")
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            gen = net.generate(ids, attention_mask=torch.ones_like(ids),
                               max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(gen[0, len(p):].tolist())
    del net
    return out

"""A small decoder-only language model: prefill and decode throughput, time to first token.

Owns a GPT-style transformer (pre-norm blocks, learned positions, tied embedding head; random
weights; size set by layers / width / heads / vocabulary) and greedy generation with a
key-value cache: a prefill pass over the prompt gives the first token, then one decode pass per
further token. In the timed loop a step is one generation of a resident batch, with prefill and
decode timed apart (`clock.phase`); served (scenarios/), a query is a generation, reporting its
first-token time so the Server scenario can give time to first token and per-token latency.

Kept for that alone: LLM training is `llama`'s (transformers' Llama, sharded), and this
decoder's generation path is what the inference scenarios serve until a continuous-batching
engine replaces it (tests/scenarios: its Server row's time to first token).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from raybench import flops
from raybench.workloads import Servable, WorkloadParams, register


class DecoderLmParams(WorkloadParams):
    batch_size: int = Field(8, ge=1, description="prompts per rank per step")
    layers: int = Field(4, ge=1)
    width: int = Field(256, ge=8, description="model dimension")
    heads: int = Field(4, ge=1)
    vocab: int = Field(8192, ge=16)
    prompt_tokens: int = Field(128, ge=1)
    gen_tokens: int = Field(32, ge=1, description="tokens generated per prompt (the first "
                            "comes from prefill)")

    @model_validator(mode="after")
    def _heads(self) -> DecoderLmParams:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")
        return self


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor],
                pos: int) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        keys, values = cache
        keys[:, :, pos:pos + t] = k
        values[:, :, pos:pos + t] = v
        # Prefill (pos 0, t tokens) is causal over itself; a decode token sees the whole cache.
        out = F.scaled_dot_product_attention(q, keys[:, :, :pos + t], values[:, :, :pos + t],
                                             is_causal=t > 1)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x, cache, pos):
        x = x + self.attn(self.ln1(x), cache, pos)
        return x + self.mlp(self.ln2(x))


def _init(module: nn.Module) -> None:
    """GPT-2's initialisation (normal, std 0.02): random weights with a trained model's scale,
    so logits are as close together as a real model's and low precision can flip them."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


class DecoderLM(nn.Module):
    def __init__(self, p: DecoderLmParams):
        super().__init__()
        self.p = p
        self.tok = nn.Embedding(p.vocab, p.width)
        self.pos = nn.Embedding(p.prompt_tokens + p.gen_tokens, p.width)
        self.blocks = nn.ModuleList(Block(p.width, p.heads) for _ in range(p.layers))
        self.norm = nn.LayerNorm(p.width)
        self.apply(_init)

    def forward(self, ids: torch.Tensor, caches, pos: int) -> torch.Tensor:
        """Logits of the last position only: generation needs no others."""
        where = torch.arange(pos, pos + ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(where)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block(x, cache, pos)
        return self.norm(x[:, -1]) @ self.tok.weight.T

    def new_caches(self, batch: int, device: torch.device, dtype: torch.dtype):
        p = self.p
        shape = (batch, p.heads, p.prompt_tokens + p.gen_tokens, p.width // p.heads)
        return [(torch.empty(shape, device=device, dtype=dtype),
                 torch.empty(shape, device=device, dtype=dtype)) for _ in self.blocks]


@register
class DecoderLm(Servable):
    name = "decoder_lm"
    Params = DecoderLmParams
    params: DecoderLmParams

    def _build(self) -> None:
        p, ctx = self.params, self.ctx
        torch.manual_seed(p.seed)
        self._model = DecoderLM(p).eval()
        self._dtype = ctx.inference_dtype or torch.float32
        self._model.to(self._dtype)
        self.net = ctx.prepare_model(self._model, self.clock)

    def setup(self) -> None:
        self._build()
        prompts = self.serving_inputs(self.params, np.arange(self.params.batch_size))["prompt"]
        self._prompts = torch.from_numpy(prompts).to(self.ctx.device)

    def setup_serving(self) -> None:
        self._build()

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Greedy tokens [batch, gen_tokens] and the seconds until the first one existed."""
        p, ctx = self.params, self.ctx
        start = time.perf_counter()
        caches = self._model.new_caches(prompts.shape[0], ctx.device, self._dtype)
        out = torch.empty(prompts.shape[0], p.gen_tokens, dtype=torch.long, device=ctx.device)
        with self.clock.phase("prefill"):
            out[:, 0] = self.net(prompts, caches, 0).argmax(-1)
        first = time.perf_counter() - start
        with self.clock.phase("decode"):
            for i in range(1, p.gen_tokens):
                out[:, i] = self.net(out[:, i - 1:i], caches, p.prompt_tokens + i - 1).argmax(-1)
        return out, first

    def batches(self) -> Iterator[Any]:
        while True:
            yield self._prompts

    def to_device(self, batch: Any) -> Any:
        return batch

    def step(self, batch: Any) -> None:
        self.generate(batch)
        return None

    @classmethod
    def serving_inputs(cls, params: WorkloadParams, ids: np.ndarray) -> dict[str, np.ndarray]:
        rows = [np.random.default_rng([params.seed, int(i)]).integers(
            0, params.vocab, params.prompt_tokens) for i in ids]
        return {"prompt": np.stack(rows).astype(np.int64)}

    def serve(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        tokens, first = self.generate(torch.from_numpy(inputs["prompt"]).to(self.ctx.device))
        return {"pred": tokens.cpu().numpy(), "first_token_s": first,
                "tokens": self.params.gen_tokens, "prompt_tokens": self.params.prompt_tokens}

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def trains(self) -> bool:
        return False

    def flops_per_sample(self) -> float | None:
        """Prefill and every decode step of one prompt, counted on a real generation (the
        cache grows token by token, which the meta-device count cannot follow). The worker
        has taken the measured phase times before it counts."""
        return flops.counted(lambda: self.generate(self._prompts[:1]), 1)

    def describe(self) -> dict[str, Any]:
        p = self.params
        return {"prompt_tokens": p.prompt_tokens, "gen_tokens": p.gen_tokens}

"""Llama-3 training at real shape: transformers' `LlamaForCausalLM`, random weights, laid out over
the trial's ranks by FSDP2 / HSDP / DDP and tensor parallel (layout.py), on a seeded token
stream it can learn; tokens/s per GPU and MFU by torchtitan's count.

Owns the presets (the published configs of Llama-3.2-1B/3B and Llama-3.1-8B/70B, and `tiny` for
CPU), the token stream, the step (micro-batches, gradient sync on the last only, AdamW) and the
FLOPs per token. A sample is one sequence of `seq_len` tokens; `batch_size` sequences per
data-parallel rank per micro-batch. The ranks of one TP group train the same sequences, so each
counts its share of them (`samples_per_step`): summed over ranks, the global batch.

Why transformers' Llama and not torchtitan's: torchtitan (0.3.0 on PyPI) is a trainer whose
package requires datasets, torchdata, tensorboard, wandb and more, none of them on the lent
GPU image (transformers 5.17 is), and it tracks torch's newest releases; transformers'
modules take torch's own FSDP2 and tensor-parallel plans unchanged (its attention views
heads as -1, so a rank's share of them), and both 5.17 and 5.24 pass the layout tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from raybench.columns import Metric
from raybench.flops import peak_tflops
from raybench.records import RankRecord
from raybench.workloads import Generative, TokenEngine, WorkloadParams, register
from raybench.workloads.llama import layout
from raybench.workloads.llama.layout import Parallel
from raybench.workloads.llama.shape import (
    PRESETS,
    REFERENCES,
    SERVING_REFERENCES,
    Preset,
    build,
    flops_per_token,
    param_count,
    walk,
)

__all__ = ["Llama", "LlamaParams", "Parallel", "flops_per_token", "param_count"]


class LlamaParams(WorkloadParams):
    batch_size: int = Field(1, ge=1, description="sequences per data-parallel rank per "
                            "micro-batch (the ranks of one TP group share them)")
    preset: Preset = "tiny"
    # each None: the preset's
    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=8, description="model width")
    ffn: int | None = Field(None, ge=8, description="the MLP's hidden width (SwiGLU)")
    heads: int | None = Field(None, ge=1, description="attention (query) heads")
    kv_heads: int | None = Field(None, ge=1, description="key-value heads (grouped-query "
                                 "attention); must divide heads")
    vocab: int | None = Field(None, ge=16)
    max_positions: int | None = Field(None, ge=1, description="the longest sequence RoPE is "
                                      "set up for")
    tie_embeddings: bool | None = None
    rope_theta: float | None = Field(None, gt=0)
    seq_len: int | None = Field(None, ge=2, description="tokens per sequence")
    parallel: Parallel = Field(default_factory=lambda: Parallel(), description="the layout "
                               "over the trial's ranks; a grid axis of mappings sweeps layouts")
    reshard_after_forward: bool = Field(True, description="FSDP2 frees each block's gathered "
                                        "weights after its forward (gathered again for "
                                        "backward); false keeps them, trading memory for "
                                        "communication")
    activation_checkpoint: Literal["none", "selective", "full"] = "none"
    fp8: bool = Field(False, description="torchao float8 training of the linear layers (GPUs "
                      "of compute capability 8.9+ with torchao installed; else infeasible)")
    lr: float = Field(8e-4, gt=0, description="AdamW's learning rate (torchtitan's Llama-3 "
                      "default; betas 0.9/0.95, weight decay 0.1)")
    serve_max_batch_tokens: int | None = Field(
        None, ge=16, description="serving: tokens the engine's step takes at most (prefill "
        "chunks and decodes together); unset: transformers sizes it by GPU memory")

    def shape(self) -> dict[str, Any]:
        """The preset with this trial's overrides."""
        out = dict(PRESETS[self.preset])
        for key in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "max_positions",
                    "tie_embeddings", "seq_len"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.rope_theta is not None:
            out["rope"] = {**out["rope"], "rope_theta": self.rope_theta}
        return out


@register
class Llama(Generative):
    name = "llama"
    Params = LlamaParams
    params: LlamaParams
    references = REFERENCES + SERVING_REFERENCES
    headline_metric = "llm/tokens_per_s_per_gpu"  # what torchtitan and Megatron publish
    size_axis = "llm/seq_len"

    def setup(self) -> None:
        p, ctx = self.params, self.ctx
        self.shape = p.shape()
        self.degrees = layout.degrees(p.parallel, ctx.world_size)
        d = self.degrees
        bf16 = ctx.hardware.precision == "bf16"
        torch.manual_seed(p.seed)
        with torch.device("meta"):
            model = build(self.shape)
        if p.fp8:
            layout.float8(model, ctx.device, d.tp)
        mesh = layout.build_mesh(ctx.device.type, d) if ctx.world_size > 1 else None
        if d.tp > 1:
            layout.apply_tp(model, mesh["tp"])
        layout.apply_ac(model, p.activation_checkpoint)
        if ctx.hardware.compile:
            for block in model.model.layers:
                block.compile()  # per block, as torchtitan: one graph reused by every block
        self.fsdp = d.fsdp
        if self.fsdp:
            dp_mesh = (mesh["dp_replicate", "dp_shard"] if d.dp_replicate > 1
                       else mesh["dp_shard"])
            layout.apply_fsdp(model, dp_mesh, bf16, p.reshard_after_forward)
        layout.materialize(model, ctx.device, p.seed, std=0.02)
        self._model = model
        self.local_params = layout.local_params(model)
        self.net: torch.nn.Module = model
        if d.kind == "ddp" and not d.fsdp:
            ids = [ctx.device.index] if ctx.is_cuda else None
            self.net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        # FSDP2 computes in bf16 itself; every other layout keeps fp32 weights under autocast
        self._autocast = ctx.autocast if not self.fsdp else contextlib.nullcontext
        self.opt = torch.optim.AdamW(model.parameters(), lr=p.lr, betas=(0.9, 0.95),
                                     weight_decay=0.1, foreach=True)
        self._positions = torch.arange(self.shape["seq_len"], device=ctx.device)[None]
        self._losses: list[torch.Tensor] = []

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def batches(self) -> Iterator[Any]:
        """The seeded stream: each sequence starts at a random token and follows one fixed rule,
        token t+1 = (A x token t + C) mod vocab (a bijection, A being coprime with every
        preset's vocabulary), learnable from the first step; closed-form, so a step's tokens
        cost the host one vectorised expression. Step n's global batch is the same whatever
        the layout; this rank takes its data-parallel rank's rows of it."""
        p, shape = self.params, self.shape
        n_micro = self.ctx.hardware.grad_accum_steps
        vocab, seq = shape["vocab"], shape["seq_len"]
        scale, shift = walk(vocab, seq + 1)
        rows = p.batch_size * n_micro
        first = self.degrees.dp_rank(self.ctx.rank) * rows
        step = 0
        while True:
            g = torch.Generator().manual_seed(p.seed * 1_000_003 + step)
            start = torch.randint(0, vocab, (rows * self.degrees.dp, 1), generator=g)
            tokens = (start[first:first + rows] * scale + shift) % vocab
            yield tokens.view(n_micro, p.batch_size, seq + 1)
            step += 1

    def to_device(self, batch: torch.Tensor) -> torch.Tensor:
        return batch.to(self.ctx.device, non_blocking=True)

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        n_micro = batch.shape[0]
        total = torch.zeros((), device=self.ctx.device)
        for i in range(n_micro):
            last = i == n_micro - 1
            if self.fsdp:  # gradients reduced after the last micro-batch only
                self._model.set_requires_gradient_sync(last)
            sync = (self.net.no_sync() if not last and hasattr(self.net, "no_sync")
                    else contextlib.nullcontext())
            with sync, self._autocast():
                logits = self.net(input_ids=batch[i, :, :-1], position_ids=self._positions,
                                  use_cache=False).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1),
                                       batch[i, :, 1:].flatten()) / n_micro
            loss.backward()
            total += loss.detach()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if len(self._losses) < 1000:
            self._losses.append(total)
        return total

    def samples_per_step(self) -> float:  # type: ignore[override]
        """This rank's share of the sequences of an optimizer step: its TP group's, split
        among the group's ranks, so that the ranks' sum is the global batch."""
        return self.params.batch_size * self.ctx.hardware.grad_accum_steps / self.degrees.tp

    def flops_per_sample(self) -> float:
        return flops_per_token(self.shape) * self.shape["seq_len"]

    def describe(self) -> dict[str, Any]:
        d = self.degrees
        return {"seq_len": self.shape["seq_len"], "layout": d.name(), "dp_shard": d.dp_shard,
                "dp_replicate": d.dp_replicate, "tp": d.tp, "params": param_count(self.shape),
                "local_params": self.local_params,
                "flops_per_token": flops_per_token(self.shape), "fp8": self.params.fp8,
                "losses": [float(x) for x in self._losses]}

    # serving (scenarios/llm/): transformers' continuous batching over the same weights
    @classmethod
    def max_positions(cls, params: LlamaParams) -> int | None:
        return params.shape()["max_positions"]

    @classmethod
    def prompt(cls, params: LlamaParams, index: int, length: int) -> list[int]:
        g = torch.Generator().manual_seed(params.seed * 1_000_003 + index)
        return torch.randint(1, params.shape()["vocab"], (length,), generator=g).tolist()

    def engine(self, slots: int, max_tokens: int) -> TokenEngine:
        from raybench.workloads.llama import serve  # transformers' engine: serving only

        net = serve.model(self.params.shape(), self.ctx.device, self.params.seed,
                          self.ctx.hardware.precision)
        self._model = net
        return serve.ContinuousBatching(net, slots, max_tokens,
                                        max_batch_tokens=self.params.serve_max_batch_tokens)

    def reference_tokens(self, prompts: list[list[int]], max_new_tokens: int
                         ) -> list[list[int]] | None:
        from raybench.workloads.llama import serve  # transformers' engine: serving only

        return serve.reference_tokens(self.params.shape(), self.ctx.device, self.params.seed,
                                      prompts, max_new_tokens)

    @classmethod
    def unsupported(cls, params: LlamaParams, hardware: Any) -> tuple[str, ...] | None:
        """The layouts, shapes and precisions that cannot train: (key, why, fix)."""
        shape, world = params.shape(), hardware.world_size
        try:
            d = layout.degrees(params.parallel, world)
        except ValueError as e:
            return ("workload.parallel", str(e), "make dp_replicate x dp_shard x tp the "
                    f"trial's {world} ranks (dp_shard: -1 takes what the others leave)")
        for key in ("heads", "kv_heads"):
            if shape[key] % d.tp:
                return ("workload.parallel.tp", f"tp {d.tp} does not divide the "
                        f"{shape[key]} {key} of {params.preset}", "choose a tp that divides "
                        f"heads ({shape['heads']}) and kv_heads ({shape['kv_heads']})")
        if shape["heads"] % shape["kv_heads"] or shape["hidden"] % shape["heads"]:
            return ("workload.kv_heads", f"heads {shape['heads']} must be a multiple of "
                    f"kv_heads {shape['kv_heads']} and divide hidden {shape['hidden']}",
                    "change heads, kv_heads or hidden")
        if shape["seq_len"] > shape["max_positions"]:
            return ("workload.seq_len", f"seq_len {shape['seq_len']} is longer than the "
                    f"{shape['max_positions']} positions of {params.preset}",
                    "shorten seq_len or raise max_positions")
        if shape["seq_len"] % d.tp:
            return ("workload.seq_len", f"sequence parallel splits seq_len {shape['seq_len']} "
                    f"over {d.tp} TP ranks", "make seq_len a multiple of tp")
        if shape["tie_embeddings"] and d.tp > 1:
            return ("workload.tie_embeddings", f"{params.preset} ties its head to its "
                    "embedding, which tensor parallel would split two ways",
                    "set tie_embeddings: false (the head then has weights of its own) or tp: 1")
        if hardware.precision == "amp_fp16":
            return ("hardware.precision", "llama trains in bf16 (FSDP2's mixed precision, or "
                    "autocast) or in fp32/tf32; fp16 would need loss scaling",
                    "use precision: bf16")
        return None

    columns = (
        Metric("llm/tokens_per_s", "tokens/s", "tokens trained per second over every rank "
               "(global batch x seq_len over the step time)"),
        Metric("llm/tokens_per_s_per_gpu", "tokens/s", "llm/tokens_per_s over the trial's "
               "GPUs (its ranks on CPU): the figure torchtitan and Megatron publish"),
        Metric("llm/seq_len", "count", "tokens per sequence"),
        Metric("llm/layout", "text", "data and tensor parallelism: single, ddp, fsdp2 or hsdp, "
               "+tpN"),
        Metric("llm/params_m", "M", "the model's parameters, millions (a tied head once)"),
        Metric("llm/params_per_rank_m", "M", "parameters held by the rank holding most "
               "(its shards): FSDP2 about params / dp_shard / tp"),
        Metric("llm/gflops_per_token", "GFLOP", "torchtitan's count per trained token: "
               "6 x (weights but the input embedding) + 12 x layers x heads x head_dim x "
               "seq_len"),
        Metric("llm/mfu_of_fp8_peak_pct", "%", "fp8 trials: achieved TFLOP/s over the FP8 "
               "tensor cores' dense peak (perf/mfu_pct holds it against the bf16 peak; "
               "attention and norms still run in bf16, so neither peak is the whole truth)"),
        Metric("llm/loss_first", "score", "the global batch's cross-entropy (nats, the "
               "mean of every rank's) at the first step run (warmup included)"),
        Metric("llm/loss_last", "score", "the global batch's loss at the last step run"),
        Metric("llm/loss_curve", "score", "the global batch's loss at every step run, in "
               "order (up to 1,000)"),
    )

    @classmethod
    def row_metrics(cls, records: list[RankRecord], row: dict[str, Any]) -> dict[str, Any]:
        first = records[0].describe
        seq = first["seq_len"]
        tokens = row["train/samples_per_s"] * seq
        gpus = len(records) / max(1, records[0].ranks_per_gpu)
        # the global batch's loss at each step: the mean of every rank's (equal shares of it;
        # the ranks of a TP group hold the same figure), read from the records, no collective
        curves = [r.describe.get("losses") or [] for r in records]
        steps = min(len(c) for c in curves)
        losses = [sum(c[i] for c in curves) / len(curves) for i in range(steps)]
        return {"llm/tokens_per_s": tokens, "llm/tokens_per_s_per_gpu": tokens / gpus,
                "llm/seq_len": seq, "llm/layout": first["layout"],
                "llm/params_m": first["params"] / 1e6,
                "llm/params_per_rank_m": max(r.describe["local_params"] for r in records) / 1e6,
                "llm/gflops_per_token": first["flops_per_token"] / 1e9,
                "llm/loss_first": losses[0] if losses else None,
                "llm/loss_last": losses[-1] if losses else None,
                "llm/loss_curve": losses, "llm/mfu_of_fp8_peak_pct": _fp8_mfu(records, row)}


def _fp8_mfu(records: list[RankRecord], row: dict[str, Any]) -> float | None:
    achieved = row.get("perf/achieved_tflops_per_gpu")
    peak = peak_tflops(records[0].device_name, "fp8")
    if not records[0].describe.get("fp8") or not achieved or not peak:
        return None
    return 100.0 * achieved / peak

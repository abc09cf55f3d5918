"""How a Llama is laid out over a trial's ranks: the device mesh, tensor parallel with sequence
parallel norms, activation checkpointing, compile per block, FSDP2 (or HSDP), or plain DDP; and
the weights made on each rank already in their parts.

The order is torchtitan's (its `parallelize_llama`): float8 conversion, TP, AC, compile, FSDP,
all on the meta device, so that no rank ever holds the whole model; then `materialize` gives
each rank its own part of weights that every layout draws alike (one seed per parameter), so two
layouts of one seed start from the same model and their losses can be compared step by step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, Field, model_validator
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from raybench.failures import Infeasible
from raybench.sections import STRICT

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


class Parallel(BaseModel):
    """dp_replicate x dp_shard x tp = the trial's ranks (torchtitan's degrees)."""

    model_config = STRICT
    dp_shard: int = Field(-1, ge=-1, description="ranks that shard the weights, gradients "
                          "and optimizer state (FSDP2); -1: the ranks the others leave")
    dp_replicate: int = Field(1, ge=1, description="replicas of the (sharded) model: DDP where "
                              "dp_shard and tp are 1, HSDP with dp_shard")
    tp: int = Field(1, ge=1, description="tensor-parallel ranks (attention heads and MLP "
                    "split, sequence-parallel norms); must divide heads and kv_heads")

    @model_validator(mode="after")
    def _not_zero(self) -> Parallel:
        if self.dp_shard == 0:
            raise ValueError("dp_shard 0 shards over no rank: use 1 (no sharding) or -1 (the "
                             "ranks dp_replicate and tp leave)")
        return self


@dataclass(frozen=True)
class Degrees:
    """The trial's layout: dp_replicate x dp_shard x tp ranks (their product, the world)."""

    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def kind(self) -> str:
        """What data parallelism the layout runs: none, ddp (replicas), fsdp2 or hsdp."""
        if self.dp_shard > 1:
            return "hsdp" if self.dp_replicate > 1 else "fsdp2"
        return "ddp" if self.dp_replicate > 1 else "none"

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 manages the weights: wherever it shards them, and for replicas of a
        tensor-parallel model (FSDP2 over a (replicate, 1) mesh, as torchtitan replicates
        with TP; torch's DDP does not take DTensor weights)."""
        return self.dp_shard > 1 or (self.dp_replicate > 1 and self.tp > 1)

    def name(self) -> str:
        parts = [self.kind] if self.kind != "none" else []
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        return "+".join(parts) or "single"

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of global `rank` (ranks of one TP group are neighbours, the
        mesh's last dimension)."""
        return rank // self.tp


def degrees(parallel: Parallel, world: int) -> Degrees:
    """The layout (LlamaParams.parallel) for `world` ranks; dp_shard -1 takes the ranks the
    others leave. Raises ValueError where it cannot fill the world."""
    dp_shard, dp_replicate, tp = parallel.dp_shard, parallel.dp_replicate, parallel.tp
    rest, left = divmod(world, dp_replicate * tp)
    if left or rest < 1:
        raise ValueError(f"dp_replicate x tp = {dp_replicate * tp} does not divide the trial's "
                         f"{world} ranks")
    shard = rest if dp_shard == -1 else dp_shard
    if dp_replicate * shard * tp != world:
        raise ValueError(f"dp_replicate x dp_shard x tp = {dp_replicate} x {shard} x {tp} = "
                         f"{dp_replicate * shard * tp} ranks, but the trial has {world}")
    return Degrees(dp_replicate, shard, tp)


def build_mesh(device_type: str, d: Degrees) -> DeviceMesh:
    return init_device_mesh(device_type, (d.dp_replicate, d.dp_shard, d.tp),
                            mesh_dim_names=MESH_DIMS)


def apply_tp(model: nn.Module, mesh: DeviceMesh) -> None:
    """Megatron's tensor parallel over `mesh` (1-D): attention heads and the MLP's hidden units
    split column-wise, their outputs row-wise; sequence parallel between them (norms and
    residuals hold a slice of the sequence); the embedding's output and the head's input
    sequence-split; the head's logits whole on every rank (the loss then needs no parallel
    cross-entropy). torchtitan's plan, on transformers' module names."""
    parallelize_module(model.model, mesh, {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel()})
    parallelize_module(model, mesh, {"lm_head": ColwiseParallel(
        input_layouts=Shard(1), output_layouts=Replicate())})
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(  # transformers passes it by keyword
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                      desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1))})


# Selective checkpointing keeps what is costly to recompute (matmuls, attention, the TP
# reduce-scatters) and recomputes the rest (norms, SwiGLU, RoPE): torchtitan's op-level policy,
# keeping every matmul where it keeps every other one.
_KEEP = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
         *(getattr(torch.ops.aten, name).default for name in (
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
           if hasattr(torch.ops.aten, name))}
if hasattr(torch.ops, "_c10d_functional"):
    _KEEP.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEEP else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: nn.Module, mode: str) -> None:
    """Activation checkpointing of every block: `full` keeps only each block's input, `selective`
    also its matmuls' and attention's outputs. Wraps the block's forward, not the block, so that
    FSDP's hooks on the block stay outside the recomputed part (as torchtitan's wrapper does)."""
    if mode == "none":
        return
    context = (functools.partial(create_selective_checkpoint_contexts, _policy)
               if mode == "selective" else None)
    for layer in model.model.layers:
        forward = layer.forward
        kwargs = {"context_fn": context} if context else {}

        def wrapped(*args: Any, _forward=forward, _kw=kwargs, **kw: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **_kw, **kw)

        layer.forward = wrapped


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, bf16: bool, reshard: bool) -> None:
    """FSDP2 per block and over the rest (embedding, final norm, head); `mesh` 1-D shards, 2-D
    (replicate, shard) is HSDP. bf16 computes in bf16 and reduces gradients in fp32, the weights
    kept in fp32 (torchtitan's default mixed precision)."""
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if bf16 else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)


def float8(model: nn.Module, device: torch.device, tp: int) -> None:
    """torchao's float8 training for every linear layer but the head; Infeasible (an
    `infeasible` row) where this GPU, the installed packages or the layout do not allow it."""
    if device.type != "cuda":
        raise Infeasible("fp8 training needs an NVIDIA GPU with fp8 tensor cores (compute "
                         "capability 8.9 or later); this trial runs on the CPU")
    if torch.cuda.get_device_capability(device) < (8, 9):
        raise Infeasible(f"fp8 training needs compute capability 8.9 or later; "
                         f"{torch.cuda.get_device_name(device)} has "
                         f"{torch.cuda.get_device_capability(device)}")
    if tp > 1:
        raise Infeasible("fp8 with tensor parallel needs torchao's float8 TP plan, which "
                         "raybench does not apply: use tp 1")
    try:
        # torchao: optional, for fp8 trials only
        from torchao.float8 import convert_to_float8_training
    except ImportError as e:
        raise Infeasible(f"fp8 training needs torchao (pip install torchao): {e}") from e
    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "lm_head")


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device, seed: int, std: float) -> None:
    """Storage for this rank's part of every weight, then Llama's initialisation (normal with
    `std` for every matrix, ones for the norms) drawn whole, one parameter at a time from a
    seed of its own, and cut to this rank's part: the same model whatever the layout."""
    model.to_empty(device=device)
    for i, (name, p) in enumerate(model.named_parameters()):
        g = torch.Generator(device=device).manual_seed(seed * 100_003 + i)
        whole = torch.empty(p.shape, dtype=torch.float32, device=device)
        if name.endswith("norm.weight"):
            whole.fill_(1.0)
        else:
            whole.normal_(0.0, std, generator=g)
        if isinstance(p, DTensor):
            # src_data_rank=None: every rank cuts its own part, no communication
            part = distribute_tensor(whole, p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(part.to_local())
        else:
            p.copy_(whole)
        del whole
    rotary = model.model.rotary_emb  # buffers computed at construction: on meta, now empty
    fresh = type(rotary)(model.config)
    for name, buf in fresh.named_buffers():
        setattr(rotary, name, buf.to(device))


def local_params(model: nn.Module) -> int:
    """Parameters this rank holds (its shards' elements)."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel()
               for p in model.parameters())

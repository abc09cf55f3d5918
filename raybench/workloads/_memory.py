"""Activation checkpointing for the workloads that offer it (`workload.activation_checkpointing`).

A wrapped block keeps only its input from the forward and recomputes its activations in the
backward: memory for time, the first remedy for out-of-memory in the tile and xView3 suites.
Owns the wrapper and the switch that keeps recomputation out of the FLOP count (MFU counts the
model's FLOPs, not the recomputed ones: PaLM's definition). Not a workload (leading `_`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_counting_model_flops = False


class Checkpointed(nn.Module):
    """One block, recomputed in backward while training; unchanged otherwise. BatchNorm
    inside sees the batch twice, so its running statistics move twice per step (the usual
    price; the gradients are those of the plain block)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled() and not _counting_model_flops:
            return checkpoint(self.block, *args, use_reentrant=False)
        return self.block(*args)


def wrap_blocks(model: nn.Module, kinds: tuple[type[nn.Module], ...]) -> int:
    """Wrap every outermost module of these kinds in `Checkpointed`; returns how many."""
    wrapped = 0
    for name, child in list(model.named_children()):
        if isinstance(child, kinds):
            setattr(model, name, Checkpointed(child))
            wrapped += 1
        else:
            wrapped += wrap_blocks(child, kinds)
    return wrapped


@contextlib.contextmanager
def model_flops() -> Iterator[None]:
    """While counting FLOPs: blocks run plainly, so recomputation is not counted."""
    global _counting_model_flops
    before, _counting_model_flops = _counting_model_flops, True
    try:
        yield
    finally:
        _counting_model_flops = before

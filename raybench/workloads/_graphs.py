"""A serving forward replayed as CUDA graphs, one per batch size, as deployed inference does.

A graph replays a fixed sequence of kernels on fixed buffers, so it holds one input shape. A
replica answers calls of any size up to its largest (a Server's dynamic batches, the Offline
pass's short last batch), so graphs are captured for a ladder of sizes (powers of two, and the
largest) and a call is padded up to the next one: what vLLM's and TensorRT's serving paths do.
The padded rows hold whatever an earlier call left there; their outputs are dropped, which is
right for any forward whose samples do not mix (eval-mode BatchNorm, no cross-sample ops).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

WARMUP_CALLS = 3  # PyTorch's recipe: run a few times on a side stream before capturing


def ladder(largest: int) -> list[int]:
    """Batch sizes captured for calls of 1..largest samples: powers of two below it, and it."""
    if largest < 1:
        raise ValueError(f"largest batch must be at least 1, not {largest}")
    sizes, s = [], 1
    while s < largest:
        sizes.append(s)
        s *= 2
    return [*sizes, largest]


def padded(sizes: list[int], n: int) -> int:
    """The captured size a call of n samples runs at: the smallest that holds it."""
    i = bisect.bisect_left(sizes, n)
    if n < 1 or i == len(sizes):
        raise ValueError(f"a call of {n} samples: graphs hold 1 to {sizes[-1]}")
    return sizes[i]


def capture(fn: Callable[[torch.Tensor], torch.Tensor], static_in: torch.Tensor,
            pool: tuple | None = None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`fn(static_in)` captured as a CUDA graph, after PyTorch's recipe: a few untimed calls on
    a side stream first (cuDNN's autotuning and lazy allocations happen there, not in the
    graph). Returns the graph and its output buffer; replaying it reads `static_in` as it is."""
    device = static_in.device
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(WARMUP_CALLS):
            fn(static_in)
    main.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), torch.no_grad():
        static_out = fn(static_in)
    return graph, static_out


class GraphedForward:
    """`fn` (device tensor of a batch of samples -> device tensor, first dimension the batch)
    captured for every size of `ladder(largest)`, from `sample` (one sample, on the GPU)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], sample: torch.Tensor,
                 largest: int):
        if sample.device.type != "cuda":
            raise ValueError("CUDA graphs need a GPU replica (hardware.num_gpus: 1)")
        self.sizes = ladder(largest)
        # size -> (graph, its output buffer, its input buffer)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        pool = torch.cuda.graph_pool_handle()  # one memory pool for all sizes
        # Largest first: the smaller graphs then fit in the memory the first one reserved.
        for size in reversed(self.sizes):
            static_in = sample.unsqueeze(0).expand(size, *sample.shape).contiguous()
            self._graphs[size] = (*capture(fn, static_in, pool), static_in)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """fn(x) by replay; the result is a view of the graph's output buffer, valid until
        the next call (copy it off, as a serve's `.cpu()` does)."""
        n = x.shape[0]
        graph, static_out, static_in = self._graphs[padded(self.sizes, n)]
        static_in[:n].copy_(x)
        graph.replay()
        return static_out[:n]

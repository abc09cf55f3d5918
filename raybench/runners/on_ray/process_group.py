"""The ranks' torch.distributed process group, as Ray Train's backend for raybench's trials.

Ray Train's own torch backend (`TorchConfig`) is imported wherever the Train controller
unpickles it, and its module imports torch: 2-3 s of one core at every worker group's start on
a small machine (docs/journal/2026-11.md), in a process that never runs a tensor. This backend does
what that one does for raybench's ranks (a rendezvous address from rank 0's node, the
torchrun-style environment variables, `init_process_group`, and on shutdown
`destroy_process_group`), with torch imported only inside the functions that run on the
ranks. Owns nothing else: devices, DDP and the timed loop are the rank side's (rank/).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
import ray.train
from ray.train.backend import Backend, BackendConfig

from raybench.runners.on_ray import private as ray_private

SHUTDOWN_TIMEOUT_S = 30.0  # a rank stuck in a collective must not hold the group's end forever
TIMEOUT_S = 1800.0  # a collective's limit, as under Ray's TorchConfig


def _rendezvous() -> tuple[str, int]:
    """This node's address and a free port: rank 0's, for every rank to meet at."""
    addr = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
        s.bind(("", 0))
        return addr, s.getsockname()[1]


def _join(backend: str, url: str, timeout_s: float) -> None:
    """On every rank: the environment torchrun would give it, then the process group."""
    ctx = ray.train.get_context()
    _init(backend, url, timeout_s, ctx.get_world_rank(), ctx.get_world_size(),
          ctx.get_local_rank(), ctx.get_local_world_size(), ctx.get_node_rank())


def _init(backend: str, url: str, timeout_s: float, rank: int, size: int, local_rank: int,
          local_size: int, node_rank: int) -> None:
    import torch.distributed as dist  # torch: on the ranks only, never in the Train controller

    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size), "NODE_RANK": str(node_rank),
    })
    if backend == "nccl" and not any(k in os.environ for k in (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT")):
        # a collective that times out ends the process instead of hanging it (torch's
        # documented switch; the user's own setting wins)
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    dist.init_process_group(backend=backend, init_method=url, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s))


def narrow(size: int) -> bool:
    """On every rank still in the group's loop, before a trial of `size` ranks, fewer than the
    process group has: the group's first `size` ranks form a process group of their own, as a
    fresh worker group of `size` would (same backend and timeout, a new rendezvous at rank 0,
    whose address goes round the old group), and the others leave the old one. Returns whether
    this rank is one of the `size`: one that is not has no trial left to run (plan.worker_groups
    runs a group's trials widest first)."""
    import torch.distributed as dist  # torch: on the ranks only, never in the Train controller

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    backend = dist.get_backend()
    url = [_url(*_rendezvous()) if rank == 0 else None]
    dist.broadcast_object_list(url, src=0)
    dist.destroy_process_group()
    if rank >= size:
        return False
    # Ray Train numbers the ranks node by node: this node's ranks are one run of world ranks
    first = rank - ctx.get_local_rank()
    local_size = min(first + ctx.get_local_world_size(), size) - first
    _init(backend, url[0], TIMEOUT_S, rank, size, ctx.get_local_rank(),
          local_size, ctx.get_node_rank())
    return True


def _url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr else addr  # an IPv6 address
    return f"tcp://{host}:{port}"


def _leave() -> None:
    import torch.distributed as dist  # torch: on the ranks only, never in the Train controller

    if dist.is_initialized():
        dist.destroy_process_group()


class _CudaDevice:
    """The train function's context on every rank: its own GPU as CUDA's current device
    before the function runs (NCCL binds a communicator to the current device)."""

    def __enter__(self) -> None:
        import ray.train.torch  # torch: on the ranks only, never in the Train controller
        import torch

        if torch.cuda.is_available():
            device = ray.train.torch.get_device()
            if device.type == "cuda":
                torch.cuda.set_device(device)

    def __exit__(self, *exc: Any) -> bool:
        return False


class _ProcessGroup(Backend):
    def on_start(self, worker_group: Any, config: ProcessGroupConfig) -> None:
        url = _url(*worker_group.execute_single(0, _rendezvous))
        ray.get([worker_group.execute_single_async(i, _join, config.backend, url,
                                                   config.timeout_s)
                 for i in range(len(worker_group))])

    def on_shutdown(self, worker_group: Any, config: ProcessGroupConfig) -> None:
        try:
            ray.get(worker_group.execute_async(_leave), timeout=SHUTDOWN_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            pass  # the group's processes end with it all the same


@dataclass
class ProcessGroupConfig(BackendConfig):
    """`backend`: "nccl" for GPU ranks, "gloo" for CPU ranks and logical GPUs."""

    backend: str = "gloo"
    timeout_s: float = TIMEOUT_S

    @property
    def backend_cls(self) -> type[Backend]:
        return _ProcessGroup

    @property
    def train_func_context(self) -> type[_CudaDevice]:
        return _CudaDevice

    @property
    def framework(self) -> Any:
        return ray_private.torch_framework()  # what Ray's run state and dashboard record

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "timeout_s": self.timeout_s}

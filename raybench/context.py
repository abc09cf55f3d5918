"""WorkerContext: the narrow view of one rank that a workload builds itself from.

Owns the rank's identity and collectives, device placement, precision (autocast and
GradScaler), memory format, DDP wrapping, compile and DataLoader construction, so every
workload applies the hardware axes the same way; and the check that `hardware.env` reached the
process. Does not own timing (clock.py, driven by rank/loop.py) nor process-group start-up: a
runner does that (runners/on_ray/process_group.py, rank/launched.py) and hands in the ranks.
Never imports ray.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from raybench.sections import HardwareSpec

if TYPE_CHECKING:
    from raybench.clock import StepClock


def check_env(env: dict[str, str]) -> None:
    """The trial's `hardware.env` must be this process's environment: the runner sets it when
    the process starts (CUDA and NCCL read it once), and a row must not claim a setting the
    run did not have."""
    wrong = {k: os.environ.get(k) for k, v in env.items() if os.environ.get(k) != v}
    if wrong:
        raise RuntimeError(f"hardware.env did not reach this worker: {wrong} instead of "
                           f"{ {k: env[k] for k in wrong} }")


def process_start() -> float | None:
    """When this process started (wall clock); None where psutil is not installed."""
    try:
        import psutil  # optional: without it, no process start
    except ImportError:
        return None
    return psutil.Process().create_time()

_AUTOCAST_DTYPES = {"amp_fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class WorkerContext:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: torch.device
    hardware: HardwareSpec
    trace_path: str | None = None  # where rank 0 writes its profiler trace, if one is asked
    artifact_dir: str | None = None  # the trial's own folder for rank 0's files (predictions..)
    node_id: str | None = None  # where this rank ran, as the cluster names it (Ray node id/IP)
    node_ip: str | None = None
    accelerator_ids: list[str] = field(default_factory=list)  # GPUs the cluster gave this rank
    # wall-clock stamps of the rank's start (process, imports, entry), copied into its record
    stamps: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_env(cls, hardware: HardwareSpec, device: torch.device | None = None,
                 **extra: Any) -> WorkerContext:
        """A launched rank's context, from the variables torchrun sets (RANK, LOCAL_RANK,
        WORLD_SIZE, and the node's rank as GROUP_RANK or NODE_RANK): every launcher sets them
        before the process group (Ray Train's workers in runners/on_ray/process_group.py,
        spawned local ranks), so every rank's context is built here. `device`: where the
        launcher put the rank (Ray: the GPU it gave the worker); by default its share of the
        node's GPUs (`hardware.ranks_per_gpu` ranks to a GPU), or the CPU."""
        env = os.environ
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in env]
        if missing:
            raise RuntimeError(f"a launched rank needs {', '.join(missing)} in its environment "
                               "(the launcher sets them, as torchrun does)")
        local = int(env["LOCAL_RANK"])
        if device is None:
            device = (torch.device("cuda", local // hardware.ranks_per_gpu) if hardware.use_gpu
                      else torch.device("cpu"))
        return cls(int(env["RANK"]), local, int(env["WORLD_SIZE"]),
                   int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))), device, hardware, **extra)

    @classmethod
    def single(cls, hardware: HardwareSpec, device: torch.device, **extra: Any) -> WorkerContext:
        """The context of the only rank, in this process (the in-process runner's one-rank
        trials, an inference replica, a bench check): no launcher, whatever the environment
        holds (raybench itself may run inside someone's torchrun job)."""
        return cls(0, 0, 1, 0, device, hardware, **extra)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def set_math_mode(self) -> None:
        """FP32 matmuls and convolutions in IEEE FP32, or in TF32 for `precision: tf32`, and
        cuDNN's autotuning as `cudnn_benchmark` says (PyTorch's default is off, which runs
        convolutions with heuristically chosen algorithms; warmup covers the tuning).

        PyTorch's defaults differ by op (cuDNN convolutions in TF32, matmuls in FP32), so an
        "fp32" ResNet would run on the TF32 tensor cores and a ViT would not, and neither
        figure would match its row's label or its MFU peak. Set per trial because the flags are
        process-wide and the in-process runner runs many trials in one process."""
        mode = "tf32" if self.hardware.precision == "tf32" else "ieee"
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
            torch.backends.cuda.matmul.fp32_precision = mode
            torch.backends.cudnn.conv.fp32_precision = mode
            torch.backends.cudnn.rnn.fp32_precision = mode
        else:
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.benchmark = self.hardware.cudnn_benchmark

    @property
    def inference_dtype(self) -> torch.dtype | None:
        """The dtype a forward-only workload casts its model and inputs to (None: fp32/tf32).

        Inference runs in the low precision throughout, as it is deployed, rather than under
        autocast: autocast recasts every weight on every call and turns off PyTorch's fused
        transformer inference path, which on an H100 left a ViT-L forward CPU-bound near 20 ms
        at any tile and batch size (measured, docs/results/)."""
        return _AUTOCAST_DTYPES.get(self.hardware.precision)

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = _AUTOCAST_DTYPES.get(self.hardware.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        # fp16 needs loss scaling against gradient underflow; bf16 has fp32's exponent range.
        if self.hardware.precision != "amp_fp16":
            return None
        return torch.amp.GradScaler(self.device.type)

    def prepare_model(self, model: torch.nn.Module, clock: StepClock | None = None
                      ) -> torch.nn.Module:
        """Device, memory format, DDP and compile, in the order PyTorch recommends. `clock`:
        the timed loop's, which then marks this rank's own compute inside DDP."""
        model = model.to(self.device)
        if self.hardware.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.distributed:
            ids = [self.device.index] if self.is_cuda else None
            # hooks with marks would break compiled graphs
            if clock is not None and not self.hardware.compile:
                clock.watch(model)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if self.hardware.compile:
            model = torch.compile(model)
        return model

    def micro_batches(self, net: torch.nn.Module, batches: list) -> Iterator:
        """The micro-batches of one optimizer step, in order (`hardware.grad_accum_steps` of
        them): the caller runs forward and backward of each, its loss divided by their number.
        DDP's gradient all-reduce runs after the last one only (no_sync before it), as
        accumulating training jobs do."""
        ddp = getattr(net, "_orig_mod", net)  # under torch.compile, the DDP module inside
        for i, batch in enumerate(batches):
            syncs = i == len(batches) - 1 or not hasattr(ddp, "no_sync")
            with contextlib.nullcontext() if syncs else ddp.no_sync():
                yield batch

    def prepare_images(self, images: torch.Tensor) -> torch.Tensor:
        images = images.to(self.device, non_blocking=True)
        if self.hardware.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def make_loader(self, dataset: Dataset, batch_size: int, shuffle: bool = True,
                    collate_fn: Callable | None = None) -> DataLoader:
        """A DataLoader sharded across ranks; `dataloader_workers` is a real sweep axis here."""
        sampler = None
        if self.distributed:
            sampler = DistributedSampler(dataset, self.world_size, self.rank, shuffle=shuffle)
        workers = self.hardware.dataloader_workers
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=shuffle and sampler is None,
            num_workers=workers,
            pin_memory=self.is_cuda,
            drop_last=True,
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None,
            collate_fn=collate_fn,
        )

    def all_reduce_max(self, value: float) -> float:
        return self._all_reduce(value, "MAX")

    def all_reduce_sum(self, value: float) -> float:
        return self._all_reduce(value, "SUM")

    def _all_reduce(self, value: float, op: str) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return float(t.item())

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def gather(self, obj: object) -> list[object] | None:
        """Every rank's object on rank 0 (None elsewhere); a single rank gets [obj]."""
        if not self.distributed:
            return [obj]
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out if self.rank == 0 else None

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

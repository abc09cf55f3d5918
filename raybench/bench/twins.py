"""Bare twins: a workload's training as a plain single-process PyTorch loop, no raybench in it.

`bench overhead` sets a raybench trial beside its workload's twin, so the ratio weighs the
harness alone: a twin mirrors the trial's precision, memory format, compile and input mode in
plain PyTorch, and refuses (NoBareTwin) a setting a plain loop would not have rather than
ignore it. One twin per workload that has one, by name (`TWINS`); a workload without one
cannot be compared. Measures the workloads; nothing of the product imports this.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from raybench.context import WorkerContext
from raybench.memory import steady_heap
from raybench.sections import HardwareSpec, MeasureSpec
from raybench.trials import TrialSpec
from raybench.workloads.resnet import ResnetParams, SyntheticImages, resident_batch


class NoBareTwin(ValueError):
    """A trial `bench overhead` cannot set a plain PyTorch loop beside: its workload has no
    twin, or the twin does not mirror one of its settings. Input to fix (exit 2), raised
    before anything starts."""


def without_twin(trial: TrialSpec) -> str | None:
    """Why no bare loop can stand beside this trial (None: one can): `bench overhead` then
    sets Ray against torchrun alone."""
    if trial.hardware.world_size != 1:
        return (f"the bare loop runs one rank; this trial has {trial.hardware.world_size} "
                "(hardware.num_gpus or hardware.cpu_workers 1 for one)")
    if trial.workload_name not in TWINS:
        return f"{trial.workload_name} has no bare twin (bench/twins.py; resnet has one)"
    return None


def bare_loop(trial: TrialSpec) -> float:
    """Samples/s of the trial's training as its workload's bare twin: one process, no
    raybench, as a user would write it."""
    why = without_twin(trial)
    if why:
        raise NoBareTwin(why)
    twin = TWINS[trial.workload_name]
    rate = twin(trial.workload, trial.hardware, trial.measure)
    if trial.hardware.use_gpu:
        # the twin ran in this process, the driver, whose CUDA cache would otherwise hold its
        # model's and batches' memory on the GPU while the Ray and torchrun trials run there
        gc.collect()
        torch.cuda.empty_cache()
    return rate


def resnet(p: ResnetParams, hw: HardwareSpec, m: MeasureSpec) -> float:
    """Samples/s of the same training as a plain single-process loop (torchvision model,
    optimizer, DataLoader or one resident batch; timed with perf_counter around the whole
    window, no per-step sync), as a user would write it without raybench: the trial's
    precision (autocast, fp16's loss scaling), memory format, compile and input mode in
    plain PyTorch. Settings a plain loop would not have (raybench's activation
    checkpointing, accumulation, real image folders) are refused, not ignored: on an H100
    the twin would otherwise have run fp32 NCHW from host memory beside a bf16
    channels-last trial on a resident batch, and the ratio said nothing of the harness."""
    import torchvision  # with torch._dynamo 1.4 s: only when a twin runs

    beyond = [what for what, on in (
        ("workload.activation_checkpointing", p.activation_checkpointing),
        ("hardware.grad_accum_steps > 1", hw.grad_accum_steps > 1),
        ("workload.data: imagefolder", p.data == "imagefolder")) if on]
    if beyond:
        raise NoBareTwin(f"the bare loop does not mirror {', '.join(beyond)}: run bench "
                         "overhead on the trial without it (--set), as a plain loop "
                         "with it would be raybench's code again")
    ctx = _as_a_rank(hw)
    return _timed(_resnet_step(p, hw, ctx, torchvision.models), m, p.batch_size, hw.use_gpu)


def _as_a_rank(hw: HardwareSpec) -> WorkerContext:
    """This process set as a rank sets itself for the trial; its context serves only for the
    trial's autocast and GradScaler."""
    device = torch.device("cuda", 0) if hw.use_gpu else torch.device("cpu")
    # the heap every rank has (rank/loop.py): else the comparison would also weigh glibc's
    # history-dependent page faults (22-34 thousand/s in this loop by default), not the harness
    steady_heap()
    if not hw.use_gpu:
        torch.set_num_threads(max(1, int(hw.cpus_per_worker)))  # as Ray gives a CPU worker
    # the process-wide TF32 and cuDNN flags as the trial sets them (their spelling differs
    # by torch release; PyTorch's defaults would run an fp32 twin's convolutions in TF32),
    # and its precision as torch's own autocast and GradScaler (None unless fp16)
    ctx = WorkerContext.single(hw, device)
    ctx.set_math_mode()
    return ctx


def _resnet_step(p: ResnetParams, hw: HardwareSpec, ctx: WorkerContext,
                 models: Any) -> Callable[[], None]:
    """One plain training step of the trial's ResNet (`models`: torchvision's)."""
    device = ctx.device
    fmt = torch.channels_last if hw.channels_last else torch.contiguous_format
    torch.manual_seed(p.seed)
    model = getattr(models, f"resnet{p.depth}")(num_classes=p.num_classes)
    model = model.to(device, memory_format=fmt)
    net = torch.compile(model) if hw.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=p.lr, momentum=0.9, weight_decay=1e-4)
    scaler = ctx.grad_scaler()
    loss_fn = torch.nn.CrossEntropyLoss()
    if p.data == "synthetic_device":
        images, labels = resident_batch(p)
        resident = (images.to(device).contiguous(memory_format=fmt), labels.to(device))
        batches: Iterator[Any] = iter(lambda: resident, None)
    else:
        data = SyntheticImages(p.synthetic_samples, p.image_size, p.num_classes, p.seed)
        w = hw.dataloader_workers
        batches = iter(torch.utils.data.DataLoader(
            data, batch_size=p.batch_size, shuffle=True, num_workers=w, drop_last=True,
            pin_memory=hw.use_gpu, persistent_workers=w > 0,
            prefetch_factor=4 if w > 0 else None))

    def step() -> None:
        images, labels = next(batches)
        images = images.to(device, non_blocking=True).contiguous(memory_format=fmt)
        labels = labels.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with ctx.autocast():
            loss = loss_fn(net(images), labels)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    return step


def _timed(step: Callable[[], None], m: MeasureSpec, batch: int, gpu: bool) -> float:
    """Samples/s of `m.measure_steps` steps after `m.warmup_steps`, timed around the whole
    window with one device sync at each end, as a user's loop is."""
    for _ in range(m.warmup_steps):
        step()
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(m.measure_steps):
        step()
    if gpu:
        torch.cuda.synchronize()
    return m.measure_steps * batch / (time.perf_counter() - start)


# A family member that shares a workload's loop (EfficientNet, a Resnet subclass) is not its
# twin: it builds another model.
TWINS: dict[str, Callable[[Any, HardwareSpec, MeasureSpec], float]] = {"resnet": resnet}

"""The out-of-memory remedies: gradient accumulation (`hardware.grad_accum_steps`) and activation
checkpointing (`workload.activation_checkpointing`), on the ViT tiles and ResNet, on CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

from raybench.context import WorkerContext
from raybench.grid import expand
from raybench.runners.local import run_local
from raybench.sections import HardwareSpec
from raybench.spec import SpecError, load_sweep
from raybench.workloads import get

VIT = """
name: vit
system: {label: test-cpu}
workload: {name: vit_tiles, size: tiny, tile: 64, batch_size: 2, mode: train}
hardware: {num_gpus: 0, cpu_workers: 1}
measure: {warmup_steps: 1, measure_steps: 3}
"""
RESNET = """
name: rn
system: {label: test-cpu}
workload: {name: resnet, depth: 18, image_size: 64, num_classes: 10, batch_size: 4,
           data: synthetic_device}
hardware: {num_gpus: 0, cpu_workers: 1, dataloader_workers: 0}
measure: {warmup_steps: 1, measure_steps: 3}
"""


def built(write_sweep, text, *overrides):
    (trial,) = expand(load_sweep(write_sweep(text), list(overrides)))
    ctx = WorkerContext(0, 0, 1, 0, torch.device("cpu"), trial.hardware)
    w = get(trial.workload_name)(trial.workload, ctx)
    w.setup()
    return trial, w


def grads_after_one_step(write_sweep, text, *overrides):
    _, w = built(write_sweep, text, *overrides)
    loss = w.step(w.to_device(next(w.batches())))
    return float(loss), [p.grad.clone() for p in w.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("text, k", [(VIT, 2), (RESNET, 3)])
def test_accumulated_micro_batches_give_the_gradient_of_one(write_sweep, text, k):
    """k micro-batches of the same resident batch, each loss divided by k: the same gradient
    and loss as one pass of that batch (a missing 1/k would multiply the gradient by k)."""
    loss1, g1 = grads_after_one_step(write_sweep, text)
    loss_k, gk = grads_after_one_step(write_sweep, text, f"hardware.grad_accum_steps={k}")
    assert loss_k == pytest.approx(loss1, rel=1e-5)
    assert len(g1) == len(gk)
    for a, b in zip(g1, gk, strict=True):  # k sums of a third round differently in fp32
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4 * float(a.abs().max()))


def test_ddp_reduces_gradients_after_the_last_micro_batch_only():
    entered = []

    class FakeDdp(torch.nn.Module):
        @contextlib.contextmanager
        def no_sync(self):
            entered.append("no_sync")
            yield

    ctx = WorkerContext(0, 0, 2, 0, torch.device("cpu"), HardwareSpec(grad_accum_steps=3))
    seen = []
    for b in ctx.micro_batches(FakeDdp(), ["a", "b", "c"]):
        seen.append((b, len(entered)))
    assert seen == [("a", 1), ("b", 2), ("c", 2)]  # the last one outside no_sync


def test_a_step_counts_every_micro_batch(write_sweep):
    (trial,) = expand(load_sweep(write_sweep(VIT), ["hardware.grad_accum_steps=2"]))
    out = run_local(trial)
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["train/global_batch_size"] == 4  # samples per optimizer step: 2 x 2
    # one forward and one backward entry per step, each the sum over its micro-batches
    assert len(out.records[0]["phase_s"]["forward"]) == 3
    assert m["train/samples_per_s"] == pytest.approx(4 / (m["train/step_time_mean_ms"] / 1e3),
                                                     rel=0.05)


@pytest.mark.parametrize("override, problem", [
    ("workload.mode=inference", "inference has no gradients to accumulate"),
])
def test_accumulation_where_it_cannot_apply_is_an_input_error(write_sweep, override, problem):
    with pytest.raises(SpecError, match=problem) as err:
        expand(load_sweep(write_sweep(VIT), [override, "hardware.grad_accum_steps=2"]))
    assert err.value.path.startswith("hardware.grad_accum_steps")
    allreduce = """
name: ar
system: {label: test-cpu}
workload: {name: allreduce, message_mb: 1}
hardware: {num_gpus: 0, cpu_workers: 1, grad_accum_steps: 2}
"""
    with pytest.raises(SpecError, match="allreduce does not accumulate gradients"):
        expand(load_sweep(write_sweep(allreduce, "ar.yaml")))


def saved_bytes(w) -> tuple[int, float]:
    """Bytes a training forward keeps for backward (what activation memory is), and the
    loss; tensors a checkpointed block keeps are the block's own business (its input)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    batch = w.to_device(next(w.batches()))
    images, labels = batch[0] if isinstance(batch, list) else batch  # ResNet: micro-batches
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = w.loss_fn(w.net(images), labels)
    loss.backward()
    return total, float(loss.detach())


@pytest.mark.parametrize("text", [VIT, RESNET])
def test_checkpointing_keeps_less_for_backward_and_changes_no_figure(write_sweep, text):
    _, plain = built(write_sweep, text)
    _, ckpt = built(write_sweep, text, "workload.activation_checkpointing=true")
    kept_plain, loss_plain = saved_bytes(plain)
    kept_ckpt, loss_ckpt = saved_bytes(ckpt)
    assert kept_ckpt < 0.5 * kept_plain, (kept_ckpt, kept_plain)
    assert loss_ckpt == pytest.approx(loss_plain, rel=1e-5)
    for a, b in zip(plain.model.parameters(), ckpt.model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3,
                                   atol=1e-4 * float(a.grad.abs().max()))
    # MFU counts the model's FLOPs, not the recomputation
    assert ckpt.flops_per_sample() == pytest.approx(plain.flops_per_sample())


def test_checkpointing_is_a_training_setting(write_sweep):
    with pytest.raises(SpecError, match="activation_checkpointing saves training memory"):
        expand(load_sweep(write_sweep(VIT), ["workload.mode=inference",
                                             "workload.activation_checkpointing=true"]))

"""The step clock: a rank's step and phase times, and its own compute inside DDP.

Owned by the timed loop (rank/loop.py), which makes one per trial, hands it to the workload and
drives it: `end_step` after every step, `marking()` around a `sync: window` window (phases
are then marks on the device's timeline, not synchronised times), `settle()` once the device
has passed a window's end, `counts()`/`drop()` for windows that became warmup. A workload only
times its parts with `phase(name)`; `WorkerContext.prepare_model` lets `watch` mark the rank's
own forward and backward inside DDP. Imports torch, never Ray.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

Mark = torch.cuda.Event | float


class StepClock:
    """Phase times per step (`phase_s`) and the rank's own compute per step (`own_s`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.phase_s: dict[str, list[float]] = {}
        self.own_s: list[float] = []  # DDP: this rank's compute per step
        self._marking = False  # inside a `sync: window` window
        self._pending: list[tuple[str, Mark, Mark, int]] = []  # (phase, start, end, step)
        self._own: dict[str, Mark] = {}  # the current step's own-compute marks
        self._own_marks: list[tuple[Mark, Mark]] = []  # (start, end) per step, read at settle
        self._step_no = 0  # steps ended so far: a phase run twice in one step is one entry
        self._phase_step: dict[str, int] = {}  # phase -> the step of its last entry

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        """Wait for queued device work; the timed loop calls this inside the timed region."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def mark(self) -> Mark:
        """A point on the device's timeline without waiting for it: a recorded CUDA event on a
        GPU, the host clock on CPU (where work is done when the call returns)."""
        if not self.is_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start: Mark, end: Mark) -> float:
        """Time between two marks; for events, only once the device has passed `end`."""
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1e3

    @contextlib.contextmanager
    def marking(self) -> Iterator[None]:
        """A `sync: window` window: phases are marks, read by `settle()` after its end."""
        self._marking = True
        try:
            yield
        finally:
            self._marking = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one part of a step (forward, backward, ...).

        Outside a marking window, synchronised on both ends: the syncs cost a little overlap
        between the parts; workloads use this only where the split itself is the question (the
        tile benchmark's forward vs backward). Inside one, between two marks, read when the
        window ends. A phase that runs several times in one step (once per micro-batch) is
        summed: one entry per step."""
        if self._marking:
            start = self.mark()
            yield
            self._pending.append((name, start, self.mark(), self._step_no))
            return
        self.synchronize()
        start = time.perf_counter()
        yield
        self.synchronize()
        self._add_phase(name, self._step_no, time.perf_counter() - start)

    def _add_phase(self, name: str, step_no: int, seconds: float) -> None:
        times = self.phase_s.setdefault(name, [])
        if self._phase_step.get(name) == step_no and times:
            times[-1] += seconds
        else:
            times.append(seconds)
            self._phase_step[name] = step_no

    def end_step(self) -> None:
        """After each step: keep its own-compute marks, if it had both."""
        self._step_no += 1
        if "start" in self._own and "end" in self._own:
            self._own_marks.append((self._own["start"], self._own["end"]))
        self._own.clear()

    def settle(self) -> None:
        """After the device is synchronised: pending phase and own-compute marks become times."""
        for name, start, end, step_no in self._pending:
            self._add_phase(name, step_no, self.seconds(start, end))
        self._pending.clear()
        self.own_s += [self.seconds(start, end) for start, end in self._own_marks]
        self._own_marks.clear()

    def clear(self) -> None:
        """Warmup's phase and own-compute times are not measurements."""
        self.phase_s.clear()
        self._phase_step.clear()
        self.own_s.clear()
        self._pending.clear()
        self._own_marks.clear()
        self._own.clear()

    def counts(self) -> tuple[dict[str, int], int]:
        """How many phase and own-compute times are kept so far: `drop`'s mark."""
        return {k: len(v) for k, v in self.phase_s.items()}, len(self.own_s)

    def drop(self, counts: tuple[dict[str, int], int]) -> None:
        """Forget the phase and own-compute times kept before `counts` (from `counts()`): those
        of windows that became warmup."""
        phases, own = counts
        for name, times in self.phase_s.items():
            del times[:phases.get(name, 0)]
        del self.own_s[:own]

    def watch(self, module: torch.nn.Module) -> None:
        """Mark this rank's own forward and backward inside DDP, apart from waiting for others.

        DDP makes every rank wait for the slowest (buffer broadcast before forward, gradient
        all-reduce after backward), so step times are equal and a slow GPU cannot show in them.
        The marks run from the wrapped module's forward (after the broadcast) to the gradient of
        its first parameter, the last one backward produces, before the final all-reduce wait:
        two marks per step, on the real steps, with nothing else changed. Registered on the
        module before DDP wraps it (WorkerContext.prepare_model)."""
        first = next((q for q in module.parameters() if q.requires_grad), None)
        if first is None:  # forward-only: DDP synchronises nothing in its steps
            return

        def start(*_: object) -> None:
            # training forwards only (an evaluation between epochs runs under no_grad); of
            # several in one step, the first
            if torch.is_grad_enabled() and "start" not in self._own:
                self._own["start"] = self.mark()

        def end(_: torch.Tensor) -> None:
            self._own["end"] = self.mark()

        module.register_forward_pre_hook(start)
        first.register_post_accumulate_grad_hook(end)

"""Failure classification: real allocation failures and Ray Train's wrapped errors."""

from __future__ import annotations

import pytest
import torch

from raybench.failures import classify, failure


def test_real_cpu_allocation_failure_is_oom():
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**62, dtype=torch.uint8)
    out = failure(info.value)
    assert out.status == "oom"
    assert "allocate" in out.error


def test_cuda_oom_class_is_oom():
    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert classify(exc, str(exc)) == "oom"


def test_wrapped_worker_failure_is_walked():
    class WorkerGroupError(Exception):
        def __init__(self):
            super().__init__("Training failed due to worker errors")
            self.worker_failures = {0: torch.OutOfMemoryError("CUDA out of memory")}

    assert failure(WorkerGroupError()).status == "oom"


def test_a_worker_lost_while_starting_is_lost_through_the_controller():
    """As Ray 2.60 delivers it: ControllerError around the startup failure, cause dropped."""
    from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError
    from ray.train.v2.api.exceptions import ControllerError

    err = ControllerError(WorkerGroupStartupFailedError(
        "At least one of the worker actors failed to initialize."))
    assert failure(err).status == "lost"


def test_placement_timeout_is_infeasible_with_resources():
    class WorkerGroupStartupTimeoutError(Exception):
        pass

    out = failure(WorkerGroupStartupTimeoutError("timed out after 5s"), {"workers": 2})
    assert out.status == "infeasible"
    assert "wanted {'workers': 2}" in out.error


def test_plain_error():
    assert failure(ValueError("bad shape")).status == "error"


def test_a_long_error_keeps_what_failed_and_where_it_ended():
    """A failure whose text runs past the row's limit keeps its first lines (the outermost
    error: what a retry's reason is made of) and its end (the innermost frame), saying how
    much was left out; the old cut kept the end alone, and a retry reason read "e due to
    error: Traceback (most recent call last):" in a CI run."""
    from raybench.failures import ERROR_CHARS, ERROR_HEAD, _describe
    from raybench.runners.on_ray.trial import _reason

    class ActorDiedError(Exception):
        pass

    frames = "".join(f'  File "w.py", line {i}, in step\n    x = f({i})\n' for i in range(300))
    inner = RuntimeError(f"Traceback (most recent call last):\n{frames}ValueError: at the end")
    outer = ActorDiedError("The actor died unexpectedly before finishing this task.")
    outer.__cause__ = inner
    out = failure(outer)
    assert out.status == "lost" and ERROR_CHARS - 5 < len(out.error) <= ERROR_CHARS
    assert out.error.startswith("ActorDiedError: The actor died unexpectedly")
    assert out.error.endswith("ValueError: at the end")
    marker = out.error[ERROR_HEAD:].split("]\n")[0] + "]\n"
    kept = out.error.replace(marker, "")
    full = _describe(outer)
    assert full.startswith(kept[:ERROR_HEAD]) and full.endswith(kept[ERROR_HEAD:])
    assert marker == f"\n[... {len(full) - len(kept)} characters left out ...]\n"
    assert "died" in _reason(out)
    short = failure(ValueError("bad input"))
    assert short.error == "ValueError: bad input"  # a short text whole

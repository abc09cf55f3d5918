"""Failed trials as result fields: `oom | error | timeout | infeasible | lost` with a reason.

Owns the classification of exceptions (walking causes and Ray Train's per-worker failures), so
the Ray path (runners/on_ray/trial.py) and the local runner (runners/local.py) label failures
the same way.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from raybench.records import TrialOutcome

log = logging.getLogger(__name__)

# CUDA's allocator, the CPU allocator and Python itself word out-of-memory differently.
OOM_MARKERS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory",
               "Cannot allocate memory")
# How Ray reports a worker process that is gone (killed, crashed, its node lost), as opposed to
# an exception raised by the training code. WorkerGroupStartupFailedError: a worker died while
# its actor was starting (Ray raises it only from a RayActorError; the cause does not survive
# the trip from the Train controller, the name does). Seen in CI: a worker killed 4 s after its
# process started, before its actor was up, made an `error` row where a lost worker belongs.
LOST_NAMES = {"ActorDiedError", "RayActorError", "ActorUnavailableError", "WorkerCrashedError",
              "NodeDiedError", "WorkerHealthCheckFailedError", "WorkerGroupStartupFailedError"}


class Infeasible(RuntimeError):
    """Raised by a trial that cannot run on what it was given (a GPU feature, a package it
    lacks): an `infeasible` row with this message, not an error."""


def failure(exc: BaseException, resources: dict[str, Any] | None = None) -> TrialOutcome:
    text = _describe(exc)
    status = classify(exc, text)
    why = _infeasible(exc, text)
    if why:
        status, text = "infeasible", why
    elif status == "infeasible":
        text = f"worker group could not be placed (wanted {resources}): {text}"
    log.warning("trial failed (%s): %s", status, text.splitlines()[0] if text else "")
    return TrialOutcome.failed(status, clip(text))


# A row's error text: what failed comes first (the outermost exception, and the worker's own
# line where Ray wraps it: what a retry's reason and the report's first line show), the
# innermost traceback's end last. A worker's death through Ray Train runs past 4,000
# characters; keeping only its end once left a retry reason of "e due to error: Traceback
# (most recent call last):" (a CI run of the fault tests).
ERROR_CHARS, ERROR_HEAD = 4000, 1200


def clip(text: str, limit: int = ERROR_CHARS, head: int = ERROR_HEAD) -> str:
    """`text` if it fits in `limit` characters, else its first `head` and its end, with the
    number of characters left out between them on a line of its own."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters left out ...]\n"
    tail = limit - head - len(marker.format(len(text)))
    return text[:head] + marker.format(len(text) - head - tail) + text[-tail:]


def _infeasible(exc: BaseException, text: str) -> str | None:
    """The message of an Infeasible raised by the trial, here or in a Ray worker (where only
    its name and message may survive the trip)."""
    for e in _chain(exc):
        if isinstance(e, Infeasible):
            return str(e)
    for line in text.splitlines():
        if line.startswith("Infeasible: ") or ".Infeasible: " in line:
            return line.split("Infeasible: ", 1)[1]
    return None


def classify(exc: BaseException, text: str) -> str:
    names = {type(e).__name__ for e in _chain(exc)}
    if any(m in text for m in OOM_MARKERS) or names & {"OutOfMemoryError", "MemoryError"}:
        return "oom"
    if "WorkerGroupStartupTimeoutError" in text or "WorkerGroupStartupTimeoutError" in names:
        return "infeasible"
    if "TimeoutError" in names:
        return "timeout"
    if names & LOST_NAMES or "died unexpectedly" in text:
        return "lost"
    return "error"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    stack = [exc]
    while stack and len(seen) < 20:
        e = stack.pop()
        if e is None or e in seen:
            continue
        seen.append(e)
        stack += [e.__cause__, e.__context__]
        stack += list(getattr(e, "worker_failures", {}).values())
        stack.append(getattr(e, "controller_failure", None))
    return seen


def _describe(exc: BaseException) -> str:
    parts = [f"{type(e).__name__}: {e}" for e in _chain(exc)]
    text = "\n".join(parts)
    return text if text.strip() else "".join(traceback.format_exception(exc))

"""Every use raybench makes of Ray beyond its public API, in one place.

Ray moves its internals between releases; raybench supports a range of them (pyproject.toml),
and under `ray job submit` it runs with whatever Ray the cluster has. So each use below says
why no public API serves, and what a release that changes it breaks: where raybench can do
without it, the function falls back (slower, never wrong); where it cannot, it fails with a
message that names this module. tests/test_ray_private.py checks every use against the
installed Ray, and `make test-ray-oldest` against the oldest supported one: a failure there
names the function to mend. Nothing here replaces a Ray function at run time.
"""

from __future__ import annotations

import logging
import subprocess
from typing import Any

log = logging.getLogger(__name__)


def visible_gpus() -> int | None:
    """The GPUs an embedded Ray started from this process would find (NVML within
    CUDA_VISIBLE_DEVICES), without importing torch, which the sweep imports on another thread
    meanwhile. Ray's accelerator manager is how `ray.init` counts them itself; no public call
    asks it. Changed: None, and Ray counts them at `ray.init` as it would without raybench."""
    try:
        # Ray's internals at their use: a release without them fails this use alone
        from ray._private.accelerators import get_accelerator_manager_for_resource

        gpu = get_accelerator_manager_for_resource("GPU")
        count = gpu.get_current_node_num_accelerators()
        visible = gpu.get_current_process_visible_accelerator_ids()
    except (ImportError, AttributeError) as e:
        log.debug("Ray's accelerator manager is not where raybench looks (%s)", e)
        return None
    return count if visible is None else min(count, len(visible))


def autoscaler_monitors() -> list[subprocess.Popen]:
    """The autoscaler monitor processes of the Ray this process started (an embedded Ray).
    Ray ends the monitor after the GCS with up to a second's grace, which it always uses up
    (cluster.shutdown); the public `ray.shutdown` has no say in it. Changed: an empty list,
    and shutting down takes that second again."""
    try:
        # Ray's internals at their use: a release without them fails this use alone
        from ray._private import ray_constants, worker

        node = getattr(worker, "_global_node", None)
        infos = getattr(node, "all_processes", {}).get(ray_constants.PROCESS_TYPE_MONITOR, [])
        return [info.process for info in infos]
    except (ImportError, AttributeError) as e:
        log.debug("Ray's node processes are not where raybench looks (%s)", e)
        return []


def data_parallel_trainer() -> type:
    """Ray Train V2's data-parallel trainer: what `TorchTrainer` is, taking any backend. Ray's
    public `ray.train.torch.TorchTrainer` imports torch in the processes that only start
    workers (the Tune trial, the Train controller: 2-3 s of a core per trial on a small
    machine, process_group.py); V2 exports its generic trainer from no public module.
    Changed: every Ray trial fails with this message."""
    try:
        # Ray's internals at their use: a release without them fails this use alone
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    except ImportError as e:
        raise ImportError(f"this Ray ({_version()}) has no Ray Train V2 DataParallelTrainer "
                          "where raybench.runners.on_ray.private looks for it: use a Ray "
                          "release that raybench supports (README), or mend "
                          "data_parallel_trainer()") from e
    return DataParallelTrainer


def torch_framework() -> Any:
    """The framework Ray Train's run state and dashboard record for a backend: Ray's enum
    value for torch, which its own TorchConfig returns (from a module that imports torch).
    Changed: None, which Ray's state export may refuse; the run still trains."""
    try:
        # Ray's internals at their use: a release without them fails this use alone
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH
    except (ImportError, AttributeError):
        return None


def start_autoscaling_coordinator() -> None:
    """Ray's autoscaling coordinator (one detached actor per cluster, which Ray Train and Ray
    Data share), asked for before Tune starts: the first Ray Train run of a session otherwise
    starts it and waits for it (0.5 s of a core here, while the other core idled). No public
    call starts it. Changed: nothing is started, and the first trial waits for it again."""
    try:
        # Ray's internals at their use: a release without them fails this use alone
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:
        return
    get_or_create_autoscaling_coordinator()


def _version() -> str:
    import ray  # at the use, as the rest of this module

    return ray.__version__

"""Which Ray a sweep runs on, and what that cluster holds.

Owns the choice `--address`, else `RAY_ADDRESS` (set by `ray job submit`), else an embedded
local Ray sized to this machine; and the per-node resources that planning checks against.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
import torch

log = logging.getLogger(__name__)

# Ray's own chatter and telemetry are off for benchmark runs; both are read at ray.init.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def target(address: str | None) -> str | None:
    """The cluster address to join, or None for an embedded local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def local_shape() -> dict[str, float]:
    """What an embedded Ray on this machine will offer.

    One logical CPU more than the cores: each Tune trial holds a 0.01-CPU driver while its
    workers run, and Ray places by logical counts, so without it a trial asking for every
    core could never start on a small machine (the 2-core CI runner).
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"CPU": float((os.cpu_count() or 1) + 1), "GPU": float(gpus)}


def connect(address: str | None) -> bool:
    """Join or start Ray; returns True when this process started it (and must shut it down)."""
    addr = target(address)
    if ray.is_initialized():
        return False
    if addr:
        log.info("joining Ray cluster at %s", addr)
        ray.init(address=addr, logging_level=logging.WARNING, log_to_driver=True)
        return False
    shape = local_shape()
    log.info("starting an embedded Ray: %g CPUs, %g GPUs", shape["CPU"], shape["GPU"])
    # The dashboard serves the State API that Ray Train's placement-group cleaner polls; it
    # listens on loopback only, since an embedded Ray has no reason to be reachable.
    # one raybench_node token: what `concurrency: per_node` trials hold a node by (plan.py)
    ray.init(num_cpus=int(shape["CPU"]), num_gpus=int(shape["GPU"]),
             resources={"raybench_node": 1},
             include_dashboard=True, dashboard_host="127.0.0.1",
             logging_level=logging.WARNING, log_to_driver=True)
    return True


def nodes() -> list[dict[str, float]]:
    """Resources of each alive node of the connected cluster."""
    return [
        {k: float(v) for k, v in n["Resources"].items()}
        for n in ray.nodes() if n.get("Alive")
    ]


def describe() -> dict[str, Any]:
    return {
        "address": ray.get_runtime_context().gcs_address,
        "resources": {k: float(v) for k, v in ray.cluster_resources().items()
                      if not k.startswith("node:")},
        "nodes": [
            {"node_ip": n.get("NodeManagerAddress"), "alive": n.get("Alive"),
             "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}}
            for n in ray.nodes()
        ],
    }

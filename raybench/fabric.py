"""Which network NCCL used between nodes: InfiniBand, RoCE, EFA, or plain TCP sockets.

NCCL falls back to TCP sockets when a pod or container cannot see the InfiniBand/RoCE devices
(or EFA without its plugin), silently, at a fraction of the fabric's bandwidth. Owns the NCCL
settings that make its choice visible (`NCCL_DEBUG=INFO` for its INIT and NET subsystems, into
a file per process rather than the worker's log) and reading that choice back on rank 0. The
row's `cluster/nccl_net` carries it; the report notes a multi-node row measured over sockets.
No Ray, no torch.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from raybench import columns

# NCCL's documented debug variables: INIT and NET are the subsystems that name the transport.
DEBUG_FILE = "/tmp/raybench-nccl-{key}.%h.%p.log"  # %h host, %p pid: NCCL fills them in


def debug_env(trial_key: str) -> dict[str, str]:
    """Variables for a trial's NCCL ranks, set before NCCL starts; the user's win (merged
    under `hardware.env`)."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "NCCL_DEBUG_FILE": DEBUG_FILE.format(key=trial_key)}


def own_log() -> Path | None:
    """This process's NCCL debug file, where NCCL_DEBUG_FILE names one."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    return Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())))


def network(lines: list[str]) -> str | None:
    """The network NCCL chose from its INFO lines: "IB", "IB/RoCE", "Socket", "AWS Libfabric"
    (EFA through aws-ofi-nccl), ...; None where the lines do not say."""
    chosen = None
    roce = False
    for line in lines:
        m = re.search(r"Using network (.+?)\s*$", line)
        if m and chosen is None:
            chosen = m.group(1)
        if re.search(r"NET/IB\s*:\s*Using .*?/RoCE", line):
            roce = True
        m = re.search(r"via NET/([^/\s]+)", line)
        if m and chosen is None:
            chosen = m.group(1)
    if chosen == "IB" and roce:
        return "IB/RoCE"
    return chosen


def read_network() -> str | None:
    """The network named in this process's NCCL debug file (None: no file, or no choice)."""
    path = own_log()
    if path is None or not path.is_file():
        return None
    try:
        return network(path.read_text(errors="replace").splitlines())
    except OSError:
        return None


def over_sockets(nccl_net: str | None) -> bool:
    return columns.text(nccl_net).lower().startswith("socket")  # NaN where read from parquet

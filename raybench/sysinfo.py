"""System facts recorded with every sweep (`system_info.json`): what produced the numbers.

Owns host, CPU, RAM, GPU (through NVML where present), driver, CUDA, library versions and NCCL
variables of the machine it runs on (`machine`). On a cluster the driver is often a CPU head
node, so the caller also passes each node's own facts, gathered there (cluster.node_facts), and
the cluster's resources. Missing sources (no GPU, no NVML) give empty fields, never an exception.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import torch

log = logging.getLogger(__name__)
PACKAGES = ("ray", "torch", "torchvision", "numpy", "pandas", "pyarrow", "pydantic", "raybench")


def collect(cluster: dict[str, Any] | None = None,
            nodes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """This machine's facts, the cluster's, and `nodes`: every node's own, keyed by node IP."""
    return {**machine(), "cluster": cluster or {}, "nodes": nodes or {}}


def machine() -> dict[str, Any]:
    """The facts of the machine this runs on."""
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": {"model": _cpu_model(), "logical": os.cpu_count(),
                "physical": psutil.cpu_count(logical=False)},
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 2),
        "gpus": _gpus(),
        "cuda": {"torch_cuda": torch.version.cuda, "available": torch.cuda.is_available(),
                 "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
                 "nccl": _nccl_version()},
        "versions": {p: _version(p) for p in PACKAGES},
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "numa_nodes": len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or None,
        "gpu_topology": _command(["nvidia-smi", "topo", "-m"]),
    }


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _command(cmd: list[str]) -> str | None:
    """A tool's output where the tool exists (nvidia-smi on GPU nodes), else None."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        return _ANSI.sub("", out) or None  # `topo -m` underlines its header with escapes
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpus() -> list[dict[str, Any]]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no driver, no library: a CPU machine
        log.info("NVML unavailable (%s): GPU facts come from torch only", type(e).__name__)
        return _torch_gpus()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append({
                "index": i, "name": _str(pynvml.nvmlDeviceGetName(h)),
                "uuid": _str(pynvml.nvmlDeviceGetUUID(h)),
                "memory_gb": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 2),
                "driver": _str(driver),
                "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
            })
        return out
    finally:
        pynvml.nvmlShutdown()


def _torch_gpus() -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    return [{"index": i, "name": torch.cuda.get_device_name(i),
             "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 2)}
            for i in range(torch.cuda.device_count())]


def _nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # CPU-only builds have no NCCL
        return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

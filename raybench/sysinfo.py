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

from raybench.version import code_version

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
        # raybench by its code (commit or sources' digest): run from a checkout or a job's
        # working directory it is no installed package, and its version would read empty
        "versions": {p: code_version() if p == "raybench" else _version(p) for p in PACKAGES},
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "numa_nodes": len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or None,
        # InfiniBand, RoCE and EFA adapters alike appear here: where NCCL should not use sockets
        "rdma_devices": sorted(p.name for p in Path("/sys/class/infiniband").glob("*")),
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
        import pynvml  # NVML: absent on a machine without NVIDIA's driver

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
                "health": gpu_health(pynvml, h),
            })
        return out
    finally:
        pynvml.nvmlShutdown()


# NVML's clock event (throttle) reasons by bit, as nvidia-smi names them
THROTTLE_REASONS = {1: "gpu_idle", 2: "applications_clocks_setting", 4: "sw_power_cap",
                    8: "hw_slowdown", 16: "sync_boost", 32: "sw_thermal_slowdown",
                    64: "hw_thermal_slowdown", 128: "hw_power_brake_slowdown",
                    256: "display_clock_setting"}


def gpu_health(nvml: Any, h: Any) -> dict[str, Any]:
    """A GPU's health facts as NVML reports them, each None where the device does not support
    the query (a consumer card has no ECC, only Ampere and later remap rows): ECC error
    counts (uncorrected since the driver loaded, and over the device's life), retired pages
    and whether a retirement waits for a reset, remapped rows, the SM clock against its
    maximum with the reasons it is held down, the PCIe link against the card's maximum,
    persistence mode, the power limit against its default. raybench.validate.verdict judges them."""

    def ask(fn: str, *args: Any) -> Any:
        try:
            return getattr(nvml, fn)(h, *args)
        except Exception:  # NVMLError_NotSupported and kin: the card has no such counter
            return None

    unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    retired = [ask("nvmlDeviceGetRetiredPages", cause) for cause in (
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)]
    remapped = ask("nvmlDeviceGetRemappedRows")  # (corrected, uncorrected, pending, failed)
    reasons = ask("nvmlDeviceGetCurrentClocksThrottleReasons")
    persistence = ask("nvmlDeviceGetPersistenceMode")
    default_w = ask("nvmlDeviceGetPowerManagementDefaultLimit")
    return {
        "ecc_uncorrected_volatile": ask("nvmlDeviceGetTotalEccErrors", unc,
                                        nvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_aggregate": ask("nvmlDeviceGetTotalEccErrors", unc,
                                         nvml.NVML_AGGREGATE_ECC),
        "retired_pages": None if None in retired else sum(len(r) for r in retired),
        "retired_pages_pending": None if (p := ask("nvmlDeviceGetRetiredPagesPendingStatus"))
        is None else bool(p),
        "remapped_rows_uncorrected": None if remapped is None else int(remapped[1]),
        "remap_pending": None if remapped is None else bool(remapped[2]),
        "remap_failed": None if remapped is None else bool(remapped[3]),
        "sm_clock_mhz": ask("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM),
        "sm_clock_max_mhz": ask("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM),
        "throttle_reasons": None if reasons is None else [
            name for bit, name in THROTTLE_REASONS.items() if reasons & bit],
        "pcie_gen": ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_gen_max": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width": ask("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_width_max": ask("nvmlDeviceGetMaxPcieLinkWidth"),
        "persistence_mode": None if persistence is None else persistence == 1,
        "power_limit_default_w": None if default_w is None else default_w / 1000,
    }


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

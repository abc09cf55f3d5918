"""A system fingerprint on every row: what hardware and software produced the figure.

Owns turning a run's system facts (`system_info.json`: the driver machine's, and every node's
own on a cluster) into `system/*` columns: the accelerator model and count per node, the node
count and CPU model, which together are the hardware `system/fingerprint` hashes; and the
driver, CUDA, NCCL, torch, Ray and raybench versions, which are not in the hash, so that an
upgrade keeps comparing with the same machine's earlier rows and is named as a likely cause
(report/assess.py) instead of starting a new history. Pure: facts in, columns out.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from raybench.columns import Metric, declare
from raybench.records import present

HARDWARE = ("system/accelerator", "system/accelerators_per_node", "system/nodes",
            "system/cpu_model")
SOFTWARE = ("system/driver", "system/cuda", "system/nccl", "system/torch", "system/ray",
            "system/raybench")
COLUMNS = (*HARDWARE, *SOFTWARE, "system/fingerprint")

declare(
    Metric("system/accelerator", "text", "GPU model of the run's nodes (the most common), or "
           "'cpu' where none has a GPU"),
    Metric("system/accelerators_per_node", "count", "GPUs on the node that has the most"),
    Metric("system/nodes", "count", "nodes whose facts the run gathered (1 without a cluster)"),
    Metric("system/cpu_model", "text", "CPU model name (the most common over the nodes)"),
    Metric("system/driver", "text", "NVIDIA driver version(s), '|' between differing nodes"),
    Metric("system/cuda", "text", "CUDA version torch was built with"),
    Metric("system/nccl", "text", "NCCL version torch carries"),
    Metric("system/torch", "text", "torch version(s) on the nodes"),
    Metric("system/ray", "text", "Ray version(s) on the nodes"),
    Metric("system/raybench", "text", "raybench version(s) on the nodes"),
    Metric("system/fingerprint", "text", "hash of the hardware columns: rows with the same one "
           "ran on the same kind of system and are compared with each other"),
)


def of(info: dict[str, Any]) -> dict[str, Any]:
    """`system/*` columns from `sysinfo.collect`'s facts."""
    machines = [n for n in (info.get("nodes") or {}).values() if isinstance(n, dict)] or [info]
    gpus = [g.get("name") for m in machines for g in m.get("gpus") or [] if g.get("name")]
    out: dict[str, Any] = {
        "system/accelerator": _most_common(gpus) or "cpu",
        "system/accelerators_per_node": max(len(m.get("gpus") or []) for m in machines),
        "system/nodes": len(machines),
        "system/cpu_model": _most_common([(m.get("cpu") or {}).get("model") for m in machines]),
        "system/driver": _joined([g.get("driver") for m in machines for g in m.get("gpus") or []]),
        "system/cuda": _joined([(m.get("cuda") or {}).get("torch_cuda") for m in machines]),
        "system/nccl": _joined([(m.get("cuda") or {}).get("nccl") for m in machines]),
    }
    for package in ("torch", "ray", "raybench"):
        out[f"system/{package}"] = _joined([(m.get("versions") or {}).get(package)
                                            for m in machines])
    text = json.dumps([out[k] for k in HARDWARE], default=str)
    out["system/fingerprint"] = hashlib.sha1(text.encode()).hexdigest()[:12]
    return out


def software_changes(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """'torch 2.14.1 -> 2.15.0; driver 550 -> 560' between two rows, or None."""
    changes = []
    for key in SOFTWARE:
        a, b = before.get(key), after.get(key)
        if present(a) and present(b) and a != b:  # NaN: a row from before the column
            changes.append(f"{key.split('/', 1)[1]} {a} -> {b}")
    return "; ".join(changes) or None


def _most_common(values: list[Any]) -> Any:
    values = [v for v in values if v]
    return Counter(values).most_common(1)[0][0] if values else None


def _joined(values: list[Any]) -> str | None:
    values = sorted({str(v) for v in values if v})
    return "|".join(values) or None

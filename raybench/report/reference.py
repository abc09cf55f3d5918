"""Published reference figures beside measured rows: what a GPU is known to do on a workload.

Owns `compare`, which pairs each figure the rows' workloads publish (`Workload.references`:
GPU, the config that defines it, mode, precision, batch, samples/s per GPU, source) with the
best valid measured row of the same GPU (the device name, matched as a whole word), workload,
mode and precision (and batch, where the source states one) and gives measured / published.
Pure. A new figure is one line in its workload's file, with its source.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from raybench import workloads
from raybench.flops import names_gpu
from raybench.report.assess import _num
from raybench.workloads import Reference

COLUMNS = ["gpu", "workload", "mode", "precision", "batch", "published_per_gpu",
           "measured_per_gpu", "unit", "ratio", "trial_key", "source", "note"]


def _per_gpu(row: dict[str, Any], mode: str) -> float | None:
    """A row's samples/s per GPU in this mode, None where it is not such a row."""
    if mode == "train":
        v = row.get("train/samples_per_s_per_worker")
    elif mode == "serve":
        v = row.get("serve/output_tokens_per_s_per_gpu")
    else:
        rate, replicas = row.get("infer/samples_per_s"), row.get("infer/replicas_used")
        v = rate / replicas if _num(rate) and _num(replicas) and replicas else None
    return float(v) if _num(v) else None


def published(names: list[str]) -> list[Reference]:
    """The figures these workloads publish, each once (a family's members share its table)."""
    out: dict[Reference, None] = {}
    for name in sorted(set(names)):
        try:
            out.update(dict.fromkeys(workloads.get(name).references))
        except KeyError:  # a workload this version no longer has
            continue
    return list(out)


def compare(judged: pd.DataFrame, references: list[Reference] | None = None,
            allow_quick: bool = False) -> list[dict[str, Any]]:
    """Each reference (default: those of the rows' workloads) with the best valid measured row
    that matches it (none: not shown). A published figure is a canonical measurement: a quick
    row (trial/category) is shown beside it without a ratio unless `allow_quick`."""
    if judged.empty or "device" not in judged:
        return []
    if references is None:
        names = judged["workload.name"].dropna() if "workload.name" in judged else []
        references = published([str(n) for n in names])
    rows = [r for r in judged.to_dict("records") if r.get("valid", True) is not False]
    out = []
    for ref in references:
        best, best_v = None, None
        for r in rows:
            if not (isinstance(r.get("device"), str) and names_gpu(r["device"], ref.gpu)):
                continue
            if any(r.get(k) != v for k, v in ref.workload.items()):
                continue
            if ref.like_for_like and r.get("hardware.precision") != ref.precision:
                continue
            if ref.batch is not None and r.get("workload.batch_size") != ref.batch:
                continue
            v = _per_gpu(r, ref.mode)
            if v is not None and (best_v is None or v > best_v):
                best, best_v = r, v
        if best is None:
            continue
        quick = best.get("trial/category") == "quick" and not allow_quick
        out.append({
            "gpu": ref.gpu, "workload": ", ".join(f"{k.split('.', 1)[-1].split('/')[-1]}={v}"
                                                  for k, v in ref.workload.items()),
            "mode": ref.mode, "precision": ref.precision, "batch": ref.batch,
            "published_per_gpu": round(ref.samples_per_s * ref.per_sample, 1), "unit": ref.unit,
            "measured_per_gpu": round(best_v * ref.per_sample, 1),
            "ratio": None if quick else round(best_v / ref.samples_per_s, 3),
            "trial_key": best.get("trial_key"), "source": ref.source,
            "note": "a quick row (fewer than 5 windows, or unsettled): no ratio against a "
                    "published figure; rerun with measure.repeats of 5 or more" if quick else
                    f"not like for like: the source's engine and precision ({ref.precision}) "
                    f"against this row's {best.get('hardware.precision')}"
                    if not ref.like_for_like else "",
        })
    return out

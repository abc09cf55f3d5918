"""Published reference figures beside measured rows: what a GPU is known to do on a workload.

Owns a small table of figures from public sources (GPU, workload, mode, precision, batch,
samples/s per GPU, source) and `compare`, which pairs each with the best valid measured row of
the same GPU (the device name, matched as a whole word), workload, mode and precision (and
batch, where the source states one) and gives measured / published. Pure. A new figure is one
line, with its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from raybench.flops import names_gpu
from raybench.report.assess import _num

# NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md,
# "Training performance results" / "Inference performance results" (pytorch-21.03 NGC
# container, DALI input pipeline, ResNet-50 v1.5 at 224 px; training per GPU from the 1-GPU
# rows, at the launch script's per-platform batch).
_RN50 = "NVIDIA DeepLearningExamples ResNet50 v1.5 PyTorch README (NGC 21.03)"


@dataclass(frozen=True)
class Reference:
    gpu: str  # a whole word of the device name ("A100", "V100-SXM2-16GB", "T4")
    workload: dict[str, Any]  # the row's config values that define it
    mode: str  # "train" | "inference"
    precision: str  # raybench's name: fp32 | tf32 | amp_fp16 | bf16
    batch: int | None  # per GPU, where the source gives one
    samples_per_s: float  # per GPU
    source: str


RESNET50 = {"workload.name": "resnet", "workload.depth": 50, "workload.image_size": 224}
REFERENCES = [
    Reference("A100", RESNET50, "train", "tf32", None, 938.0, _RN50 + ", DGX A100 80GB"),
    Reference("A100", RESNET50, "train", "amp_fp16", None, 2470.0, _RN50 + ", DGX A100 80GB"),
    Reference("V100-SXM2-16GB", RESNET50, "train", "fp32", None, 367.0, _RN50 + ", DGX-1 16GB"),
    Reference("V100-SXM2-16GB", RESNET50, "train", "amp_fp16", None, 1200.0,
              _RN50 + ", DGX-1 16GB"),
    Reference("V100-SXM2-32GB", RESNET50, "train", "fp32", None, 356.0, _RN50 + ", DGX-1 32GB"),
    Reference("V100-SXM2-32GB", RESNET50, "train", "amp_fp16", None, 1156.0,
              _RN50 + ", DGX-1 32GB"),
    Reference("V100-SXM2-16GB", RESNET50, "inference", "fp32", 256, 1261.0, _RN50),
    Reference("V100-SXM2-16GB", RESNET50, "inference", "amp_fp16", 256, 3382.0, _RN50),
    Reference("T4", RESNET50, "inference", "fp32", 64, 428.0, _RN50),
    Reference("T4", RESNET50, "inference", "amp_fp16", 256, 1198.0, _RN50),
]

COLUMNS = ["gpu", "workload", "mode", "precision", "batch", "published_per_gpu",
           "measured_per_gpu", "ratio", "trial_key", "source", "note"]


def _per_gpu(row: dict[str, Any], mode: str) -> float | None:
    """A row's samples/s per GPU in this mode, None where it is not such a row."""
    if mode == "train":
        v = row.get("train/samples_per_s_per_worker")
    else:
        rate, replicas = row.get("infer/samples_per_s"), row.get("infer/replicas_used")
        v = rate / replicas if _num(rate) and _num(replicas) and replicas else None
    return float(v) if _num(v) else None


def compare(judged: pd.DataFrame, references: list[Reference] = REFERENCES,
            allow_quick: bool = False) -> list[dict[str, Any]]:
    """Each reference with the best valid measured row that matches it (none: not shown). A
    published figure is a canonical measurement: a quick row (trial/category) is shown beside
    it without a ratio unless `allow_quick`."""
    if judged.empty or "device" not in judged:
        return []
    rows = [r for r in judged.to_dict("records") if r.get("valid", True) is not False]
    out = []
    for ref in references:
        best, best_v = None, None
        for r in rows:
            if not (isinstance(r.get("device"), str) and names_gpu(r["device"], ref.gpu)):
                continue
            if any(r.get(k) != v for k, v in ref.workload.items()):
                continue
            if r.get("hardware.precision") != ref.precision:
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
            "gpu": ref.gpu, "workload": ", ".join(f"{k.split('.', 1)[1]}={v}"
                                                  for k, v in ref.workload.items()),
            "mode": ref.mode, "precision": ref.precision, "batch": ref.batch,
            "published_per_gpu": ref.samples_per_s, "measured_per_gpu": round(best_v, 1),
            "ratio": None if quick else round(best_v / ref.samples_per_s, 3),
            "trial_key": best.get("trial_key"), "source": ref.source,
            "note": "a quick row (fewer than 5 windows, or unsettled): no ratio against a "
                    "published figure; rerun with measure.repeats of 5 or more" if quick else "",
        })
    return out

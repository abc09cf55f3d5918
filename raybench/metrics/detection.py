"""COCO-style mAP at IoU 0.5 on chips: the detector's own accuracy, before any scene mapping.

Owns the definition: per class, detections of every image ranked by score; each is a true
positive when it overlaps a not-yet-matched label box of its class and image with IoU >= 0.5
(the best-overlapping one), else a false positive; AP is the area under the precision envelope
sampled at 101 recall points (COCO's interpolation); mAP is the mean over classes that have
labels. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IOU = 0.5
_RECALL_POINTS = np.linspace(0.0, 1.0, 101)


@dataclass
class ImageDetections:
    boxes: np.ndarray  # (N, 4) x1, y1, x2, y2
    scores: np.ndarray  # (N,)
    labels: np.ndarray  # (N,) class ids


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of (N, 4) and (M, 4) boxes."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda z: (z[:, 2] - z[:, 0]) * (z[:, 3] - z[:, 1])  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def average_precision(tp: np.ndarray, scores: np.ndarray, n_gt: int) -> float:
    """101-point interpolated AP from per-detection TP flags and scores."""
    if n_gt == 0:
        return float("nan")
    if len(tp) == 0:
        return 0.0
    order = np.argsort(-scores, kind="mergesort")  # stable: ties keep input order, as COCO
    hits = tp[order].astype(float)
    ctp, cfp = np.cumsum(hits), np.cumsum(1 - hits)
    recall = ctp / n_gt
    precision = ctp / np.maximum(ctp + cfp, np.finfo(float).eps)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    idx = np.searchsorted(recall, _RECALL_POINTS, side="left")
    return float(np.mean([envelope[i] if i < len(envelope) else 0.0 for i in idx]))


def map50(preds: list[ImageDetections], truths: list[ImageDetections]) -> float | None:
    """Mean AP@0.5 over the classes present in `truths`; None when there are no labels."""
    classes = sorted({int(c) for t in truths for c in t.labels})
    aps = []
    for cls in classes:
        flags, scores, n_gt = [], [], 0
        for p, t in zip(preds, truths, strict=True):
            gt = t.boxes[t.labels == cls]
            n_gt += len(gt)
            keep = p.labels == cls
            boxes, sc = p.boxes[keep], p.scores[keep]
            order = np.argsort(-sc, kind="mergesort")
            overlaps = iou(boxes[order], gt)
            used = np.zeros(len(gt), dtype=bool)
            for k in range(len(order)):
                cand = np.where(~used, overlaps[k], -1.0) if len(gt) else np.empty(0)
                j = int(np.argmax(cand)) if len(cand) else -1
                hit = j >= 0 and cand[j] >= IOU
                if hit:
                    used[j] = True
                flags.append(hit)
                scores.append(sc[order][k])
        aps.append(average_precision(np.array(flags, bool), np.array(scores, float), n_gt))
    return float(np.mean(aps)) if aps else None

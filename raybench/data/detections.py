"""Detector output on chips -> a challenge predictions table in scene coordinates.

Owns the inference-side conventions: a detection's point is its box centre, moved by the chip's
offset into the scene; a score threshold; duplicates where chips overlap removed (the higher
score wins among detections closer than `dedup_px` in the same scene); the vessel length from the
box diagonal x 10 m (the reference's rule); the class mapped to `is_vessel` / `is_fishing`.
Pure numpy and pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.spatial import cKDTree

from raybench.data import xview3 as x3

DEDUP_PX = 10.0  # one vessel seen by two overlapping chips lands within a few pixels


def chip_rows(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, scene_id: str,
              row_off: int, col_off: int) -> pd.DataFrame:
    """One chip's detections (boxes x1, y1, x2, y2 in chip pixels) as scene-coordinate rows."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return pd.DataFrame({
        "detect_scene_row": row_off + (boxes[:, 1] + boxes[:, 3]) / 2,
        "detect_scene_column": col_off + (boxes[:, 0] + boxes[:, 2]) / 2,
        "scene_id": scene_id,
        "score": np.asarray(scores, dtype=np.float64),
        "label_class": np.asarray(classes, dtype=np.int64),
        "vessel_length_m": np.sqrt(w ** 2 + h ** 2) * x3.SCALE_10M,
    })


def to_predictions(rows: pd.DataFrame, score_threshold: float,
                   dedup_px: float = DEDUP_PX) -> pd.DataFrame:
    """Thresholded, de-duplicated detections with the six challenge columns (plus `score`)."""
    cols = [*x3.PREDICTION_COLUMNS, "score"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    kept = rows[rows["score"] >= score_threshold]
    kept = kept.sort_values("score", ascending=False, kind="mergesort")
    parts = [_dedup(g, dedup_px) for _, g in kept.groupby("scene_id", sort=True)]
    out = pd.concat(parts, ignore_index=True) if parts else kept.iloc[:0]
    out = out.assign(is_vessel=out["label_class"] != x3.NON_VESSEL,
                     is_fishing=out["label_class"] == x3.FISHING)
    return out[cols].reset_index(drop=True)


def _dedup(scene: pd.DataFrame, radius: float) -> pd.DataFrame:
    """Greedy by score (rows arrive sorted): keep a detection unless a kept one is within reach."""
    pts = scene[["detect_scene_row", "detect_scene_column"]].to_numpy(np.float64)
    tree = cKDTree(pts)
    taken = np.zeros(len(pts), dtype=bool)
    keep = []
    for i in range(len(pts)):
        if taken[i]:
            continue
        keep.append(i)
        taken[tree.query_ball_point(pts[i], radius)] = True
    return scene.iloc[keep]

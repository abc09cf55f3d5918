"""The xView3 metric (../shared/specs/xview3.md section 4): `python -m raybench.metrics.xview3`.

Owns scoring a predictions table against a label table: Hungarian matching per scene at < 200 m,
the LOW-confidence reduction, detection / close-to-shore / vessel / fishing F1, the length score
and the aggregate. It agrees with the official definition where that one works, and differs
where it has sharp edges (each difference named in `score`'s docstring). Pure: frames in, a
dict out; the CLI only reads files.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment

from raybench import store
from raybench.data import xview3 as x3

log = logging.getLogger(__name__)

MATCH_M = 200.0  # a pair is a detection only strictly below this distance
SHORE_KM = 2.0  # labels this close to shore are "close to shore"
LENGTH_CAP_M = 500.0
_FAR = 1e9  # cost of a pair at or beyond MATCH_M: never preferred to a near one
SCORE_KEYS = ("aggregate", "detection_f1", "shore_f1", "vessel_f1", "fishing_f1",
              "length_score")


class PredictionsError(ValueError):
    """A predictions or label table that cannot be scored; the message says what to fix."""


@dataclass
class Counts:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    def add(self, other: Counts) -> None:
        self.tp, self.fp, self.fn = self.tp + other.tp, self.fp + other.fp, self.fn + other.fn

    def f1(self) -> float:
        return f1(self.tp, self.fp, self.fn)


def f1(tp: int, fp: int, fn: int) -> float:
    """2PR/(P+R), with P, R and F1 all 0 where their denominator is 0 (the official rule)."""
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return 2 * p * r / (p + r) if p + r else 0.0


def match(pred_rc: np.ndarray, gt_rc: np.ndarray) -> list[tuple[int, int]]:
    """Positional pairs (pred i, label j) closer than 200 m, by minimum-cost assignment."""
    if len(pred_rc) == 0 or len(gt_rc) == 0:
        return []
    d = np.sqrt(((pred_rc[:, None, :] - gt_rc[None, :, :]) ** 2).sum(-1)) * x3.SCALE_10M
    cost = np.where(d < MATCH_M, d, _FAR)
    rows, cols = linear_sum_assignment(cost)
    return [(int(i), int(j)) for i, j in zip(rows, cols, strict=True) if d[i, j] < MATCH_M]


def _rc(df: pd.DataFrame) -> np.ndarray:
    return df[["detect_scene_row", "detect_scene_column"]].to_numpy(dtype=np.float64)


def _pair_f1(pred: pd.Series, gt: pd.Series) -> float:
    """F1 of a boolean attribute over matched pairs whose label value is known (True positive)."""
    known = gt.notna().to_numpy()
    p = pred.to_numpy(dtype=bool)[known]
    g = gt.to_numpy()[known].astype(bool)
    return f1(int((p & g).sum()), int((p & ~g).sum()), int((~p & g).sum()))


def length_score(pred_m: np.ndarray, gt_m: np.ndarray) -> float:
    """1 - min(mean relative error, 1) over pairs with a known positive label length."""
    keep = np.isfinite(gt_m) & (gt_m > 0)
    if not keep.any():
        return 0.0
    p = np.minimum(pred_m[keep], LENGTH_CAP_M)
    g = np.minimum(gt_m[keep], LENGTH_CAP_M)
    return 1.0 - min(float(np.mean(np.abs(p - g) / g)), 1.0)


def score(pred: pd.DataFrame, labels: pd.DataFrame,
          shorelines: dict[str, list[np.ndarray]] | None = None) -> dict[str, Any]:
    """The six xView3 scores plus counts.

    Scenes scored: every scene of the label table. Differences from the official code, each
    deliberate: a scene with no predictions is scored as all misses (the official code crashes);
    scenes missing from the predictions are scored, not silently skipped, and listed in
    `scenes_without_predictions`; predictions in a scene the labels do not know are an error;
    a missing predicted length is an error, not a NaN aggregate; a prediction lying exactly on a
    shoreline point counts as close to shore. `shorelines` maps scene id -> contours; None means
    no shoreline data (shore F1 = 0, as the official code gives).
    """
    pred = validate_predictions(pred)
    scenes = list(dict.fromkeys(labels["scene_id"]))
    unknown = sorted(set(pred["scene_id"]) - set(scenes))
    if unknown:
        raise PredictionsError(f"predictions name scenes that the labels do not have: "
                               f"{unknown[:5]}; score against the label file of those scenes")
    drop = _matched_to_low(pred, labels, scenes)
    pred = pred.drop(index=drop)
    gt = labels[labels["confidence"].isin(["HIGH", "MEDIUM"])]
    det, shore, pairs, shore_scenes = _match_scenes(pred, gt, scenes, shorelines)
    pi = [a for a, _ in pairs]
    gi = [b for _, b in pairs]
    pp, gg = pred.loc[pi].reset_index(drop=True), gt.loc[gi].reset_index(drop=True)
    vessel = _pair_f1(pp["is_vessel"], gg["is_vessel"])
    is_v = gg["is_vessel"].eq(True).fillna(False).to_numpy(dtype=bool)
    fishing = _pair_f1(pp["is_fishing"][is_v], gg["is_fishing"][is_v])
    length = length_score(pp["vessel_length_m"].to_numpy(float),
                          gg["vessel_length_m"].to_numpy(float))
    shore_f1 = shore.f1() if shorelines is not None else 0.0
    det_f1 = det.f1()
    missing = [s for s in scenes if s not in set(pred["scene_id"])]
    if missing:
        log.warning("xview3: %d scene(s) have no predictions and are scored as all misses: %s",
                    len(missing), missing[:5])
    return {
        "aggregate": det_f1 * (1 + length + vessel + fishing + shore_f1) / 5,
        "detection_f1": det_f1, "shore_f1": shore_f1, "vessel_f1": vessel,
        "fishing_f1": fishing, "length_score": length,
        "tp": det.tp, "fp": det.fp, "fn": det.fn,
        "shore_tp": shore.tp, "shore_fp": shore.fp, "shore_fn": shore.fn,
        "shore_scenes": shore_scenes, "dropped_low": len(drop), "scenes": len(scenes),
        "scenes_without_predictions": missing,
    }

def _matched_to_low(pred: pd.DataFrame, labels: pd.DataFrame, scenes: list[str]) -> list[Any]:
    """1. Predictions matched to LOW labels are neither TP nor FP: their index, to drop; then
    only HIGH and MEDIUM labels count."""
    drop = []
    for sid in scenes:
        p, g = pred[pred.scene_id == sid], labels[labels.scene_id == sid]
        low = g["confidence"].eq("LOW").to_numpy()
        drop += [p.index[i] for i, j in match(_rc(p), _rc(g)) if low[j]]
    return drop


def _match_scenes(pred: pd.DataFrame, gt: pd.DataFrame, scenes: list[str],
                  shorelines: dict[str, list[np.ndarray]] | None
                  ) -> tuple[Counts, Counts, list[tuple[Any, Any]], int]:
    """Scene by scene: detection counts, close-to-shore counts (where shorelines are given),
    the matched (prediction, label) index pairs and how many scenes had shore pairs."""
    det, shore = Counts(), Counts()
    pairs: list[tuple[Any, Any]] = []
    shore_scenes = 0
    for sid in scenes:
        p, g = pred[pred.scene_id == sid], gt[gt.scene_id == sid]
        m = match(_rc(p), _rc(g))
        det.add(Counts(len(m), len(p) - len(m), len(g) - len(m)))
        pairs += [(p.index[i], g.index[j]) for i, j in m]
        if shorelines is None:
            continue
        g_s = g[g["distance_from_shore_km"] <= SHORE_KM]
        d_px = x3.distance_to_shore_px(p["detect_scene_row"].to_numpy(float),
                                       p["detect_scene_column"].to_numpy(float),
                                       shorelines.get(sid, []))
        # predictions get the match distance on top, so a label at 2 km keeps its partners
        p_s = p[d_px * x3.SCALE_10M <= SHORE_KM * 1000 + MATCH_M]
        if len(g_s) and len(p_s):
            ms = match(_rc(p_s), _rc(g_s))
            shore.add(Counts(len(ms), len(p_s) - len(ms), len(g_s) - len(ms)))
            shore_scenes += 1
    return det, shore, pairs, shore_scenes


def validate_predictions(pred: pd.DataFrame, source: str = "predictions") -> pd.DataFrame:
    """The six challenge columns, positions and lengths present, booleans as booleans."""
    missing = [c for c in x3.PREDICTION_COLUMNS if c not in pred.columns]
    if missing:
        raise PredictionsError(f"{source}: missing columns {missing}; a predictions CSV has "
                               f"{x3.PREDICTION_COLUMNS}")
    out = pred.reset_index(drop=True)
    for col in ("detect_scene_row", "detect_scene_column", "vessel_length_m"):
        values = pd.to_numeric(out[col], errors="coerce")
        bad = values.isna() | ~np.isfinite(values.to_numpy(float))
        if bad.any():
            raise PredictionsError(
                f"{source}: column {col} is empty or not a number on lines "
                f"{list(out.index[bad][:5] + 2)}; every prediction needs a position and a length "
                "(the official metric would return NaN)")
        out[col] = values.astype(float)
    for col in ("is_vessel", "is_fishing"):
        values = out[col].map({True: True, False: False, "True": True, "False": False,
                               "true": True, "false": False})  # 1 and 0 hash as True, False
        if values.isna().any():
            raise PredictionsError(f"{source}: column {col} must be True or False on every "
                                   f"line (lines {list(out.index[values.isna()][:5] + 2)})")
        out[col] = values.astype(bool)
    out["scene_id"] = out["scene_id"].astype(str)
    return out


def load_shorelines(root: str | Path, scene_ids: list[str]) -> dict[str, list[np.ndarray]]:
    missing = [s for s in scene_ids if not store.is_file(x3.shoreline_path(root, s))]
    if missing:
        raise PredictionsError(f"{root}: no shoreline file for scenes {missing[:5]} (expected "
                               f"<scene_id>_shoreline.npy); point --shoreline at the split's "
                               "shoreline folder, or leave it out to score shore F1 as 0")
    return {s: x3.load_shoreline(x3.shoreline_path(root, s)) for s in scene_ids}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raybench.metrics.xview3",
                                description="Score xView3 predictions; prints the scores as JSON.")
    p.add_argument("--predictions", required=True, type=Path, help="six-column predictions CSV")
    p.add_argument("--labels", required=True, type=Path, help="the scenes' label CSV")
    p.add_argument("--shoreline", type=Path, help="folder of <scene_id>_shoreline.npy files")
    p.add_argument("--all", action="store_true", help="print the counts too, not only the scores")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    # rasterio (0.45 s): the command line's only; the metric reads frames
    from raybench.data.labels import read_labels

    try:
        labels = read_labels(args.labels)
        try:
            pred = pd.read_csv(args.predictions, dtype={"scene_id": str})
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            raise PredictionsError(f"{args.predictions}: cannot be read as a CSV ({e})") from None
        pred = validate_predictions(pred, str(args.predictions))
        shores = None
        if args.shoreline:
            shores = load_shorelines(args.shoreline, list(dict.fromkeys(labels["scene_id"])))
        result = score(pred, labels, shores)
    except (PredictionsError, ValueError) as e:
        print(f"raybench: cannot score: {e}", file=sys.stderr)
        return 2
    out = result if args.all else {k: result[k] for k in SCORE_KEYS}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

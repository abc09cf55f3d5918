"""The xView3 metric on hand-built scenes, each case small enough to count by hand."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from raybench.data import xview3 as x3
from raybench.metrics import detection
from raybench.metrics.xview3 import PredictionsError, f1, length_score, main, match, score

S1, S2 = "0" * 16 + "v", "1" * 16 + "v"


def label(row, col, scene=S1, conf="HIGH", vessel=True, fishing=False, length=100.0,
          shore_km=10.0):
    return {"detect_lat": 0.0, "detect_lon": 0.0, "vessel_length_m": length, "source": "ais",
            "detect_scene_row": row, "detect_scene_column": col, "is_vessel": vessel,
            "is_fishing": fishing, "distance_from_shore_km": shore_km, "scene_id": scene,
            "confidence": conf, "top": np.nan, "left": np.nan, "bottom": np.nan,
            "right": np.nan, "detect_id": f"{scene[:2]}{row}_{col}"}


def pred(row, col, scene=S1, vessel=True, fishing=False, length=100.0):
    return {"detect_scene_row": row, "detect_scene_column": col, "scene_id": scene,
            "is_vessel": vessel, "is_fishing": fishing, "vessel_length_m": length}


def frames(labels, preds):
    lab = pd.DataFrame(labels, columns=x3.LABEL_COLUMNS)
    for col in ("is_vessel", "is_fishing"):
        lab[col] = lab[col].astype("boolean")
    return pd.DataFrame(preds, columns=x3.PREDICTION_COLUMNS), lab


def test_twenty_pixels_is_a_miss_just_below_is_a_hit():
    p, g = frames([label(100, 100)], [pred(120, 100)])  # exactly 20 px = 200 m
    r = score(p, g)
    assert (r["tp"], r["fp"], r["fn"]) == (1 - 1, 1, 1)
    p, g = frames([label(100, 100)], [pred(119.99, 100)])
    r = score(p, g)
    assert (r["tp"], r["fp"], r["fn"]) == (1, 0, 0)
    assert r["detection_f1"] == 1.0


def test_hungarian_beats_greedy_nearest():
    # pred A is nearest to label 1 but is the only pred in reach of label 0: a greedy nearest
    # match gives one pair, the minimum-cost assignment two.
    pr = np.array([[0.0, 15.0], [0.0, 6.0]])
    gt = np.array([[0.0, 0.0], [0.0, 12.0]])
    assert sorted(match(pr, gt)) == [(0, 1), (1, 0)]


def test_low_labels_drop_matched_predictions_and_are_never_missed():
    labels = [label(100, 100), label(500, 500, conf="LOW"), label(900, 900, conf="LOW"),
              label(300, 300, conf="MEDIUM")]
    preds = [pred(101, 100), pred(502, 500), pred(700, 700)]
    p, g = frames(labels, preds)
    r = score(p, g)
    # (101,100) TP; (502,500) matched to LOW: dropped; (700,700) FP; LOW at 900 not a FN;
    # MEDIUM at 300 missed
    assert (r["tp"], r["fp"], r["fn"], r["dropped_low"]) == (1, 1, 1, 1)
    assert r["detection_f1"] == pytest.approx(f1(1, 1, 1)) == pytest.approx(0.5)


def test_unknown_classes_and_lengths_are_skipped():
    labels = [label(100, 100, vessel=None, fishing=None, length=np.nan),
              label(300, 300, vessel=True, fishing=None, length=50.0),
              label(500, 500, vessel=False, fishing=True, length=np.nan)]
    preds = [pred(100, 100, vessel=False, fishing=True, length=999.0),
             pred(300, 300, vessel=True, fishing=True, length=60.0),
             pred(500, 500, vessel=True, fishing=False, length=10.0)]
    p, g = frames(labels, preds)
    r = score(p, g)
    assert r["detection_f1"] == 1.0
    # vessel: pairs 2 (T,T) and 3 (pred T, label F): tp 1, fp 1 -> F1 2/3; pair 1 skipped
    assert r["vessel_f1"] == pytest.approx(2 / 3)
    # fishing: only label 2 is a vessel, and its fishing is unknown -> no pairs -> 0
    assert r["fishing_f1"] == 0.0
    # length: only pair 2 has a label length: |60 - 50| / 50 = 0.2
    assert r["length_score"] == pytest.approx(0.8)


def test_fishing_counts_only_vessels_with_known_fishing():
    labels = [label(100, 100, fishing=True), label(300, 300, fishing=False),
              label(500, 500, fishing=True), label(700, 700, vessel=False, fishing=True)]
    preds = [pred(100, 100, fishing=True), pred(300, 300, fishing=True),
             pred(500, 500, fishing=False), pred(700, 700, fishing=True)]
    r = score(*frames(labels, preds))
    assert r["fishing_f1"] == pytest.approx(f1(1, 1, 1))


def test_length_caps_at_500_and_score_floors_at_zero():
    assert length_score(np.array([900.0]), np.array([600.0])) == 1.0  # both capped to 500
    assert length_score(np.array([400.0]), np.array([100.0])) == 0.0  # error 3 -> floor
    assert length_score(np.array([1.0]), np.array([np.nan])) == 0.0  # no pairs


def test_scene_without_predictions_is_all_misses_and_reported():
    labels = [label(100, 100), label(200, 200, scene=S2), label(400, 400, scene=S2)]
    r = score(*frames(labels, [pred(100, 100)]))
    assert (r["tp"], r["fp"], r["fn"]) == (1, 0, 2)
    assert r["scenes_without_predictions"] == [S2]
    r = score(*frames(labels, []))
    assert (r["tp"], r["fp"], r["fn"], r["aggregate"]) == (0, 0, 3, 0.0)


def test_shore_f1_from_contours():
    coast = [np.array([[r, 1000.0] for r in range(0, 2000, 5)])]  # a vertical shoreline
    labels = [label(500, 900, shore_km=1.0), label(800, 805, shore_km=1.95),
              label(1200, 300, shore_km=7.0)]
    # near-shore: pred at col 788 is 212 px from the coast (inside 2.2 km) and hits label 2;
    # pred at col 900 hits label 1; the far pred at col 300 is not a shore prediction at all.
    preds = [pred(500, 900), pred(800, 788), pred(1200, 300), pred(1500, 960)]
    r = score(*frames(labels, preds), shorelines={S1: coast})
    # shore sets: labels {1, 2}; preds {900, 788, (1500, 960)}: tp 2, fp 1, fn 0
    assert (r["shore_tp"], r["shore_fp"], r["shore_fn"]) == (2, 1, 0)
    assert r["shore_f1"] == pytest.approx(f1(2, 1, 0))
    assert score(*frames(labels, preds))["shore_f1"] == 0.0  # no shoreline data


def test_aggregate_formula():
    labels = [label(100, 100, fishing=True, length=100.0), label(300, 300, length=100.0),
              label(600, 600)]
    preds = [pred(100, 100, fishing=True, length=110.0), pred(300, 300, fishing=True,
                                                             length=100.0), pred(900, 900)]
    r = score(*frames(labels, preds))
    det = f1(2, 1, 1)
    expect = det * (1 + r["length_score"] + r["vessel_f1"] + r["fishing_f1"] + 0.0) / 5
    assert r["aggregate"] == pytest.approx(expect, abs=1e-12)
    assert r["length_score"] == pytest.approx(1 - 0.05)
    assert r["vessel_f1"] == 1.0 and r["fishing_f1"] == pytest.approx(f1(1, 1, 0))


def test_missing_predicted_length_is_an_error_not_nan():
    p, g = frames([label(1, 1)], [pred(1, 1, length=np.nan)])
    with pytest.raises(PredictionsError, match="vessel_length_m.*lines \\[2\\]"):
        score(p, g)


def test_predictions_for_an_unknown_scene_are_an_error():
    with pytest.raises(PredictionsError, match="scenes that the labels do not have"):
        score(*frames([label(1, 1)], [pred(1, 1, scene=S2)]))


def test_cli_prints_six_scores(tmp_path, capsys):
    p, g = frames([label(100, 100), label(400, 400, shore_km=0.5)],
                  [pred(100, 100), pred(401, 400)])
    p.to_csv(tmp_path / "p.csv", index=False)
    g.to_csv(tmp_path / "l.csv", index=False)
    shore = tmp_path / "shore"
    shore.mkdir()
    x3.save_shoreline(x3.shoreline_path(shore, S1), [np.array([[400.0, 420.0]])])
    assert main(["--predictions", str(tmp_path / "p.csv"), "--labels", str(tmp_path / "l.csv"),
                 "--shoreline", str(shore)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"aggregate", "detection_f1", "shore_f1", "vessel_f1", "fishing_f1",
                        "length_score"}
    assert out["detection_f1"] == 1.0 and out["shore_f1"] == 1.0
    assert out["aggregate"] == pytest.approx((1 + 1 + 1 + 0 + 1) / 5)
    p.drop(columns=["is_fishing"]).to_csv(tmp_path / "bad.csv", index=False)
    assert main(["--predictions", str(tmp_path / "bad.csv"), "--labels",
                 str(tmp_path / "l.csv")]) == 2
    assert "missing columns ['is_fishing']" in capsys.readouterr().err


def test_map50_by_hand():
    box = np.array([[0, 0, 10, 10]], float)
    truth = [detection.ImageDetections(box, np.ones(1), np.array([1])),
             detection.ImageDetections(box + 50, np.ones(1), np.array([1]))]
    perfect = [detection.ImageDetections(box, np.array([0.9]), np.array([1])),
               detection.ImageDetections(box + 50, np.array([0.8]), np.array([1]))]
    assert detection.map50(perfect, truth) == pytest.approx(1.0)
    # image 1: a confident FP first, then the hit; image 2: missed -> recall tops at 0.5
    half = [detection.ImageDetections(np.vstack([box + 30, box]), np.array([0.9, 0.5]),
                                      np.array([1, 1])),
            detection.ImageDetections(np.empty((0, 4)), np.empty(0), np.empty(0, int))]
    # precision at recall <= 0.5 is 0.5 (one hit among the two ranked), 0 beyond: 51 of 101
    assert detection.map50(half, truth) == pytest.approx(0.5 * 51 / 101)
    # a box shifted so that IoU = 25 / 175 < 0.5 misses
    shifted = [detection.ImageDetections(box + 5, np.array([0.7]), np.array([1])),
               detection.ImageDetections(box + 50, np.array([0.8]), np.array([1]))]
    assert detection.map50(shifted, truth) == pytest.approx(51 / 101)
    assert detection.map50([perfect[0]], [truth[0]]) == 1.0
    assert math.isnan(detection.average_precision(np.array([]), np.array([]), 0))

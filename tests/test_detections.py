"""Detections on chips -> challenge predictions: offsets, threshold, overlap duplicates, length."""

import math

import numpy as np
import pandas as pd
import pytest

from raybench.data import xview3 as x3
from raybench.data.detections import chip_rows, to_predictions

S = "a" * 16 + "v"


def test_box_centre_moves_to_scene_and_length_is_the_diagonal():
    rows = chip_rows(np.array([[10.0, 20.0, 16.0, 28.0]]), [0.9], [x3.FISHING], S, 800, 1600)
    r = rows.iloc[0]
    assert (r.detect_scene_row, r.detect_scene_column) == (824.0, 1613.0)
    assert r.vessel_length_m == pytest.approx(math.hypot(6, 8) * 10)


def test_threshold_dedup_and_classes():
    # the same vessel seen by two overlapping chips (scene offsets differ, positions agree
    # within a few pixels): the higher score stays; a second vessel 30 px away stays too
    a = chip_rows(np.array([[90.0, 90, 100, 100], [40, 40, 50, 50]]), [0.6, 0.2],
                  [x3.NON_FISHING, x3.FISHING], S, 0, 0)
    b = chip_rows(np.array([[-6.0, 92, 4, 102], [26.0, 90, 36, 100]]), [0.8, 0.7],
                  [x3.NON_VESSEL, x3.FISHING], S, 0, 96)
    p = to_predictions(pd.concat([a, b]), score_threshold=0.5)
    assert list(p.columns[:6]) == x3.PREDICTION_COLUMNS
    assert len(p) == 2
    top = p.iloc[0]
    assert top.score == 0.8 and not top.is_vessel and not top.is_fishing
    assert (p.iloc[1].is_vessel, p.iloc[1].is_fishing) == (True, True)
    assert p.iloc[1].detect_scene_column == pytest.approx(96 + 31)


def test_scenes_are_deduplicated_apart():
    a = chip_rows(np.array([[0.0, 0, 10, 10]]), [0.9], [1], S, 0, 0)
    b = chip_rows(np.array([[0.0, 0, 10, 10]]), [0.9], [1], "b" * 16 + "v", 0, 0)
    assert len(to_predictions(pd.concat([a, b]), 0.5)) == 2
    assert to_predictions(a.iloc[:0], 0.5).empty

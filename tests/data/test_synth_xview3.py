"""Synthetic scenes match the xView3 layout: files, dtypes, nodata, CRS, label columns, ids."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
from rasterio.warp import transform as warp_transform

from raybench.data import xview3 as x3
from raybench.data.synth_xview3 import generate, make_scenes

ROWS, COLS = 900, 1100


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("x3")
    labels = generate(root, n=3, rows=ROWS, cols=COLS, seed=5)
    return root, labels


def test_tree_and_ids(scenes):
    root, labels = scenes
    train = [Path(p) for p in x3.scene_dirs(root / "train")]  # local roots: local paths
    val = [Path(p) for p in x3.scene_dirs(root / "validation")]
    assert len(train) == 2 and len(val) == 1
    assert all(p.name.endswith("t") for p in train) and val[0].name.endswith("v")
    for scene in train + val:
        assert sorted(p.name for p in scene.iterdir()) == sorted(x3.CHANNEL_FILES.values())
        split = "train" if scene.name.endswith("t") else "validation"
        assert Path(x3.shoreline_path(root / "shoreline" / split, scene.name)).exists()
    assert (root / "labels" / "train.csv").exists() and (root / "labels" / "validation.csv").exists()


def test_rasters_types_nodata_crs_and_grids(scenes):
    root, _ = scenes
    scene = Path(x3.scene_dirs(root / "train")[0])
    for channel, name in x3.CHANNEL_FILES.items():
        with rasterio.open(scene / name) as src:
            assert src.dtypes == ("float32",)
            assert src.nodata == -32768
            assert src.crs.to_epsg() // 100 in (326, 327)
            if channel in x3.FINE_CHANNELS:
                assert (src.height, src.width) == (ROWS, COLS)
                assert src.transform.a == 10 and src.transform.e == -10
            else:
                assert (src.height, src.width) == x3.coarse_shape(ROWS, COLS) == (18, 22)
                assert src.transform.a == 500 and src.transform.e == -500


def test_sar_statistics_and_swath(scenes):
    root, _ = scenes
    scene = Path(x3.scene_dirs(root / "train")[0])
    with rasterio.open(scene / "VH_dB.tif") as src:
        vh = src.read(1)
    valid = vh != -32768
    assert 0.0 < 1 - valid.mean() < 0.3  # a non-rectangular swath leaves nodata borders
    assert vh[valid].min() >= -50.0
    assert -30 < np.median(vh[valid]) < -20  # sea clutter near the real VH level


def test_labels_schema_and_consistency(scenes):
    root, frames = scenes
    df = pd.read_csv(root / "labels" / "train.csv")
    assert list(df.columns) == x3.LABEL_COLUMNS
    assert df["detect_id"].is_unique
    assert set(df["confidence"]) <= {"HIGH", "MEDIUM", "LOW"}
    assert set(df["source"]) <= {"ais", "manual", "ais/manual"}
    assert df["is_vessel"].isna().any() and df["vessel_length_m"].isna().any()
    assert (df["is_vessel"] == False).any()  # noqa: E712  fixed infrastructure exists
    assert set(df["scene_id"]) == {Path(p).name for p in x3.scene_dirs(root / "train")}
    # lat/lon follow from row/col through the transform
    row = df.iloc[0]
    with rasterio.open(root / "train" / row["scene_id"] / "VH_dB.tif") as src:
        x, y = src.xy(row["detect_scene_row"], row["detect_scene_column"])  # pixel centre
        lon, lat = warp_transform(src.crs, "EPSG:4326", [x], [y])
    assert lat[0] == pytest.approx(row["detect_lat"], abs=1e-9)
    assert lon[0] == pytest.approx(row["detect_lon"], abs=1e-9)


def test_distance_from_shore_uses_the_shoreline_file(scenes):
    root, _ = scenes
    df = pd.read_csv(root / "labels" / "train.csv")
    for scene_id, group in df.groupby("scene_id"):
        contours = x3.load_shoreline(x3.shoreline_path(root / "shoreline" / "train", scene_id))
        d = x3.distance_to_shore_px(group["detect_scene_row"].to_numpy(),
                                    group["detect_scene_column"].to_numpy(), contours)
        np.testing.assert_allclose(group["distance_from_shore_km"], d * 10 / 1000, rtol=1e-9)


def test_vessels_are_bright(scenes):
    root, _ = scenes
    df = pd.read_csv(root / "labels" / "train.csv")
    vessels = df[(df["is_vessel"] == True) & df["vessel_length_m"].notna()]  # noqa: E712
    r = vessels.iloc[0]
    with rasterio.open(root / "train" / r["scene_id"] / "VH_dB.tif") as src:
        vh = src.read(1)
    peak = vh[r["detect_scene_row"] - 2: r["detect_scene_row"] + 3,
              r["detect_scene_column"] - 2: r["detect_scene_column"] + 3].max()
    assert peak > np.median(vh[vh != -32768]) + 10


def test_deterministic_per_seed(tmp_path):
    a = generate(tmp_path / "a", 2, 300, 300, seed=9)
    b = generate(tmp_path / "b", 2, 300, 300, seed=9)
    pd.testing.assert_frame_equal(a["train"], b["train"])
    with rasterio.open(next((tmp_path / "a" / "train").iterdir()) / "VV_dB.tif") as s1, \
            rasterio.open(next((tmp_path / "b" / "train").iterdir()) / "VV_dB.tif") as s2:
        np.testing.assert_array_equal(s1.read(1), s2.read(1))
    assert [s.scene_id for s in make_scenes(2, 300, 300, 9)] != \
        [s.scene_id for s in make_scenes(2, 300, 300, 10)]


class _Payload:
    """What a crafted shoreline file carries: unpickling it would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_shoreline_files_never_run_code(tmp_path):
    good = tmp_path / "good_shoreline.npy"
    x3.save_shoreline(good, [np.zeros((3, 2)), np.ones((5, 2))])
    assert [c.shape for c in x3.load_shoreline(good)] == [(3, 2), (5, 2)]
    marker = tmp_path / "ran"
    crafted = np.empty(2, dtype=object)
    crafted[0], crafted[1] = np.zeros((3, 2)), _Payload(marker)
    bad = tmp_path / "bad_shoreline.npy"
    np.save(bad, crafted, allow_pickle=True)
    with pytest.raises(ValueError, match=r"bad_shoreline.npy: refused to load: the file names "
                       r"(posix|os|nt)\.system.*Fix:"):
        x3.load_shoreline(bad)
    assert not marker.exists()  # the callable was refused, not called
    # a plain number array is read without unpickling, and still checked as contours
    np.save(tmp_path / "plain.npy", np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"a contour has shape \(2,\), expected \(N, 2\)"):
        x3.load_shoreline(tmp_path / "plain.npy")

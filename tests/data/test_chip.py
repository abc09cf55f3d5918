"""Ray Data chipping on tiny scenes: equal to direct reads, labels map back, resumable, errors."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pandas as pd
import pytest
import rasterio
import ray
from rasterio.warp import Resampling, reproject
from rasterio.windows import Window

from raybench.data import xview3 as x3
from raybench.data.chip import chip_scenes, load_chip, read_labels
from raybench.data.chipread import (
    ChipParams,
    ChipReadError,
    Scene,
    _open,
    _standardize,
    normalize,
    read_strip,
)
from raybench.data.resample import interp_rows
from raybench.data.synth_xview3 import generate

pytestmark = pytest.mark.ray
PARAMS = ChipParams(chip_size=256, overlap=32, channels=("vh", "vv", "bathymetry"))


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # its own (cluster.connect)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("x3")
    generate(root, n=3, rows=600, cols=700, seed=3)
    return root


@pytest.fixture(scope="module")
def chipped(ray_cluster, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("chips")
    summary = chip_scenes(data / "train", data / "labels" / "train.csv", out, PARAMS, select="all")
    return out, summary


def direct_fine(path, row_off, col_off, size):
    with rasterio.open(path) as src:
        return src.read(1, window=Window(col_off, row_off, size, size), boundless=True,
                        fill_value=x3.NODATA)


def direct_coarse_on_fine_grid(scene_dir, name):
    """GDAL's own bilinear warp of the 500 m band onto the 10 m grid, as an independent check."""
    with rasterio.open(scene_dir / "VH_dB.tif") as fine, rasterio.open(scene_dir / name) as src:
        out = np.full((fine.height, fine.width), x3.NODATA, dtype=np.float32)
        reproject(rasterio.band(src, 1), out, dst_transform=fine.transform, dst_crs=fine.crs,
                  src_nodata=x3.NODATA, dst_nodata=x3.NODATA, resampling=Resampling.bilinear)
    return out


def test_summary_counts(chipped):
    out, summary = chipped
    chips = pd.read_parquet(out / "chips.parquet")
    # 600x700 with 256-px chips every 224 px: 3 x 3 chips per scene, two train scenes
    assert summary["chips"] == len(chips) == 18
    assert summary["chips_per_s"] > 0 and summary["mb_per_s"] > 0
    assert summary["peak_rss_mb_worker"] > 0
    assert sorted(chips["chip_index"].unique()) == list(range(9))


def test_chips_equal_direct_reads(chipped, data):
    out, _ = chipped
    chips = pd.read_parquet(out / "chips.parquet")
    for _, meta in chips.iterrows():
        shard = pd.read_parquet(out / meta["shard"])
        row = shard[shard["chip_index"] == meta["chip_index"]].iloc[0]
        got, mask = load_chip(row, 3, 256)
        scene = data / "train" / meta["scene_id"]
        vh = direct_fine(scene / "VH_dB.tif", meta["row_off"], meta["col_off"], 256)
        vv = direct_fine(scene / "VV_dB.tif", meta["row_off"], meta["col_off"], 256)
        bathy = np.full((256, 256), x3.NODATA, dtype=np.float32)
        full = direct_coarse_on_fine_grid(scene, "bathymetry.tif")
        part = full[meta["row_off"]: meta["row_off"] + 256, meta["col_off"]: meta["col_off"] + 256]
        bathy[: part.shape[0], : part.shape[1]] = part
        valid = (vh != x3.NODATA) & (vv != x3.NODATA) & (bathy != x3.NODATA)
        np.testing.assert_array_equal(got[0], normalize(vh, "vh", valid, "standard"))
        np.testing.assert_array_equal(got[1], normalize(vv, "vv", valid, "standard"))
        # bilinear from GDAL and ours agree to float precision away from the scene edge
        inner = valid[25:-25, 25:-25]
        ours = got[2][25:-25, 25:-25][inner]
        gdal = normalize(bathy, "bathymetry", valid, "standard")[25:-25, 25:-25][inner]
        np.testing.assert_allclose(ours, gdal, rtol=1e-4, atol=1e-4)


def test_labels_map_back_to_scene_coordinates(chipped, data):
    out, _ = chipped
    cl = pd.read_parquet(out / "chip_labels.parquet")
    chips = pd.read_parquet(out / "chips.parquet").set_index(["scene_id", "chip_index"])
    offs = chips.loc[list(zip(cl["scene_id"], cl["chip_index"], strict=True))]
    np.testing.assert_array_equal(cl["chip_row_px"] + offs["row_off"].to_numpy(),
                                  cl["detect_scene_row"])
    np.testing.assert_array_equal(cl["chip_col_px"] + offs["col_off"].to_numpy(),
                                  cl["detect_scene_column"])
    labels = read_labels(data / "labels" / "train.csv")
    assert set(cl["detect_id"]) == set(labels["detect_id"])  # every label is in some chip
    assert ((cl["box_bottom"] > cl["box_top"]) & (cl["box_right"] > cl["box_left"])).all()
    assert set(cl["label_class"]) <= {1, 2, 3}


def test_rerun_skips_finished_scenes(chipped, data):
    out, _ = chipped
    shard = next((out / "shards").glob("*/strip-00000.parquet"))
    before = shard.stat().st_mtime_ns
    again = chip_scenes(data / "train", data / "labels" / "train.csv", out, PARAMS, select="all")
    assert again["scenes_skipped_done"] == 2 and again["chips"] == 0
    assert again["chips_total"] == 18
    assert shard.stat().st_mtime_ns == before


def test_train_selection_keeps_labelled_plus_background(ray_cluster, data, tmp_path):
    summary = chip_scenes(data / "train", data / "labels" / "train.csv", tmp_path, PARAMS,
                          select="train", background=0.0)
    cl = pd.read_parquet(tmp_path / "chip_labels.parquet")
    chips = pd.read_parquet(tmp_path / "chips.parquet")
    assert summary["chips"] == len(chips)
    assert set(zip(chips.scene_id, chips.chip_index, strict=True)) == \
        set(zip(cl.scene_id, cl.chip_index, strict=True))


def test_corrupt_raster_names_scene_and_file(ray_cluster, data, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(data / "train", root)
    bad = sorted(root.iterdir())[0]
    path = bad / "VV_dB.tif"
    path.write_bytes(path.read_bytes()[: 4000])
    with pytest.raises(ChipReadError, match=f"scene {bad.name}: cannot read VV_dB.tif"):
        chip_scenes(root, data / "labels" / "train.csv", tmp_path / "o1", PARAMS, select="all")
    summary = chip_scenes(root, data / "labels" / "train.csv", tmp_path / "o2", PARAMS,
                          select="all", on_error="skip")
    assert list(summary["errors"]) == [bad.name] and summary["scenes_done"] == 1


def test_label_csv_with_missing_columns(tmp_path):
    path = tmp_path / "bad.csv"
    pd.DataFrame({"scene_id": ["x"], "detect_scene_row": [1]}).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"bad.csv: missing label columns \['detect_lat'"):
        read_labels(path)


def test_progress_counts_strips_scenes_and_chips(data, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="raybench.progress"):
        summary = chip_scenes(data / "train", data / "labels" / "train.csv", tmp_path, PARAMS,
                              select="all", runner="local")
    lines = [m for m in caplog.messages if m.startswith("progress: strips")]
    assert lines and lines[-1].startswith(f"progress: strips {len(lines)}/{len(lines)} (100%)")
    assert lines[-1].endswith(f"2/2 scenes, {summary['chips']} chips")


def test_one_scene_reused_reads_as_fresh_reads(data):
    """A Scene's open files and reused arrays give what a fresh read gives, whichever window
    came before: (1, [0, 1]) and (2, [1, 2]) share an array shape, the second padded past the
    scene's bottom and right edges, then (0, [0, 1]) must overwrite that padding."""
    scene_dir = sorted((data / "train").iterdir())[0]
    order = [(1, [0, 1]), (2, [1, 2]), (0, [0, 1]), (2, [2]), (1, [1, 2]), (0, [2])]
    with Scene(scene_dir) as scene:
        for strip, cols in order:
            got = [a.copy() for a in scene.read(strip, cols, PARAMS)]
            want = read_strip(scene_dir, strip, cols, PARAMS)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_in_place_standardising_is_bit_equal_to_normalize():
    rng = np.random.default_rng(0)
    raw = rng.normal(-20, 6, size=(64, 64)).astype(np.float32)
    raw[rng.random((64, 64)) < 0.1] = x3.NODATA
    invalid = raw == x3.NODATA
    for channel in ("vh", "vv", "bathymetry"):
        out = np.empty_like(raw)
        _standardize(raw, channel, invalid, out)
        np.testing.assert_array_equal(out, normalize(raw, channel, ~invalid, "standard"))


def test_row_interpolation_by_segments_matches_gathering_both_neighbours():
    rng = np.random.default_rng(1)
    coarse = rng.normal(size=(6, 40)).astype(np.float32)
    for start in (0, 30, 180):  # fine rows from the top, the middle, and clamped at the bottom
        pos = np.clip((np.arange(start, start + 120) + 0.5) / x3.COARSE_FACTOR - 0.5, 0, 5)
        i0 = np.floor(pos).astype(int)
        i1, wt = np.minimum(i0 + 1, 5), (pos - i0)[:, None]
        gathered = coarse[i0] * (1 - wt) + coarse[i1] * wt  # both neighbours of every row
        np.testing.assert_allclose(interp_rows(coarse, pos), gathered, rtol=0, atol=1e-5)


@pytest.mark.parametrize("compress", [None, "deflate"])
@pytest.mark.parametrize("tiled", [True, False])
def test_local_rasters_read_directly_equal_what_gdal_reads(tmp_path, compress, tiled):
    """Local files are opened with GTIFF_DIRECT_IO; GDAL falls back to its own path where that
    does not apply (compressed, striped), and windows come back the same either way."""
    a = np.random.default_rng(0).normal(size=(300, 340)).astype(np.float32)
    path = tmp_path / "band.tif"
    profile = {"driver": "GTiff", "height": 300, "width": 340, "count": 1, "dtype": "float32",
               "tiled": tiled, **({"blockxsize": 128, "blockysize": 128} if tiled else {}),
               **({"compress": compress} if compress else {})}
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(a, 1)
    with _open(str(path)) as src:
        np.testing.assert_array_equal(src.read(1, window=Window(30, 70, 250, 200)),
                                      a[70:270, 30:280])

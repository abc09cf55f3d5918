"""The xView3 data layout (../shared/specs/xview3.md): file names, channels, label schema, ids.

Owns the constants every reader and writer of xView3-style data shares, and small helpers to
find scenes and read their shoreline contours. Generation lives in synth_xview3.py, chipping in
chip.py; both import their layout facts from here only.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

NODATA = -32768.0
SCALE_10M = 10.0  # metres per pixel of the full grid
COARSE_FACTOR = 50  # 500 m rasters: ceil(rows / 50) x ceil(cols / 50)

# channel name -> file name; the first two are on the 10 m grid, the rest on the 500 m grid
CHANNEL_FILES = {
    "vh": "VH_dB.tif",
    "vv": "VV_dB.tif",
    "bathymetry": "bathymetry.tif",
    "owimask": "owiMask.tif",
    "wind_speed": "owiWindSpeed.tif",
    "wind_direction": "owiWindDirection.tif",
    "wind_quality": "owiWindQuality.tif",
}
FINE_CHANNELS = ("vh", "vv")

LABEL_COLUMNS = [
    "detect_lat", "detect_lon", "vessel_length_m", "source", "detect_scene_row",
    "detect_scene_column", "is_vessel", "is_fishing", "distance_from_shore_km", "scene_id",
    "confidence", "top", "left", "bottom", "right", "detect_id",
]
PREDICTION_COLUMNS = ["detect_scene_row", "detect_scene_column", "scene_id", "is_vessel",
                      "is_fishing", "vessel_length_m"]
SPLITS = {"train": "t", "validation": "v"}
SCENE_ID = re.compile(r"^[0-9a-f]{16}[tv]$")

# Classes used by detectors (spec section 2).
BACKGROUND, FISHING, NON_FISHING, NON_VESSEL = 0, 1, 2, 3


def coarse_shape(rows: int, cols: int) -> tuple[int, int]:
    return -(-rows // COARSE_FACTOR), -(-cols // COARSE_FACTOR)


def scene_dirs(root: Path) -> list[Path]:
    """Scene folders of a split root, sorted; anything else in the root is an error."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"scene directory {root} does not exist")
    out = []
    for p in sorted(root.iterdir()):
        if not (p.is_dir() and SCENE_ID.match(p.name)):
            raise ValueError(f"{p}: not a scene folder (expected 16 hex characters + t/v)")
        out.append(p)
    return out


def shoreline_path(shore_root: Path, scene_id: str) -> Path:
    return Path(shore_root) / f"{scene_id}_shoreline.npy"


def load_shoreline(path: Path) -> list[np.ndarray]:
    """Contours of (row, col) points. The real files are numpy object arrays, which numpy can
    only read with allow_pickle; each element is checked to be a plain (N, 2) number array."""
    arr = np.load(path, allow_pickle=True)
    contours = [np.asarray(c, dtype=np.float64) for c in arr]
    for c in contours:
        if c.ndim != 2 or c.shape[1] != 2:
            raise ValueError(f"{path}: a contour has shape {c.shape}, expected (N, 2)")
    return contours


def save_shoreline(path: Path, contours: list[np.ndarray]) -> None:
    arr = np.empty(len(contours), dtype=object)
    for i, c in enumerate(contours):
        arr[i] = np.asarray(c, dtype=np.float32)
    np.save(path, arr, allow_pickle=True)


def distance_to_shore_px(rows: np.ndarray, cols: np.ndarray,
                         contours: list[np.ndarray]) -> np.ndarray:
    """Euclidean distance in pixels from each (row, col) to the nearest contour point."""
    from scipy.spatial import cKDTree

    points = np.concatenate(contours) if contours else np.empty((0, 2))
    if len(points) == 0:
        return np.full(len(rows), np.inf)
    if len(rows) == 0:
        return np.empty(0)
    dist, _ = cKDTree(points).query(np.column_stack([rows, cols]).astype(np.float64))
    return np.asarray(dist, dtype=np.float64)

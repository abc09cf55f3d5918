"""The xView3 data layout (../shared/specs/xview3.md): file names, channels, label schema, ids.

Owns the constants every reader and writer of xView3-style data shares, and small helpers to
find scenes and read their shoreline contours. Generation lives in synth_xview3.py, chipping in
chip.py; both import their layout facts from here only.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import numpy as np

from raybench import store

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


def scene_dirs(root: str | Path) -> list[str]:
    """Scene folders of a split root (a local path or a storage URI), sorted; anything else in
    the root is an error."""
    if not store.is_dir(root):
        raise FileNotFoundError(f"scene directory {root} does not exist")
    out = []
    for entry, is_folder in store.list_dir(root):
        if not (is_folder and SCENE_ID.match(entry)):
            raise ValueError(f"{store.join(root, entry)}: not a scene folder (expected 16 hex "
                             "characters + t/v)")
        out.append(store.join(root, entry))
    return out


def shoreline_path(shore_root: str | Path, scene_id: str) -> str:
    return store.join(shore_root, f"{scene_id}_shoreline.npy")


# What a pickled numpy array of arrays may name, in numpy 1 and 2 spellings: nothing else is
# constructed, so a crafted file cannot call code (np.load(allow_pickle=True) calls anything).
_ARRAY_PICKLE = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}


class _ArrayUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in _ARRAY_PICKLE:
            raise ValueError(f"{self.path}: refused to load: the file names {module}.{name}, "
                             "and a shoreline file holds only numpy arrays. Fix: use the "
                             "dataset's own shoreline files, or rewrite this one with "
                             "raybench.data.xview3.save_shoreline")
        return super().find_class(module.replace("numpy.core.", "numpy._core."), name)


def _load_object_npy(path: str | Path) -> np.ndarray:
    """An .npy file, its object arrays unpickled with numpy's array reconstruction only."""
    with io.BytesIO(store.read_bytes(path)) as f:  # a shoreline file is kilobytes
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f"{path}: .npy format {version} is not one numpy writes for arrays "
                             "of contours (1.0 or 2.0)")
        _, _, dtype = read_header(f)
        if not dtype.hasobject:
            f.seek(0)
            return np.load(f, allow_pickle=False)
        arr = _ArrayUnpickler(f, path).load()
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{path}: holds {type(arr).__name__}, not an array of contours")
    return arr


def load_shoreline(path: str | Path) -> list[np.ndarray]:
    """Contours of (row, col) points. The real files are numpy object arrays (pickled); they
    are read by an unpickler that admits numpy's array reconstruction and nothing else, and
    each element is checked to be a plain (N, 2) number array."""
    arr = _load_object_npy(path)
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
    from scipy.spatial import cKDTree  # scipy.spatial: only where shorelines are matched

    points = np.concatenate(contours) if contours else np.empty((0, 2))
    if len(points) == 0:
        return np.full(len(rows), np.inf)
    if len(rows) == 0:
        return np.empty(0)
    dist, _ = cKDTree(points).query(np.column_stack([rows, cols]).astype(np.float64))
    return np.asarray(dist, dtype=np.float64)

"""Reading chips out of a scene with bounded memory: one strip of chip rows at a time.

Owns the chip grid (row-major, `chip_size` with `overlap`), windowed rasterio reads of the 10 m
bands, bilinear resampling of the 500 m bands onto the 10 m grid from a few coarse rows, the
two normalisations and the per-chip validity mask. `Scene` keeps a scene's files open and its
arrays allocated across a task's reads; a read is a function of (scene, strip, params): the Ray
Data path and the single-process check call the same code.

Normalisation modes:
- `reference`: what the public xView3 reference does: pad with 0, clip VH/VV below -50 dB (which
  also turns nodata into -50), then min-max scale each channel per chip (a constant chip gives 0
  here, not NaN).
- `standard` (default): nodata and padding are masked (mask 0, value 0), VH/VV are standardised
  with fixed dB statistics of real scenes and the 500 m channels with fixed physical scales, so
  a pixel means the same in every chip and padding is no bright artefact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import rasterio
from rasterio.windows import Window

from raybench import store
from raybench.data import resample
from raybench.data import xview3 as x3

# (offset, scale) for `standard`: value -> (value - offset) / scale. dB statistics from the spec
# (VH -26.3 +/- 5.0, VV -16.4 +/- 4.8); physical scales for the rest.
STANDARD = {
    "vh": (-26.3, 5.0), "vv": (-16.4, 4.8), "bathymetry": (0.0, 1000.0), "owimask": (0.0, 1.0),
    "wind_speed": (7.0, 4.0), "wind_direction": (180.0, 180.0), "wind_quality": (0.0, 3.0),
}


@dataclass(frozen=True)
class ChipParams:
    chip_size: int = 800
    overlap: int = 0
    channels: tuple[str, ...] = ("vh", "vv", "bathymetry")
    normalize: Literal["standard", "reference"] = "standard"

    @property
    def stride(self) -> int:
        return self.chip_size - self.overlap

    def grid(self, rows: int, cols: int) -> tuple[int, int]:
        """Chips per axis; the last chip of each axis is padded past the scene edge."""
        return (max(1, math.ceil((rows - self.overlap) / self.stride)),
                max(1, math.ceil((cols - self.overlap) / self.stride)))

    def validate(self) -> None:
        if self.chip_size < 16:
            raise ValueError(f"chip_size={self.chip_size}: must be >= 16")
        if not 0 <= self.overlap < self.chip_size:
            raise ValueError(f"overlap={self.overlap}: must be in [0, chip_size)")
        unknown = [c for c in self.channels if c not in x3.CHANNEL_FILES]
        if unknown or not self.channels:
            raise ValueError(f"channels={list(self.channels)}: unknown {unknown}; "
                             f"choose from {list(x3.CHANNEL_FILES)}")


def scene_shape(scene_dir: str | Path) -> tuple[int, int]:
    with Scene(scene_dir) as scene:
        return scene.shape


class Scene:
    """A scene's rasters, each opened once for all the reads of a task, and the arrays its reads
    fill, allocated once. An open costs about a millisecond (120 of them per 100 chips when each
    read opened its own), and over a URI an open dataset keeps the tiles that neighbouring
    windows share. Fresh arrays for every read made a new worker's first strips 3-4x slower
    than its later ones (`bench chips`: every new page is a fault, and a costly one in a VM)."""

    def __init__(self, scene_dir: str | Path):
        self.dir = str(scene_dir)
        self._open: dict[str, rasterio.DatasetReader] = {}
        self._buffers: dict[tuple, np.ndarray] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """The scene's array `name` of this shape, reused by every read that needs it."""
        key = (name, shape, np.dtype(dtype).str)
        if key not in self._buffers:
            self._buffers[key] = np.empty(shape, dtype=dtype)
        return self._buffers[key]

    def band(self, channel: str) -> rasterio.DatasetReader:
        if channel not in self._open:
            self._open[channel] = _open(store.join(self.dir, x3.CHANNEL_FILES[channel]))
        return self._open[channel]

    @property
    def shape(self) -> tuple[int, int]:
        src = self.band("vh")
        return src.height, src.width

    def read(self, strip: int, chip_cols: list[int], params: ChipParams,
             clock: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Chips `chip_cols` of chip row `strip`: data (n, C, H, W) float32, mask (n, H, W)
        uint8, in the scene's buffers (the next read overwrites them). Reads only the columns
        those chips span, so callers bound memory by asking for a few chips at a time whatever
        the scene's width. `clock`, if given, gathers seconds per phase (`read`, `resample`,
        `normalize`): where a chip's time goes (`bench chips`)."""
        rows, cols = self.shape
        size, stride = params.chip_size, params.stride
        r0, c0 = strip * stride, min(chip_cols) * stride
        c1 = max(chip_cols) * stride + size
        bands = [self._read_band(ch, r0, size, c0, c1, rows, cols, clock)
                 for ch in params.channels]
        with timed(clock, "normalize"):
            return self._assemble(bands, chip_cols, params)

    def _read_band(self, channel: str, r0: int, height: int, c0: int, c1: int, rows: int,
                   cols: int, clock: dict[str, float] | None) -> np.ndarray:
        """Rows [r0, r0+height) x cols [c0, c1) of a channel on the 10 m grid, nodata-padded."""
        h, w = min(height, rows - r0), min(c1, cols) - c0
        out = self.buffer(channel, (height, c1 - c0), np.float32)
        if h < height or w < c1 - c0:  # only a window past the scene's edge has padding
            out.fill(x3.NODATA)
        if h <= 0 or w <= 0:
            return out
        src = self.band(channel)
        try:
            if channel in x3.FINE_CHANNELS:
                with timed(clock, "read"):
                    inside = out[:h, :w]
                    if inside.flags.c_contiguous:  # straight into place, no copy
                        src.read(1, window=Window(c0, r0, w, h), out=inside)
                    else:
                        inside[:] = src.read(1, window=Window(c0, r0, w, h))
            else:
                _resample(src, r0, h, c0, w, out[:h, :w], clock)
        except rasterio.errors.RasterioError as e:  # truncated or corrupt tiles
            raise ChipReadError(f"scene {store.name(self.dir)}: cannot read "
                                f"{x3.CHANNEL_FILES[channel]} ({e})") from None
        return out

    def _assemble(self, bands: list[np.ndarray], chip_cols: list[int], params: ChipParams
                  ) -> tuple[np.ndarray, np.ndarray]:
        size, stride, n = params.chip_size, params.stride, len(chip_cols)
        c0 = min(chip_cols) * stride
        data = self.buffer("data", (n, len(bands), size, size), np.float32)
        mask = self.buffer("mask", (n, size, size), np.uint8)
        invalid = self.buffer("invalid", (size, size), bool)
        scratch = self.buffer("scratch", (size, size), bool)
        for k, j in enumerate(chip_cols):
            sl = slice(j * stride - c0, j * stride - c0 + size)
            np.equal(bands[0][:, sl], x3.NODATA, out=invalid)
            for band in bands[1:]:
                invalid |= np.equal(band[:, sl], x3.NODATA, out=scratch)
            valid = np.logical_not(invalid, out=mask[k].view(bool))
            for b, (ch, band) in enumerate(zip(params.channels, bands, strict=True)):
                if params.normalize == "standard":
                    _standardize(band[:, sl], ch, invalid, data[k, b])
                else:
                    data[k, b] = normalize(band[:, sl], ch, valid, params.normalize)
        return data, mask

    def close(self) -> None:
        for src in self._open.values():
            src.close()
        self._open.clear()

    def __enter__(self) -> Scene:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_strip(scene_dir: str | Path, strip: int, chip_cols: list[int], params: ChipParams,
               clock: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`Scene.read` for one call (the scene's files opened and closed around it)."""
    with Scene(scene_dir) as scene:
        return scene.read(strip, chip_cols, params, clock)


def _standardize(raw: np.ndarray, channel: str, invalid: np.ndarray, out: np.ndarray) -> None:
    """`normalize(..., "standard")` written into `out` in place: the same float32 operations
    in the same order (so the same bits) without its three chip-sized temporaries, which made
    normalising the largest share of a strip task's arithmetic."""
    offset, scale = STANDARD[channel]
    np.subtract(raw, offset, out=out)
    np.divide(out, scale, out=out)
    if invalid.any():
        out[invalid] = 0.0


def normalize(raw: np.ndarray, channel: str, valid: np.ndarray, mode: str) -> np.ndarray:
    """One chip's channel in `mode`, as a new array: the definition. The stage writes
    `standard` chips through `_standardize` instead, bit-equal (tests/data/test_chip.py)."""
    if mode == "reference":
        x = np.where(raw == x3.NODATA, -50.0 if channel in x3.FINE_CHANNELS else 0.0, raw)
        if channel in x3.FINE_CHANNELS:
            x = np.maximum(x, -50.0)
        lo, hi = float(x.min()), float(x.max())
        return ((x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)).astype(np.float32)
    offset, scale = STANDARD[channel]
    return np.where(valid, (raw - offset) / scale, 0.0).astype(np.float32)


@contextmanager
def timed(clock: dict[str, float] | None, phase: str) -> Iterator[None]:
    """Adds the block's seconds to clock[phase] (nothing when clock is None)."""
    if clock is None:
        yield
        return
    t = time.perf_counter()
    try:
        yield
    finally:
        clock[phase] = clock.get(phase, 0.0) + time.perf_counter() - t


def _resample(src, r0: int, h: int, c0: int, w: int, out: np.ndarray,
              clock: dict[str, float] | None = None) -> None:
    """Bilinear 500 m -> 10 m for fine rows [r0, r0+h), cols [c0, c0+w) into `out` (h x w),
    reading only the coarse rows they need (resample.py does the arithmetic)."""
    top, bottom, y, x = resample.coarse_span(src.height, src.width, r0, h, c0, w)
    with timed(clock, "read"):
        coarse = src.read(1, window=Window(0, top, src.width, bottom - top + 1))
    with timed(clock, "resample"):
        resample.bilinear(coarse, y - top, x, out)


def _open(path: str):
    """rasterio.open (a local path or a URI) with an error that names the scene and the file.

    A local file is read with GTIFF_DIRECT_IO: windows of an uncompressed GeoTIFF go straight
    into the caller's array instead of through GDAL's block cache, which otherwise grows by
    every tile a task reads (fresh memory; `bench chips` measured a task's reads at 0.5-0.6 s
    for 200 chips this way against 0.85-2.7 s through the cache). Over a URI, where a tile is a
    request, the cache stays."""
    try:
        if store.is_uri(path):
            return rasterio.open(store.raster_path(path))
        with rasterio.Env(GTIFF_DIRECT_IO=True):  # read by GDAL when the file is opened
            return rasterio.open(path)
    except rasterio.errors.RasterioIOError as e:
        raise ChipReadError(f"scene {store.name(store.parent(path))}: cannot read "
                            f"{store.name(path)} ({e})") from None


class ChipReadError(RuntimeError):
    """A scene's raster is missing or corrupt; the message names the scene and the file."""

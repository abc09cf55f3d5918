"""Reading chips out of a scene with bounded memory: one strip of chip rows at a time.

Owns the chip grid (row-major, `chip_size` with `overlap`), windowed rasterio reads of the 10 m
bands, bilinear resampling of the 500 m bands onto the 10 m grid from a few coarse rows, the
two normalisations and the per-chip validity mask. Pure functions of (scene, strip, params): the
Ray Data path and the single-process check call the same code.

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
    path = store.join(scene_dir, x3.CHANNEL_FILES["vh"])
    with _open(path) as src:
        return src.height, src.width


def read_strip(scene_dir: str | Path, strip: int, chip_cols: list[int], params: ChipParams,
               clock: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Chips `chip_cols` of chip row `strip`: data (n, C, H, W) float32, mask (n, H, W) uint8.

    Reads only the columns those chips span, so callers bound memory by asking for a few chips
    at a time whatever the scene's width. `clock`, if given, gathers seconds per phase
    (`read`, `resample`, `normalize`): where a chip's time goes (`bench chips`)."""
    rows, cols = scene_shape(scene_dir)
    size, stride = params.chip_size, params.stride
    r0, c0 = strip * stride, min(chip_cols) * stride
    c1 = max(chip_cols) * stride + size
    bands = [_read_band(str(scene_dir), ch, r0, size, c0, c1, rows, cols, clock)
             for ch in params.channels]
    with timed(clock, "normalize"):
        return _assemble(bands, chip_cols, params)


def _assemble(bands: list[np.ndarray], chip_cols: list[int], params: ChipParams
              ) -> tuple[np.ndarray, np.ndarray]:
    size, stride = params.chip_size, params.stride
    c0 = min(chip_cols) * stride
    data = np.empty((len(chip_cols), len(bands), size, size), dtype=np.float32)
    mask = np.empty((len(chip_cols), size, size), dtype=np.uint8)
    for k, j in enumerate(chip_cols):
        sl = slice(j * stride - c0, j * stride - c0 + size)
        valid = np.ones((size, size), dtype=bool)
        for band in bands:
            valid &= band[:, sl] != x3.NODATA
        for b, (ch, band) in enumerate(zip(params.channels, bands, strict=True)):
            data[k, b] = normalize(band[:, sl], ch, valid, params.normalize)
        mask[k] = valid
    return data, mask


def normalize(raw: np.ndarray, channel: str, valid: np.ndarray, mode: str) -> np.ndarray:
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


def _read_band(scene_dir: str, channel: str, r0: int, height: int, c0: int, c1: int,
               rows: int, cols: int, clock: dict[str, float] | None = None) -> np.ndarray:
    """Rows [r0, r0+height) x cols [c0, c1) of a channel on the 10 m grid, nodata-padded."""
    path = store.join(scene_dir, x3.CHANNEL_FILES[channel])
    out = np.full((height, c1 - c0), x3.NODATA, dtype=np.float32)
    h, w = min(height, rows - r0), min(c1, cols) - c0
    if h <= 0 or w <= 0:
        return out
    with _open(path) as src:
        try:
            if channel in x3.FINE_CHANNELS:
                with timed(clock, "read"):
                    out[:h, :w] = src.read(1, window=Window(c0, r0, w, h))
            else:
                out[:h, :w] = _resample(src, r0, h, c0, w, clock)
        except rasterio.errors.RasterioError as e:  # truncated or corrupt tiles
            raise ChipReadError(f"scene {store.name(scene_dir)}: cannot read "
                                f"{store.name(path)} ({e})") from None
    return out


def _resample(src, r0: int, h: int, c0: int, w: int,
              clock: dict[str, float] | None = None) -> np.ndarray:
    """Bilinear 500 m -> 10 m for fine rows [r0, r0+h), cols [c0, c0+w), reading only the
    coarse rows they need. Pixel centres map as (i + 0.5) / 50 - 0.5 in coarse index space
    (clamped at the edges). Nodata neighbours get no weight and a fine pixel with only nodata
    neighbours stays nodata: bilinear weights are separable, so the weighted sum of valid values
    and the sum of valid weights are each two 1-D interpolations, rows first (few coarse rows)."""
    f = x3.COARSE_FACTOR
    y = np.clip((np.arange(r0, r0 + h) + 0.5) / f - 0.5, 0, src.height - 1)
    x = np.clip((np.arange(c0, c0 + w) + 0.5) / f - 0.5, 0, src.width - 1)
    top = int(np.floor(y[0]))
    bottom = min(src.height - 1, int(np.floor(y[-1])) + 1)
    with timed(clock, "read"):
        coarse = src.read(1, window=Window(0, top, src.width, bottom - top + 1))
    with timed(clock, "resample"):
        # columns first, on the few coarse rows, then rows: a row gather copies whole rows,
        # where a column gather over the fine window was half the resampling time
        good = coarse != x3.NODATA
        if good.all():  # the usual window: every weight is valid, no normalising sum
            return _interp(_interp(coarse.astype(np.float32), x, 1), y - top, 0)
        good = good.astype(np.float32)
        num = _interp(_interp(np.where(good > 0, coarse, 0).astype(np.float32), x, 1),
                      y - top, 0)
        den = _interp(_interp(good, x, 1), y - top, 0)
        return np.where(den > 1e-6, num / np.maximum(den, 1e-6), x3.NODATA).astype(np.float32)


def _interp(a: np.ndarray, pos: np.ndarray, axis: int) -> np.ndarray:
    """Linear interpolation of `a` at fractional indices `pos` along `axis`."""
    i0 = np.floor(pos).astype(int)
    i1 = np.minimum(i0 + 1, a.shape[axis] - 1)
    wt = (pos - i0).astype(np.float32)
    if axis == 0:
        return a[i0] * (1 - wt)[:, None] + a[i1] * wt[:, None]
    return a[:, i0] * (1 - wt)[None, :] + a[:, i1] * wt[None, :]


def _open(path: str):
    """rasterio.open (a local path or a URI) with an error that names the scene and the file."""
    try:
        return rasterio.open(store.raster_path(path))
    except rasterio.errors.RasterioIOError as e:
        raise ChipReadError(f"scene {store.name(store.parent(path))}: cannot read "
                            f"{store.name(path)} ({e})") from None


class ChipReadError(RuntimeError):
    """A scene's raster is missing or corrupt; the message names the scene and the file."""

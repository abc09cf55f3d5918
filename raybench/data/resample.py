"""Bilinear resampling of a 500 m band onto the 10 m grid, from the few coarse rows it needs.

Pure NumPy, no I/O: chipread.py reads the coarse rows `coarse_span` names and hands them here.
Pixel centres map as (i + 0.5) / 50 - 0.5 in coarse index space (clamped at the edges). Nodata
neighbours get no weight and a fine pixel with only nodata neighbours stays nodata: bilinear
weights are separable, so the weighted sum of valid values and the sum of valid weights are
each two 1-D interpolations, columns first (on the few coarse rows).
"""

from __future__ import annotations

import numpy as np

from raybench.data import xview3 as x3


def coarse_span(height: int, width: int, r0: int, h: int, c0: int, w: int
                ) -> tuple[int, int, np.ndarray, np.ndarray]:
    """For fine rows [r0, r0+h) and cols [c0, c0+w) of a coarse band `height` x `width`: the
    first and last coarse rows they need, and their fractional coarse row and column
    indices."""
    f = x3.COARSE_FACTOR
    y = np.clip((np.arange(r0, r0 + h) + 0.5) / f - 0.5, 0, height - 1)
    x = np.clip((np.arange(c0, c0 + w) + 0.5) / f - 0.5, 0, width - 1)
    top = int(np.floor(y[0]))
    return top, min(height - 1, int(np.floor(y[-1])) + 1), y, x


def bilinear(coarse: np.ndarray, y: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """`coarse` (the needed rows) at fractional rows `y` (relative to its first) and columns
    `x`, written into `out`; nodata weighs nothing."""
    # columns first, on the few coarse rows, then rows: a row gather copies whole rows,
    # where a column gather over the fine window was half the resampling time
    good = coarse != x3.NODATA
    if good.all():  # the usual window: every weight is valid, no normalising sum
        interp_rows(interp_cols(coarse.astype(np.float32), x), y, out)
        return
    good = good.astype(np.float32)
    num = interp_rows(interp_cols(np.where(good > 0, coarse, 0).astype(np.float32), x), y)
    den = interp_rows(interp_cols(good, x), y)
    out[:] = np.where(den > 1e-6, num / np.maximum(den, 1e-6), x3.NODATA)


def interp_cols(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Linear interpolation of `a` at fractional column indices `pos` (a few rows: a gather of
    both neighbours costs nothing here)."""
    i0 = np.floor(pos).astype(int)
    i1 = np.minimum(i0 + 1, a.shape[1] - 1)
    wt = (pos - i0).astype(np.float32)
    return a[:, i0] * (1 - wt)[None, :] + a[:, i1] * wt[None, :]


def interp_rows(a: np.ndarray, pos: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Linear interpolation of `a` at fractional row indices `pos` (ascending), as
    a[k] + w * (a[k+1] - a[k]): the fine rows between two coarse rows (50 of them at 500 m ->
    10 m) are one outer product added to a row, written in place, where gathering both
    neighbours of every row took five window-sized passes (0.27 -> 0.12 s per 100 chips).
    Rounded differently from the gather (float32 ulps). Into `out` if given."""
    i0 = np.floor(pos).astype(int)
    wt = (pos - i0).astype(np.float32)
    if out is None:
        out = np.empty((len(pos), a.shape[1]), dtype=np.float32)
    step = np.diff(a, axis=0)
    starts = np.flatnonzero(np.diff(i0, prepend=-1))
    for lo, hi in zip(starts, [*starts[1:], len(pos)], strict=True):
        k = i0[lo]
        if k + 1 < len(a):
            np.multiply.outer(wt[lo:hi], step[k], out=out[lo:hi])
            out[lo:hi] += a[k]
        else:  # clamped at the last coarse row: its weight is 0
            out[lo:hi] = a[k]
    return out

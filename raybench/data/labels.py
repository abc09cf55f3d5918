"""xView3 labels: reading a label CSV strictly, and converting labels to chip coordinates.

Owns the label file's validation (all 16 columns, positions present and non-negative, booleans
that may be empty) and the (label, chip) table: in-chip row/col, a box (the label's own where
known, else the reference's fixed 10 px square) and the detector class.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from raybench import store
from raybench.data import xview3 as x3
from raybench.data.chipread import ChipParams

REFERENCE_BOX_PX = 10  # the reference's fixed square box around a point label


def chip_labels(chips: pd.DataFrame, labels: pd.DataFrame, params: ChipParams) -> pd.DataFrame:
    """One row per (label, chip containing it): in-chip position, box and detector class."""
    if chips.empty or labels.empty:
        return pd.DataFrame()
    m = labels.merge(chips[["scene_id", "chip_index", "row_off", "col_off"]], on="scene_id")
    r = m["detect_scene_row"] - m["row_off"]
    c = m["detect_scene_column"] - m["col_off"]
    m = m[(r >= 0) & (r < params.chip_size) & (c >= 0) & (c < params.chip_size)].copy()
    m["chip_row_px"] = m["detect_scene_row"] - m["row_off"]
    m["chip_col_px"] = m["detect_scene_column"] - m["col_off"]
    half = REFERENCE_BOX_PX / 2
    known = m[["top", "left", "bottom", "right"]].notna().all(axis=1)
    m["box_top"] = np.where(known, m["top"] - m["row_off"], m["chip_row_px"] - half)
    m["box_left"] = np.where(known, m["left"] - m["col_off"], m["chip_col_px"] - half)
    m["box_bottom"] = np.where(known, m["bottom"] - m["row_off"], m["chip_row_px"] + half)
    m["box_right"] = np.where(known, m["right"] - m["col_off"], m["chip_col_px"] + half)
    m["label_class"] = np.select(
        [m["is_vessel"].eq(False).fillna(False), m["is_fishing"].eq(True).fillna(False)],
        [x3.NON_VESSEL, x3.FISHING], x3.NON_FISHING)
    return m.drop(columns=["row_off", "col_off"]).reset_index(drop=True)


def read_labels(path: str | Path) -> pd.DataFrame:
    """A label CSV (a local path or a storage URI) with the 16 columns; missing columns or bad
    values are a clear error."""
    try:
        source = io.BytesIO(store.read_bytes(path)) if store.is_uri(path) else path
        df = pd.read_csv(source, dtype={"scene_id": str, "detect_id": str})
    except (OSError, pd.errors.ParserError) as e:
        raise ValueError(f"{path}: cannot be read as a label CSV ({e})") from None
    missing = [c for c in x3.LABEL_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing label columns {missing}; a label CSV has "
                         f"{x3.LABEL_COLUMNS}")
    for col in ("detect_scene_row", "detect_scene_column"):
        bad = df[col].isna() | (pd.to_numeric(df[col], errors="coerce") < 0)
        if bad.any():
            raise ValueError(f"{path}: column {col} has missing or negative values in rows "
                             f"{list(df.index[bad][:5] + 2)} (file lines)")
    for col in ("is_vessel", "is_fishing"):
        df[col] = df[col].map({True: True, False: False, "True": True, "False": False})
        df[col] = df[col].astype("boolean")
    return df

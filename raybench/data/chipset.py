"""Chips as a torch Dataset for detection: images, boxes and classes out of a chip directory.

Owns reading what `data/chip.py` wrote (`chips.parquet`, `chip_labels.parquet`, Parquet shards)
one row group at a time, so a DataLoader worker holds a few chips, never a scene; and the
detection collate. Boxes are widened to MIN_BOX_PX and clipped to the chip (every label's
point lies inside its chip, so nothing is dropped). Does not own chipping (chip.py) or the
model (the workload).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from raybench import store

# Boxes thinner than this are widened about their centre: a vessel seen end-on is a 1-2 px
# sliver, which no anchor can match (the smallest anchors are several pixels).
MIN_BOX_PX = 4.0


class ChipSet(Dataset):
    """(image C x H x W float32, target {boxes (x1, y1, x2, y2), labels}, chip meta) items."""

    def __init__(self, root: str | Path, chip_size: int, channels: int):
        self.root = store.identity(root)  # a local folder or a storage URI (raybench/store.py)
        self.chip_size, self.channels = chip_size, channels
        chips = store.read_parquet(store.join(self.root, "chips.parquet"))
        if chips.empty:
            raise ValueError(f"{self.root}: no chips (chips.parquet is empty)")
        self.chips = chips.sort_values(["scene_id", "chip_index"]).reset_index(drop=True)
        self._where = self._locate()
        labels = store.read_parquet(store.join(self.root, "chip_labels.parquet"))
        self._boxes: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        if not labels.empty:
            for (sid, idx), g in labels.groupby(["scene_id", "chip_index"]):
                xyxy = g[["box_left", "box_top", "box_right", "box_bottom"]].to_numpy(np.float32)
                self._boxes[(sid, int(idx))] = (xyxy, g["label_class"].to_numpy(np.int64))
        self._cache: tuple[tuple[str, int], Any] | None = None

    def _locate(self) -> list[tuple[str, int, int]]:
        """(shard, row group, row in group) of every chip, from each shard's own chip_index."""
        place: dict[tuple[str, int], tuple[str, int, int]] = {}
        for shard in self.chips["shard"].unique():
            f = pq.ParquetFile(store.open_input(store.join(self.root, shard)))
            for g in range(f.num_row_groups):
                idx = f.read_row_group(g, columns=["scene_id", "chip_index"]).to_pydict()
                for k, (sid, ci) in enumerate(zip(idx["scene_id"], idx["chip_index"],
                                                  strict=True)):
                    place[(sid, ci)] = (shard, g, k)
        return [place[(r.scene_id, r.chip_index)] for r in self.chips.itertuples()]

    def __len__(self) -> int:
        return len(self.chips)

    def meta(self, i: int) -> dict[str, Any]:
        r = self.chips.iloc[i]
        return {"scene_id": r.scene_id, "chip_index": int(r.chip_index),
                "row_off": int(r.row_off), "col_off": int(r.col_off)}

    def target(self, i: int) -> dict[str, torch.Tensor]:
        r = self.chips.iloc[i]
        xyxy, cls = self._boxes.get((r.scene_id, int(r.chip_index)),
                                    (np.zeros((0, 4), np.float32), np.zeros(0, np.int64)))
        xyxy = xyxy.copy()
        for lo, hi in ((0, 2), (1, 3)):
            mid = (xyxy[:, lo] + xyxy[:, hi]) / 2
            half = np.maximum(xyxy[:, hi] - xyxy[:, lo], MIN_BOX_PX) / 2
            xyxy[:, lo], xyxy[:, hi] = mid - half, mid + half
        xyxy = np.clip(xyxy, 0, self.chip_size)
        return {"boxes": torch.from_numpy(xyxy), "labels": torch.from_numpy(cls.copy())}

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        shard, group, row = self._where[i]
        if self._cache is None or self._cache[0] != (shard, group):
            table = pq.ParquetFile(store.open_input(store.join(self.root, shard))
                                   ).read_row_group(group, columns=["data"])
            self._cache = ((shard, group), table.column("data"))
        raw = self._cache[1][row].as_py()
        c, s = self.channels, self.chip_size
        image = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).reshape(c, s, s).copy())
        return image, self.target(i), self.meta(i)


def collate(batch: list[tuple[Any, ...]]) -> tuple[list, list, list]:
    """Detection batches are lists: torchvision's detector takes a list of images and targets."""
    images, targets, metas = zip(*batch, strict=True)
    return list(images), list(targets), list(metas)


def chip_params_of(root: str | Path) -> dict[str, Any]:
    """The chip parameters a directory was written with (chip.py's `chip_params.json`)."""
    path = store.join(root, "chip_params.json")
    if not store.is_file(path):
        raise ValueError(f"{root}: no chip_params.json; this is not a chip directory written "
                         "by raybench.data.chip (run the chipping stage first)")
    return json.loads(store.read_text(path))

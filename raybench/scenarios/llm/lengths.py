"""Request lengths: fixed (`inference.input_tokens` / `output_tokens`) or drawn, request by
request, from a file of a dataset's token counts (`inference.lengths_file`).

The file is a CSV with an `input_tokens` and an `output_tokens` column, one row per request
shape (e.g. each CNN-DailyMail sample's prompt and reference length under the model's
tokenizer); each request draws a row, seeded by `inference.seed`, so every replica count and
engine of a sweep serves the same requests. Pure but for reading the file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DEFAULT = 128  # tokens in and out when a trial sets neither (vLLM bench's random dataset)
COLUMNS = ("input_tokens", "output_tokens")


def read(path: str) -> np.ndarray:
    """The file's (input, output) rows, read-only; ValueError naming what is wrong. Read once
    while the file stays as it is: a trial asks for it at load, per replica and per probe."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path} is not a file")
    stat = p.stat()
    return _read(str(p), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int, size: int) -> np.ndarray:
    p = Path(path)
    try:
        table = pd.read_csv(p)
    except Exception as e:  # a binary file, a broken quote: one line says which
        raise ValueError(f"{path} is not a CSV file ({type(e).__name__}: {e})") from None
    missing = [c for c in COLUMNS if c not in table]
    if missing:
        raise ValueError(f"{path} has no column {', '.join(missing)} (it has "
                         f"{', '.join(map(str, table.columns)) or 'none'})")
    values = table[list(COLUMNS)]
    if values.empty or values.isna().any().any() or not all(
            pd.api.types.is_integer_dtype(values[c]) for c in COLUMNS) or (values < 1).any().any():
        raise ValueError(f"{path}: every row needs whole numbers of at least 1 in "
                         f"{' and '.join(COLUMNS)}, and the file at least one row")
    rows = values.to_numpy(dtype=np.int64)
    rows.setflags(write=False)  # shared by every caller
    return rows


def of_requests(table: np.ndarray, seed: int, count: int) -> np.ndarray:
    """Each of `count` requests' (input, output) lengths, drawn from the table's rows."""
    rng = np.random.default_rng([seed, 0x1E46])
    return table[rng.integers(0, len(table), size=count)]


def typical(inference: Any) -> tuple[int, int]:
    """The lengths of the warmup and accuracy requests: the trial's, or the file's median row."""
    if inference.lengths_file:
        table = read(inference.lengths_file)
        return int(np.median(table[:, 0])), int(np.median(table[:, 1]))
    return inference.input_tokens or DEFAULT, inference.output_tokens or DEFAULT


def longest(inference: Any) -> int:
    """The most positions a request of the trial takes (prompt and output): what an engine is
    sized for and the model must have."""
    if inference.lengths_file:
        return int(read(inference.lengths_file).sum(axis=1).max())
    return sum(typical(inference))


def requests(inference: Any, count: int) -> np.ndarray:
    """(input, output) tokens of each of `count` requests."""
    if inference.lengths_file:
        return of_requests(read(inference.lengths_file), inference.seed, count)
    return np.tile(np.array(typical(inference), dtype=np.int64), (count, 1))

"""The results table's metric columns, declared where they are produced: key, unit, meaning.

A module that puts a metric into a row declares it beside the code that computes it
(`declare(Metric(...))` at module level; a workload through its `columns` class attribute), so
the declaration and the figure cannot drift apart. The declarations are the table's data
dictionary: `results.parquet` carries the units of its columns in its schema metadata, and the
report's column tips and axis titles read them from there. Keys keep the house convention
`namespace/quantity_unit`; `declare` refuses a unit that contradicts the key's suffix. Does not
compute anything. No raybench imports.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

UNITS = frozenset({
    "ms", "us", "s", "%", "MB", "W", "J", "C", "MHz", "GB/s", "MB/s", "queries/s",
    "samples/s", "tokens/s", "pixels/s", "chips/s", "faults/s", "pixels/s/MB", "GFLOP", "TFLOP/s",
    "M", "count", "bool", "text", "score", "requests/s", "USD",
})
# What a key's last part says its unit is ("*/s": a rate of something, "*/MB": per MB).
_SUFFIX = [("_per_s", "*/s"), ("_per_mb", "*/MB"), ("_gb_s", "GB/s"), ("_ms", "ms"),
           ("_us", "us"), ("_s", "s"), ("_pct", "%"), ("_mb", "MB"), ("_w", "W"), ("_j", "J"),
           ("_c", "C"), ("_mhz", "MHz"), ("_qps", "queries/s"), ("_rps", "requests/s"),
           ("_usd", "USD")]
STRICT_ENV = "RAYBENCH_STRICT_COLUMNS"  # set (tests): an undeclared column is an error
META_KEY = b"raybench.columns"  # a Parquet file's schema metadata: its columns' units


@dataclass(frozen=True)
class Metric:
    """One column: `key` may hold `{name}` parts for a family (`train/{phase}_mean_ms`)."""

    key: str
    unit: str
    doc: str

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.key}: unit '{self.unit}' is not one of "
                             f"{sorted(UNITS)}")
        for suffix, unit in _SUFFIX:
            if self.key.endswith(suffix):
                ok = (self.unit.endswith(unit[1:]) and self.unit != unit[1:]
                      if unit.startswith("*") else self.unit == unit)
                if not ok:
                    raise ValueError(f"metric {self.key}: the key says '{unit}', declared "
                                     f"'{self.unit}'")
                break

    def matches(self, key: str) -> bool:
        return _pattern(self.key).fullmatch(key) is not None


_EXACT: dict[str, Metric] = {}
_FAMILIES: list[Metric] = []


def declare(*metrics: Metric) -> tuple[Metric, ...]:
    """Register metrics (at import of the module that produces them); returns them."""
    for m in metrics:
        known = _EXACT.get(m.key) or next((f for f in _FAMILIES if f.key == m.key), None)
        if known is not None and known.unit != m.unit:
            raise ValueError(f"metric {m.key} declared twice, as '{known.unit}' and '{m.unit}'")
        if "{" in m.key:
            _FAMILIES.append(m)
        else:
            _EXACT[m.key] = m
    return metrics


def lookup(key: str) -> Metric | None:
    return _EXACT.get(key) or next((f for f in _FAMILIES if f.matches(key)), None)


def text(value: object) -> str:
    """A text cell of a row, '' where it is missing. Rows read back from results.parquet come
    through pandas 3, whose string columns hold a missing cell as NaN, not None: `value or ""`
    then gives the float NaN (truthy), and `str()` of it the word 'nan' (on the lent H100 every
    ViT row without a throttle reason was judged 'GPU throttled (nan)')."""
    return value if isinstance(value, str) else ""


def is_metric(column: str) -> bool:
    """Metric columns have a namespace (`train/...`); config columns a section (`workload.x`)."""
    return "/" in column


def units(columns: list[str]) -> dict[str, dict[str, str]]:
    """{column: {unit, doc}} for the declared metric columns among these."""
    out = {}
    for c in columns:
        m = lookup(c) if is_metric(c) else None
        if m is not None:
            out[c] = {"unit": m.unit, "doc": m.doc}
    return out


def check(columns: list[str], where: str) -> list[str]:
    """The undeclared metric columns of a row: logged, or an error under RAYBENCH_STRICT_COLUMNS
    (the test suite), so a new figure without its declaration fails a test, not a sweep."""
    missing = sorted(c for c in columns if is_metric(c) and lookup(c) is None)
    if missing:
        text = (f"{where}: metric columns without a declaration: {missing}; declare each with "
                "raybench.columns.Metric(key, unit, meaning) beside the code that produces it")
        if os.environ.get(STRICT_ENV):
            raise ValueError(text)
        log.warning(text)
    return missing


def metadata(columns: list[str]) -> dict[bytes, bytes]:
    """Parquet schema metadata carrying the units of these columns."""
    return {META_KEY: json.dumps(units(columns), sort_keys=True).encode()}


def read_metadata(meta: dict[bytes, bytes] | None) -> dict[str, dict[str, str]]:
    """What `metadata` wrote ({} for tables written before units were declared)."""
    raw = (meta or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


def _pattern(key: str) -> re.Pattern[str]:
    parts = re.split(r"\{[a-z_]+\}", key)
    return re.compile("[a-z0-9_]+".join(re.escape(p) for p in parts))

"""Reading what a history's files hold when the one dataset read of them fails: a damaged file
(random, empty, truncated, bit-flipped), a foreign one (a struct where a metric is, a column
named twice, a metric as text), types that do not unify. Each file on its own; one that cannot
be read is skipped, a column that will not cast is spelled as text or left empty, each with one
warning a process naming the file (issue 63, item 2). history.py reads through it; it owns no
layout.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from raybench import store

log = logging.getLogger(__name__)


def warn(path: str, what: str) -> None:
    """One warning a file and reason in a process: every reader of a root lists it again."""
    if (path, what) not in _WARNED:
        _WARNED.add((path, what))
        log.warning("history: %s %s", path, what)


_WARNED: set[tuple[str, str]] = set()


def _unreadable(path: str, e: BaseException) -> None:
    warn(path, f"cannot be read ({store.first_line(e)}): skipped; move it away to silence this")
# what Arrow raises where types do not unify or a column does not cast to the unified type
_TYPE_CLASH = (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError)


def read_file_by_file(fs: Any, paths: list[str], filter: ds.Expression | None,
                       columns_: list[str] | None) -> pa.Table:
    """Each file on its own: one that cannot be read, or names a column twice, is skipped;
    the others are cast to one schema (`_unified`), a column that will not cast spelled as
    text or left empty; each with a warning naming the file. One file never makes the whole
    history unreadable."""
    tables = []
    for p in paths:
        try:
            table = pq.read_table(store.resolve(p)[1], filesystem=fs)
        except (pa.ArrowException, OSError, ValueError) as e:
            _unreadable(p, e)
            continue
        if len(set(table.column_names)) < len(table.column_names):
            warn(p, "names a column twice (not a file raybench wrote): skipped")
            continue
        tables.append((p, table))
    schema = _unified([t.schema for _, t in tables])
    parts = [_cast(p, table, schema) for p, table in tables]
    out = pa.concat_tables(parts) if parts else schema.empty_table()
    if filter is not None:
        try:
            out = out.filter(filter)
        except (pa.ArrowException, ValueError):  # a column the filter names is in no file
            out = schema.empty_table()
    if columns_:
        return out.select([c for c in columns_ if c in schema.names])
    return out


def _unified(schemas: list[pa.Schema]) -> pa.Schema:
    """One type a column: the files' types promoted into one where Arrow can; where it cannot,
    a number where any file holds one (a metric is a number: another file's text is left
    empty), else text."""
    fields: dict[str, list[pa.DataType]] = {}
    for sch in schemas:
        for f in sch:
            fields.setdefault(f.name, []).append(f.type)
    out = []
    for name, types in fields.items():
        try:
            merged = pa.unify_schemas([pa.schema([(name, t)]) for t in types],
                                      promote_options="permissive").field(name)
        except _TYPE_CLASH:
            numeric = any(pa.types.is_floating(t) or pa.types.is_integer(t) for t in types)
            merged = pa.field(name, pa.float64() if numeric else pa.string())
        out.append(merged)
    return pa.schema(out)


def _cast(path: str, table: pa.Table, schema: pa.Schema) -> pa.Table:
    cells = {}
    for f in schema:
        if f.name not in table.column_names:
            cells[f.name] = pa.nulls(len(table), f.type)
            continue
        try:
            cells[f.name] = table[f.name].cast(f.type)
        except _TYPE_CLASH:
            text = pa.types.is_string(f.type)
            warn(path, f"holds {f.name} as {table[f.name].type} where other runs hold "
                  f"{f.type}: {'read as text' if text else 'left empty'}")
            cells[f.name] = pa.array(
                [None if v is None else json.dumps(v, default=str)
                 for v in table[f.name].to_pylist()], f.type) if text else pa.nulls(
                len(table), f.type)
    return pa.table(cells, schema=schema)


def footers(fs: Any, paths: list[str]) -> list[tuple[str, pa.Schema]]:
    """Each file's schema, read once, for the files whose Parquet footer reads; each other one
    is named in a warning."""
    out = []
    for p in paths:
        try:
            out.append((p, pq.read_schema(store.resolve(p)[1], filesystem=fs)))
        except (pa.ArrowException, OSError) as e:
            _unreadable(p, e)
    return out

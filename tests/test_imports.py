"""raybench's modules form layers, not circles: the import graph read from the source has no cycle.

Every import counts, at the top of a module, inside a function (a "lazy" import that hides a
circle from Python but not from a reader) or under TYPE_CHECKING, and importing a submodule
counts as importing each package above it, as it does at run time (except the packages the
importing module itself lies in: those are already being imported).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "raybench"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """The deepest raybench module a dotted name lies in (a.b.Class -> a.b)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = _known(name, mods) if name.startswith("raybench") else None
                if target and target != mod:
                    graph[mod].add(target)
                # a submodule's packages are imported too, except those this module lies in:
                # they are already being imported when it runs
                parent = target.rpartition(".")[0] if target else ""
                while parent and not mod.startswith(parent + "."):
                    graph[mod].add(parent)
                    parent = parent.rpartition(".")[0]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 40 and graph["raybench.sweep"], "the graph was not read"
    found = cycles(graph)
    detail = "; ".join(
        " / ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found)
    assert not found, f"import cycles in raybench/: {detail}"


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_cycle_finder(edges, expected):
    assert cycles(edges) == expected


def test_lazy_and_type_checking_imports_count(tmp_path, monkeypatch):
    """A circle closed only by an import inside a function or under TYPE_CHECKING is found."""
    pkg = tmp_path / "raybench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from raybench import b\n")
    (pkg / "b.py").write_text("def f():\n    from raybench.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from raybench.d import y\n")
    (pkg / "d.py").write_text("from . import c\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    assert cycles(import_graph()) == [["raybench.a", "raybench.b"], ["raybench.c", "raybench.d"]]

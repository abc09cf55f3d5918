"""The house in figures, read from the source with `ast`: `python -m tests.house [ROOT]`.

What issue 62 measures before and after a change to raybench's layout: modules flat at the top
of the package and sub-packages beside them, files over 300 lines, functions over 40 and 60
lines (and the median and 90th percentile of all), raybench's own imports inside functions,
import cycles, and imports that point back up the layers (`tests/test_imports.py` holds the
layers). Printed as one JSON object.
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "raybench"


def functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, lines) of every function and method, nested ones included."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def inner_imports(tree: ast.AST, package: str | None = "raybench") -> list[int]:
    """Line numbers of imports of `package` (None: of anything) inside a function body."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import) and (package is None or any(
                    a.name.split(".")[0] == package for a in node.names)):
                found.append(node.lineno)
            elif isinstance(node, ast.ImportFrom) and (package is None or node.level or (
                    node.module or "").split(".")[0] == package):
                found.append(node.lineno)
    return sorted(set(found))


def measure(root: Path = ROOT) -> dict:
    files = sorted(root.rglob("*.py"))
    lengths, long_files, inner, inner_all = [], [], 0, 0
    for path in files:
        text = path.read_text()
        tree = ast.parse(text, str(path))
        lengths += [n for _, n in functions(tree)]
        inner += len(inner_imports(tree))
        inner_all += len(inner_imports(tree, None))
        if text.count("\n") > 300:
            long_files.append(path.relative_to(root.parent).as_posix())
    top = [p.name for p in root.glob("*.py")]
    packages = [p.name for p in root.iterdir() if (p / "__init__.py").exists()]
    out = {
        "modules_at_top": len(top), "packages_at_top": len(packages),
        "files": len(files), "lines": sum(p.read_text().count("\n") for p in files),
        "files_over_300_lines": len(long_files), "long_files": long_files,
        "functions": len(lengths), "function_lines_median": statistics.median(lengths),
        "function_lines_p90": statistics.quantiles(lengths, n=10)[-1],
        "functions_over_40": sum(n > 40 for n in lengths),
        "functions_over_40_pct": round(100 * sum(n > 40 for n in lengths) / len(lengths), 1),
        "functions_over_60": sum(n > 60 for n in lengths),
        "imports_inside_functions": inner,  # raybench's own
        "imports_inside_functions_all": inner_all,
    }
    try:  # the graph's reading lives with the test that holds it
        from tests.test_imports import cycles, import_graph, upward_imports
    except ImportError:
        return out
    import tests.test_imports as graph_of

    graph_of.ROOT = root  # the tree measured, which may be another checkout's
    graph = import_graph()
    out["import_cycles"] = len(cycles(graph))
    try:
        out["imports_back_up"] = sorted(f"{a} -> {b}" for a, b in upward_imports(graph))
    except KeyError as e:  # a tree of other modules than LAYERS names
        out["imports_back_up"] = f"not measured: {e} is in no layer of tests/test_imports.py"
    return out


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT), indent=1))

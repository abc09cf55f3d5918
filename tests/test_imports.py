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


@pytest.fixture(scope="module")
def tree_graph() -> dict[str, set[str]]:
    """The package's import graph, read once for the tests of the real tree (parsing every
    module took 0.7-4 s a time)."""
    return import_graph()


def test_no_import_cycles(tree_graph):
    graph = tree_graph
    assert len(graph) > 40 and graph["raybench.sweep.command"], "the graph was not read"
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


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


@pytest.mark.parametrize("rank_side", ["raybench.trials", "raybench.rank.entry",
                                       "raybench.rank.loop", "raybench.rank.launched",
                                       "raybench.clock"])
def test_the_ranks_import_no_sweep_loader(rank_side, tree_graph):
    """What a rank runs (the trial it receives, the rank loop, the timed loop) reaches neither
    the YAML loader, the grid nor the preprocess stage, lazily or not: those are the driver's."""
    loader = {"raybench.spec", "raybench.grid", "raybench.data.stage"}
    assert not reachable(tree_graph, rank_side) & loader


# Files that mirror a workload on purpose and so name its fields: bench overhead's bare twins,
# a plain PyTorch copy of a workload's training that refuses the settings it cannot copy.
MIRRORS = {"bench/twins.py"}


def _workload_names() -> tuple[set[str], set[str]]:
    """(the fields of some workload's own Params, the row columns workloads declare): what
    only a workload's file may name. Fields of the contract's Params classes
    (WorkloadParams, EpochParams) are everyone's."""
    import importlib
    import pkgutil

    from raybench import workloads

    for m in pkgutil.iter_modules(workloads.__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"raybench.workloads.{m.name}")
    contract = {f for c in vars(workloads).values() if isinstance(c, type)
                and issubclass(c, workloads.WorkloadParams) for f in c.model_fields}
    fields, metrics = set(), set()
    for name in workloads.names():
        cls = workloads.get(name)
        fields |= set(cls.Params.model_fields) - contract
        metrics |= {m.key for m in cls.columns}
    return fields, metrics


def core_names_of_workloads(root: Path) -> list[str]:
    """Where a core module (everything but the workloads' own files) names a workload's field
    (`"workload.tile"`, `trial.workload.mode`, `p.prompt_tokens` after `p = trial.workload`) or
    a column a workload declares (`"train/pixels_per_s"`): each `path:line: what`."""
    fields, metrics = _workload_names()
    def own(rel: str) -> bool:  # a workload's own file, or a file of its own folder
        return rel.startswith("workloads/") and rel != "workloads/__init__.py"

    core = [p for p in sorted(root.rglob("*.py"))
            if not own(p.relative_to(root).as_posix())
            and p.relative_to(root).as_posix() not in MIRRORS]
    found = []
    for path in core:
        tree = ast.parse(path.read_text(), str(path))
        # names bound to a trial's workload parameters (`p = trial.workload`, or in a tuple)
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs = zip(target.elts, node.value.elts, strict=False) if isinstance(
                        target, ast.Tuple) and isinstance(node.value, ast.Tuple) else \
                        [(target, node.value)]
                    aliases |= {t.id for t, v in pairs if isinstance(t, ast.Name)
                                and isinstance(v, ast.Attribute)
                                and v.attr in ("workload", "params")}
        for node in ast.walk(tree):
            named = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                v = node.value
                if v in metrics or (v.startswith("workload.") and v[9:] in fields):
                    named = repr(v)
            elif isinstance(node, ast.Attribute) and node.attr in fields and (
                    (isinstance(node.value, ast.Attribute)
                     and node.value.attr in ("workload", "params"))
                    or (isinstance(node.value, ast.Name) and node.value.id in aliases)):
                named = ast.unparse(node)
            if named:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {named}")
    return found


def test_no_core_module_names_a_workloads_field():
    """The report ranks and draws through what workloads declare (headline_metric, size_axis,
    references), the runners through their hooks: a workload is one file."""
    found = core_names_of_workloads(ROOT)
    assert not found, "core modules naming a workload's own fields or columns:\n" + \
        "\n".join(found)


def test_the_workload_names_check_finds_each_kind(tmp_path):
    pkg = tmp_path / "raybench"
    (pkg / "report").mkdir(parents=True)
    (pkg / "report" / "x.py").write_text(
        'A = "workload.tile"\nB = "train/pixels_per_s"\ndef f(t):\n    return t.workload.mode\n'
        'OK = ("workload.batch_size", "train/samples_per_s", t.workload.batch_size)\n'
        'def g(t):\n    p, hw = t.workload, t.hardware\n    return p.prompt_tokens, p.seed\n')
    assert core_names_of_workloads(pkg) == [
        "raybench/report/x.py:1: 'workload.tile'", "raybench/report/x.py:2: 'train/pixels_per_s'",
        "raybench/report/x.py:4: t.workload.mode", "raybench/report/x.py:8: p.prompt_tokens"]


# The house, lowest layer first (docs/ARCHITECTURE.md's layout): the leaves every layer uses,
# the parts beside the flow, the sweep file's reading, the rank side, the wings, the commands.
# A module imports its own layer and those below it; an import of a higher layer points back up.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("raybench", "raybench.sections", "raybench.trials", "raybench.records",
                "raybench.columns", "raybench.failures", "raybench.context", "raybench.clock",
                "raybench.flops", "raybench.memory", "raybench.telemetry", "raybench.fabric",
                "raybench.store", "raybench.sysinfo", "raybench.version", "raybench.console",
                "raybench.interrupts", "raybench.progress", "raybench.process")),
    ("beside the flow", ("raybench.data", "raybench.workloads", "raybench.metrics",
                         "raybench.scenarios")),
    ("the sweep file", ("raybench.spec", "raybench.grid")),
    ("the rank side", ("raybench.rank",)),
    ("the wings", ("raybench.runners", "raybench.results", "raybench.report")),
    ("the commands", ("raybench.sweep", "raybench.validate", "raybench.bench", "raybench.compare",
                      "raybench.cli", "raybench.__main__", "raybench.history",
                      "raybench.rebuild")),
]
# The imports that point back up, each with its reason; no other may be added.
UPWARD = {
    # a trial carries its workload's parameters: their base class lives with the contracts
    ("raybench.trials", "raybench.workloads"),
}
WINGS = {"raybench.runners", "raybench.rank", "raybench.results", "raybench.validate",
         "raybench.bench", "raybench.sweep"}


def layer(module: str) -> int:
    """The layer of a module: the longest name in LAYERS that it is or lies in."""
    best, found = -1, None
    for i, (_, names) in enumerate(LAYERS):
        for name in names:  # the package's own __init__ holds nothing below it
            inside = module.startswith(name + ".") and name != "raybench"
            if (module == name or inside) and len(name) > best:
                best, found = len(name), i
    if found is None:
        raise KeyError(module)
    return found


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) where the imported module lies in a higher layer."""
    return {(a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a)}


def test_every_module_has_a_layer(tree_graph):
    unplaced = []
    for m in tree_graph:
        try:
            layer(m)
        except KeyError:
            unplaced.append(m)
    assert not unplaced, (
        f"{unplaced}: a module at the top of raybench/ that is in no layer. Fix: put it in the "
        "wing it belongs to (runners/, rank/, results/, validate/, bench/, sweep/) or, if every "
        "layer uses it and it imports nothing above it, add it to the leaves in LAYERS with "
        "docs/ARCHITECTURE.md's layout")


def test_no_new_import_points_back_up(tree_graph):
    found = upward_imports(tree_graph) - UPWARD
    assert not found, "imports from a lower layer to a higher one (LAYERS): " + ", ".join(
        f"{a} -> {b}" for a, b in sorted(found))


def test_the_leaves_import_no_wing(tree_graph):
    """A flat module that imports a wing is not a leaf: it belongs in that wing."""
    leaves = [m for m in tree_graph if m.count(".") == 1 and layer(m) == 0]
    found = {(m, t) for m in leaves for t in tree_graph[m]
             if any(t == w or t.startswith(w + ".") for w in WINGS)}
    assert not found, f"leaves importing a wing: {sorted(found)}"


def ray_train_or_tune(tree: ast.AST) -> list[int]:
    """Lines that import Ray Train or Ray Tune (`ray.train`, `ray.tune`, `from ray import tune`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        if any(n.split(".")[:2] in (["ray", "train"], ["ray", "tune"]) for n in names):
            found.append(node.lineno)
    return found


def test_ray_train_and_tune_only_in_the_ray_wing():
    wing = ROOT / "runners" / "on_ray"
    found = [f"{p.relative_to(ROOT.parent)}:{n}" for p in sorted(ROOT.rglob("*.py"))
             if wing not in p.parents for n in ray_train_or_tune(ast.parse(p.read_text()))]
    assert not found, ("Ray Train or Tune imported outside raybench/runners/on_ray/: "
                       f"{found}. Fix: the code belongs in the Ray wing")


def test_the_folder_rule_finds_train_and_tune():
    tree = ast.parse("import ray\nimport ray.train\nfrom ray import tune\n"
                     "from ray.tune.search import x\nimport ray.data\n")
    assert ray_train_or_tune(tree) == [2, 3, 4]


def unexplained_imports(path: Path) -> list[int]:
    """Imports inside a function (raybench's own or any other) with no reason beside them: a
    comment on the import's line or the line above, where a block of imports shares its first
    one's."""
    from tests.house import inner_imports

    lines = path.read_text().splitlines()
    out = []
    for n in inner_imports(ast.parse("\n".join(lines)), None):
        first = n
        while first > 1 and lines[first - 2].strip().startswith(("from ", "import ")):
            first -= 1  # the block's first import
        if "#" not in lines[first - 1] and not lines[first - 2].strip().startswith("#"):
            out.append(n)
    return out


def test_every_import_inside_a_function_says_why():
    """An import inside a function hides a dependency from the top of the module: it needs a
    reason (start-up time measured, an optional dependency, a cycle it avoids)."""
    found = [f"{p.relative_to(ROOT.parent)}:{n}" for p in sorted(ROOT.rglob("*.py"))
             for n in unexplained_imports(p)]
    assert not found, ("imports inside functions without a reason (a comment on the line or "
                       "above; else import at the top): " + ", ".join(found))


def test_the_import_reason_check_finds_a_bare_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from raybench import a  # why\n    from raybench import b\n"
                    "\n\ndef g():\n    x = 1\n    from raybench import c\n"
                    "    # because\n    from raybench import d\n    x = 2\n    import numpy\n")
    assert unexplained_imports(path) == [8, 12]


def test_the_record_of_a_run_imports_no_report(tree_graph):
    """Rows are written whatever becomes of the page: results/ never reaches report/ (the
    summary's validity count and the page's writing are the sweep loop's)."""
    record = [m for m in tree_graph if m.startswith("raybench.results")]
    found = sorted((m, t) for m in record for t in reachable(tree_graph, m)
                   if t.startswith("raybench.report"))
    assert not found, found

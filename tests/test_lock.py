"""requirements.lock is what the tests run with: every package raybench[dev] needs, directly or
through another, is installed at the version the lock pins, and the lock satisfies the ranges in
pyproject.toml (an edited range without `make lock` fails here, not on a user's machine)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
FIX = "Fix: `make lock` re-resolves the lock; `make test` installs it into .venv."


def lock_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: '{line}' is not a NAME==VERSION pin. {FIX}"
            pins[canonicalize_name(name)] = version
    return pins


def needed(root: str, extras: set[str]) -> dict[str, set[str]]:
    """Every distribution `root[extras]` needs, with the extras asked of each, from the
    installed metadata (markers evaluated for this interpreter)."""
    seen: dict[str, set[str]] = {}
    todo = [(canonicalize_name(root), extras)]
    while todo:
        name, asked = todo.pop()
        if name in seen and asked <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | asked
        for spec in metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in {"", *seen[name]}):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    return seen


def test_lock_parser_reads_pins_and_refuses_ranges():
    assert lock_pins("# c\nNumPy==2.4.6\n    # via x\ntorch==2.15.0  # note\n") == {
        "numpy": "2.4.6", "torch": "2.15.0"}
    try:
        lock_pins("torch>=2.4\n")
    except AssertionError as e:
        assert "not a NAME==VERSION pin" in str(e)
    else:
        raise AssertionError("a range was read as a pin")


def test_installed_packages_are_the_locked_versions():
    pins = lock_pins((ROOT / "requirements.lock").read_text())
    closure = needed("raybench", {"dev"})
    closure.pop("raybench")
    assert len(closure) > 50  # ray, torch and the rest: the walk found the tree
    missing = sorted(n for n in closure if n not in pins)
    assert not missing, f"requirements.lock does not pin {missing}. {FIX}"
    drift = {n: (metadata.version(n), pins[n]) for n in closure
             if metadata.version(n).split("+")[0] != pins[n].split("+")[0]}
    assert not drift, f"installed (version, locked version) differ: {drift}. {FIX}"


def test_lock_satisfies_the_ranges_in_pyproject():
    pins = lock_pins((ROOT / "requirements.lock").read_text())
    outside = []
    for spec in metadata.requires("raybench"):  # pyproject.toml's, as installed
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": "dev"}):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None or not req.specifier.contains(pin, prereleases=True):
            outside.append((spec, pin))
    assert not outside, f"pyproject.toml ranges the lock does not meet: {outside}. {FIX}"

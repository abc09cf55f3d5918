"""Which raybench code runs here: the checkout's commit, or the package's version and a digest of
its sources. Imports nothing beyond the standard library: the sweep's driver names its code
before it starts Ray, while the workload's module (torch) loads beside Ray's start
(sweep/command.py)."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata
from pathlib import Path


def code_version() -> str:
    """The git commit of the raybench checkout (with `+dirty` for local changes), else the
    package version and a digest of its sources: what the history compares across weeks.
    `ray job submit --working-dir .` runs raybench from an unpacked copy without `.git` (Ray
    leaves it out), in a cluster Python that need not have raybench installed: the digest
    still says which code ran."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        installed = metadata.version("raybench")
    except metadata.PackageNotFoundError:
        installed = None
    digest = hashlib.sha256()
    for f in sorted(here.rglob("*.py")):
        digest.update(f.relative_to(here).as_posix().encode() + b"\0" + f.read_bytes())
    return f"raybench-{installed or 'src'}+{digest.hexdigest()[:12]}"

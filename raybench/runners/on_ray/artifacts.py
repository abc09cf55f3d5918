"""A trial's files from rank 0's node to the driver's run directory, where nodes share no disk.

Rank 0 writes a trial's files (predictions, per-epoch metrics, kept weights, a profiler trace)
under the run's `trials/` folder on its own node. On one machine, or where that folder is on a
filesystem every node mounts, the driver sees them there. Otherwise (KubeRay pods, cloud nodes
with their own disks) they would stay on that node: the driver leaves a marker with a token of
this sweep in its `trials/` folder, rank 0 looks for it, and where it does not find it sends
the trial's files through Ray's object store (`mailbox.Parcels`) for the driver to write before
the trial's row. Pure file handling here; the sending is Ray's: mailbox.Parcels, ranks.py.
"""

from __future__ import annotations

import secrets
from pathlib import Path, PurePosixPath

from raybench import store
from raybench.trials import TrialSpec, artifact_dir, trace_path

MARKER = ".raybench-driver"

Files = list[tuple[str, bytes]]  # (path relative to the trials folder, content)


def mark(trials_dir: str) -> str:
    """The driver's marker in its trials folder; returns the token rank 0 compares."""
    token = secrets.token_hex(8)
    Path(trials_dir).mkdir(parents=True, exist_ok=True)
    (Path(trials_dir) / MARKER).write_text(token)
    return token


def shared(trials_dir: str, token: str) -> bool:
    """Does this process see the driver's trials folder (the same disk, or a shared mount)?"""
    try:
        return (Path(trials_dir) / MARKER).read_text() == token
    except OSError:
        return False


def collect(trials_dir: str, trial: TrialSpec) -> Files:
    """The trial's files under `trials_dir` as rank 0's node has them: its folder, its trace."""
    root = Path(trials_dir)
    paths = []
    folder = artifact_dir(trials_dir, trial)
    if folder and Path(folder).is_dir():
        paths += sorted(p for p in Path(folder).rglob("*") if p.is_file())
    trace = trace_path(trials_dir, trial)
    if trace and Path(trace).is_file():
        paths.append(Path(trace))
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in paths]


def unpack(trials_dir: str, files: Files) -> int:
    """Write `files` under `trials_dir` (each renamed into place whole); returns the bytes.
    A path that would leave the folder is refused: the files come over the network."""
    root = Path(trials_dir).resolve()
    total = 0
    for rel, data in files:
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts:
            raise ValueError(f"refused artefact path {rel!r}: not inside the trials folder")
        store.write_bytes(root.joinpath(*pure.parts), data)
        total += len(data)
    return total

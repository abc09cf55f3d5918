"""The run directory: where a sweep's run lives and what it holds besides its table.

Owns choosing the directory (a new one per run, or the run `--resume` finishes, checked to be
the same sweep), the lock that keeps a second sweep out of it, where the history lives, the
run files written before the first trial (the sweep as run, the system facts, the code
version), and its copy to shared storage. The table and its rows are table.py's and
writer.py's; the report in it the sweep loop's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import yaml

from raybench import store
from raybench.records import now
from raybench.spec import SpecError, SweepSpec, parse_yaml, validate_sweep


def run_directory(spec: SweepSpec, override: str | None, resume: bool = False) -> Path:
    """The run's directory, writable. A new run never reuses a directory that holds rows; with
    `resume`, the given directory (else the newest run of this sweep under output.root) must
    hold a run of the same sweep."""
    explicit = override or spec.output.dir
    if resume:
        out = Path(explicit) if explicit else _latest_run(spec)
        _check_resumable(spec, out)
    elif explicit and (Path(explicit) / "results.parquet").exists():
        raise SpecError(spec.source, "--output", str(explicit), "already holds a run "
                        "(results.parquet)", "add --resume to finish that run, or choose "
                        "another --output") from None
    else:  # where the error below points while a new run's name is not known yet
        out = Path(explicit or Path(spec.output.root) / spec.name)
    try:
        if not resume and not explicit:
            out = new_run_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise SpecError(spec.source, "output.dir", str(out), f"cannot be written ({e.strerror})",
                        "choose a writable directory with --output or output.root") from None
    return out.resolve()


LOCK = ".lock"


@contextlib.contextmanager
def writing(out: Path, source: str) -> Iterator[None]:
    """Hold the run directory for this sweep: a second sweep into it (a `--resume` while this
    one still runs) would run its pending trials a second time, at the same moment. The lock is
    the kernel's (flock), so it ends with this process however it ends, a SIGKILL included;
    the file says who holds it."""
    path = out / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "another process"
            raise SpecError(source, "--output", str(out), f"is being written by a sweep still "
                            f"running ({holder})", "wait for it to finish or stop it, then "
                            "run with --resume; or start a new run without --resume") from None
        for stale in out.glob(".*.*"):  # temporaries of a driver killed mid-write: never read
            if stale.name.startswith((".results.", ".history.")) and stale.is_file():
                stale.unlink(missing_ok=True)  # (only once the lock says no writer is left)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {now()}: "
                     f"{' '.join(sys.argv)[:300]}".encode())
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, read only by the next refusal


def new_run_dir(base: Path) -> Path:
    """`<base>/<UTC second>`, created here and by no one else: a sweep of the same name started
    in the same second gets `<second>-002` (then -003 ...), which sorts after it."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        out = base / (stamp if n == 1 else f"{stamp}-{n:03d}")
        try:
            out.mkdir()
            return out
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"999 runs started in {stamp}", str(base))


def _latest_run(spec: SweepSpec) -> Path:
    base = Path(spec.output.root) / spec.name
    runs = sorted(d for d in base.glob("*") if (d / "sweep.yaml").is_file()) if base.is_dir() \
        else []
    if not runs:
        raise SpecError(spec.source, "--resume", str(base), "holds no earlier run of this sweep",
                        "run without --resume to start one, or name the run with --output")
    return runs[-1]


def _check_resumable(spec: SweepSpec, out: Path) -> None:
    """The run in `out` must come from the same sweep (output settings aside)."""
    saved = out / "sweep.yaml"
    if not saved.is_file():
        raise SpecError(spec.source, "--resume", str(out), "holds no run (no sweep.yaml)",
                        "name the run directory to finish with --output") from None
    try:
        old = parse_yaml(saved.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SpecError(spec.source, "--resume", str(saved), f"cannot be read ({e})",
                        "resume a run whose sweep.yaml raybench wrote, or start a new run "
                        "without --resume") from None
    try:  # read as today's raybench reads it: a field added since, at its default, is no change
        old = validate_sweep(old, str(saved)).to_yaml_dict()
    except SpecError:
        pass  # a field since removed or renamed: compared as written
    new = spec.to_yaml_dict()
    for key in sorted(set(old) | set(new)):
        if key != "output" and old.get(key) != new.get(key):
            raise SpecError(spec.source, key, str(new.get(key)), f"differs from the run in {out} "
                            f"({old.get(key)})", "resume with the same sweep file and --set "
                            "overrides, or start a new run without --resume") from None


def history_root(spec: SweepSpec, override: str | None) -> Path:
    """Where the history lives (history.py): the results root, or beside an explicit run
    directory."""
    explicit = override or spec.output.dir
    root = Path(spec.output.root).resolve()
    if not explicit:
        return root
    run = Path(explicit).resolve()
    # a run under <root>/<name>/ named explicitly (`--resume --output RUN`) keeps its root's
    return root if run.parent == root / spec.name else run.parent


def write_run_files(out: Path, spec: SweepSpec, cluster: dict[str, Any],
                    nodes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The resolved spec and the system facts (each node's own where given), written before
    the first trial; returns the facts."""
    from raybench import sysinfo  # imports torch: kept off the dry-run path

    store.write_text(out / "sweep.yaml", yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False))
    info = sysinfo.collect(cluster, nodes)
    store.write_text(out / "system_info.json", json.dumps(info, indent=1, default=str))
    return info


def run_facts(out: Path) -> dict[str, Any]:
    """The system facts a run recorded (a resumed run's rows keep its first session's)."""
    path = out / "system_info.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        return {}


def storage_uri(storage: str, sweep: str, run_id: str, *parts: str) -> str:
    """`<storage>/<sweep>/<run_id>/...`, for a local path or a URI alike."""
    return "/".join([storage.rstrip("/"), sweep, run_id, *parts])


def publish(out: Path, storage: str, sweep: str) -> str:
    """Copy the run directory (table, trial JSONs, report, run files) to shared storage through
    pyarrow's filesystems; the Ray storage subfolder is already there. Returns where it went."""
    dest = storage_uri(storage, sweep, out.name)
    fs, path = store.resolve(dest)
    fs.create_dir(path, recursive=True)
    local = pafs.LocalFileSystem()
    for item in sorted(out.resolve().rglob("*")):
        rel = item.relative_to(out.resolve())
        if rel.parts[0] in ("ray", LOCK):  # Tune/Train's leftovers (its storage is already
            continue  # there), and the lock of the sweep that wrote the run
        if item.is_dir():  # object stores have no folders, local and shared filesystems do
            fs.create_dir(f"{path}/{rel.as_posix()}", recursive=True)
        else:
            pafs.copy_files(str(item), f"{path}/{rel.as_posix()}", source_filesystem=local,
                            destination_filesystem=fs)
    return dest

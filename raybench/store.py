"""Where data lives: a local path or a storage URI (s3://, gs://, ...), one set of calls.

Owns reading and writing the stage's inputs and outputs through pyarrow's filesystems, so a
cluster whose nodes share no disk (KubeRay pods, cloud nodes) reads scenes, labels and
shorelines from, and writes chips to, an object store every node reaches; a local path keeps
working as before (a single machine, or a filesystem mounted on every node). GeoTIFFs are read
by GDAL, which opens `s3://` and `gs://` itself: `gdal_settings` gives it the endpoint of an
S3-compatible server (MinIO, Ceph) from the one variable the AWS tools use, `AWS_ENDPOINT_URL`.
Locations are plain strings joined with "/": `pathlib` would fold a URI's "//". A run's
results table that Parquet cannot read is named by `UnreadableTable` (here, below both the
results writer and the report, which read it).
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs


def is_uri(loc: str | Path) -> bool:
    return "://" in str(loc)


def join(loc: str | Path, *parts: str) -> str:
    if not is_uri(loc):
        return str(Path(loc).joinpath(*parts))
    return "/".join([str(loc).rstrip("/"), *(p.strip("/") for p in parts)])


def name(loc: str | Path) -> str:
    return posixpath.basename(str(loc).rstrip("/"))


def parent(loc: str | Path) -> str:
    if not is_uri(loc):
        return str(Path(loc).parent)
    return str(loc).rstrip("/").rsplit("/", 1)[0]


def identity(loc: str | Path) -> str:
    """A stable name for a cache key: the URI, or the absolute local path."""
    return str(loc) if is_uri(loc) else str(Path(loc).resolve())


def resolve(loc: str | Path) -> tuple[pafs.FileSystem, str]:
    """pyarrow filesystem and the path inside it (credentials and endpoint from the
    environment, as the AWS and Google tools read them)."""
    if is_uri(loc):
        return pafs.FileSystem.from_uri(str(loc))
    return pafs.LocalFileSystem(), str(Path(loc).resolve())


def info(loc: str | Path) -> pafs.FileInfo:
    fs, path = resolve(loc)
    return fs.get_file_info(path)


def is_file(loc: str | Path) -> bool:
    return info(loc).type == pafs.FileType.File


def is_dir(loc: str | Path) -> bool:
    # object stores have no folders: a prefix with objects under it is one
    return info(loc).type == pafs.FileType.Directory


def list_dir(loc: str | Path) -> list[tuple[str, bool]]:
    """(name, is a folder) of each entry directly under `loc`, sorted by name."""
    fs, path = resolve(loc)
    entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=False))
    return sorted((posixpath.basename(e.path), e.type == pafs.FileType.Directory)
                  for e in entries)


def read_bytes(loc: str | Path) -> bytes:
    fs, path = resolve(loc)
    with fs.open_input_stream(path) as f:
        return f.read()


def read_text(loc: str | Path) -> str:
    return read_bytes(loc).decode()


def open_input(loc: str | Path) -> Any:
    """A seekable file (Parquet row groups, numpy headers are read from it in parts)."""
    fs, path = resolve(loc)
    return fs.open_input_file(path)


def write_bytes(loc: str | Path, data: bytes) -> None:
    """All or nothing: a local file is renamed into place; an object appears when its upload
    completes, so a reader never sees half of either."""
    if not is_uri(loc):
        Path(loc).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{loc}.tmp{os.getpid()}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, loc)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return
    fs, path = resolve(loc)
    with fs.open_output_stream(path) as f:
        f.write(data)


def no_space(e: BaseException) -> bool:
    """The filesystem (or a quota) is full: Python's own errors carry the errno; pyarrow's
    writers raise an OSError that only says it ("[errno 28] No space left on device")."""
    if not isinstance(e, OSError):
        return False
    return e.errno in (errno.ENOSPC, errno.EDQUOT) or any(
        s in str(e) for s in ("[errno 28]", "[Errno 28]", "No space left", "Disk quota"))


def write_text(loc: str | Path, text: str) -> None:
    write_bytes(loc, text.encode())


def make_dirs(loc: str | Path) -> None:
    fs, path = resolve(loc)
    fs.create_dir(path, recursive=True)


def remove_tree(loc: str | Path) -> None:
    """`loc` and everything under it; nothing when it does not exist."""
    fs, path = resolve(loc)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


def read_parquet(loc: str | Path):
    # pyarrow.parquet, pandas: store is imported where no table is read
    import pyarrow.parquet as pq

    fs, path = resolve(loc)
    return pq.read_table(path, filesystem=fs).to_pandas()


class UnreadableTable(ValueError):
    """A run's results.parquet that Parquet cannot read (truncated, overwritten): the message
    names it and how to rebuild it from the run's trial files."""

    def __init__(self, path: Path, reason: str):
        trials = len(list((path.parent / "trials").glob("*.json")))
        super().__init__(
            f"{path} cannot be read ({reason.splitlines()[0][:200]}). Fix: its {trials} trial "
            f"rows are also in {path.parent / 'trials'}; rebuild the table from them with "
            f"`python -m raybench.rebuild {path.parent}` (the damaged file is kept beside it), "
            "then run the same command again")


def read_rows(path: Path) -> Any:
    """A run's results table (a pandas frame), or UnreadableTable naming it."""
    import pandas as pd  # pyarrow.parquet, pandas: store is imported where no table is read
    import pyarrow as pa

    try:
        return pd.read_parquet(path)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise UnreadableTable(Path(path), str(e) or type(e).__name__) from None


def write_parquet(frame, loc: str | Path) -> None:
    import pyarrow as pa  # pyarrow.parquet, pandas: store is imported where no table is read
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
    write_bytes(loc, sink.getvalue())


def upload_tree(local: Path, loc: str | Path) -> None:
    """A local folder's files under `loc` (the same relative paths)."""
    fs, path = resolve(loc)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(Path(local).resolve()), path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)


def check_writable(loc: str) -> str | None:
    """Write, read back and delete a small object under `loc`: None when that works, else
    what went wrong (before a sweep starts, an unreachable or read-only store is input)."""
    probe = join(loc, f".raybench-probe-{uuid.uuid4().hex[:8]}")
    try:
        make_dirs(loc)
        write_bytes(probe, b"ok")
        if read_bytes(probe) != b"ok":
            return "what was written did not read back"
        fs, path = resolve(probe)
        fs.delete_file(path)
    except (OSError, ValueError) as e:  # pyarrow raises OSError for network and auth errors
        return first_line(e, limit=None)
    return None


def first_line(e: BaseException, limit: int | None = 200) -> str:
    """An error's message in one line for a one-paragraph message (its class where it has
    none), cut at `limit` characters."""
    return (str(e).splitlines() or [type(e).__name__])[0][:limit]


def gdal_settings() -> dict[str, str]:
    """GDAL's S3 settings for an S3-compatible endpoint named by AWS_ENDPOINT_URL (the
    variable pyarrow and the AWS tools read); GDAL reads AWS_S3_ENDPOINT and friends instead.
    A user's own GDAL settings win. Empty on AWS itself (no endpoint override)."""
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return {}
    u = urlparse(url if "://" in url else f"https://{url}")
    return {"AWS_S3_ENDPOINT": u.netloc, "AWS_HTTPS": "NO" if u.scheme == "http" else "YES",
            "AWS_VIRTUAL_HOSTING": "FALSE"}


def raster_path(loc: str | Path) -> str:
    """What rasterio opens for `loc`: the path, or the URI (GDAL reads s3:// and gs://) with
    GDAL's endpoint settings put in this process's environment, where GDAL looks for them."""
    if is_uri(loc):
        for key, value in gdal_settings().items():
            os.environ.setdefault(key, value)
    return str(loc)


def local_scratch(prefix: str) -> Path:
    """A fresh local folder (for files made here before they go to a URI)."""
    return Path(tempfile.mkdtemp(prefix=prefix))

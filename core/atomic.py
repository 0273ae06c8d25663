"""Atomic writes on any fsspec store: readers see a whole file or none. On file systems a
temporary name beside the target, renamed (or linked, where a name must not exist yet); on
object stores one PUT or a multipart upload completed on close (core/uploads.py); upload
temporaries a killed process left behind are swept once per process."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.core.storage import filesystem, is_local, with_retries
from mmcurate.core.uploads import streamed_upload, streams_uploads


def put_file_atomic(fs: Any, local_path: str, path: str) -> None:
    """Upload a finished local file so readers see all of it or nothing.

    Object stores publish a PUT (or completed multipart upload) atomically; on file systems
    we upload to a temporary name in the same folder and rename.
    """
    if is_local(fs):
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        fs.put_file(local_path, tmp)
        os.replace(tmp, path)
    else:
        with_retries(lambda: fs.put_file(local_path, path))


@contextlib.contextmanager
def open_atomic(fs: Any, path: str) -> Iterator[IO[bytes]]:
    """A file to write `path` through, published whole when the block ends (nothing if it
    raises). On file systems it is a temporary name beside `path`, renamed (no second copy);
    on object stores with multipart writers (S3, GCS, Azure) the store's buffered file, whose
    parts go up as they fill and which completes only on close (aborted if the block raises);
    on other stores a local temporary file, uploaded in one PUT."""
    if is_local(fs):
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as out:
                yield out
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)  # only when the block raised: a renamed file is gone
        return
    if streams_uploads(fs):
        with streamed_upload(fs, path) as out:
            yield out
        return
    sweep_uploads()
    with tempfile.NamedTemporaryFile(prefix=f"{UPLOAD_PREFIX}{os.getpid()}-") as out:
        yield out
        out.flush()
        with_retries(lambda: fs.put_file(out.name, path))


UPLOAD_PREFIX = "mmcurate-up-"  # + the writing process's pid: a killed one's file is found


UPLOAD_STALE_S = 3600  # and removed once this old (a pid in another pid namespace looks dead)


_SWEPT: list[int] = []  # the pid of the process that swept (a forked worker sweeps again)


def sweep_uploads() -> None:
    """Remove upload temporaries a killed process left in the temp folder (a whole candidate
    tar or shard each): once per process, those whose pid is gone and untouched for an hour."""
    if _SWEPT and _SWEPT[0] == os.getpid():
        return
    _SWEPT[:] = [os.getpid()]
    folder = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            pid = entry.name.removeprefix(UPLOAD_PREFIX).partition("-")[0]
            if entry.name.startswith(UPLOAD_PREFIX) and pid.isdigit() and stale(entry, int(pid)):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)


def stale(entry: os.DirEntry, pid: int) -> bool:
    return pid_gone(pid) and time.time() - entry.stat().st_mtime > UPLOAD_STALE_S


def pid_gone(pid: int) -> bool:
    """Whether no process of this pid runs here (a pid reused, or another user's process
    that signals cannot reach, counts as running: its files are kept). A zombie (exited, not
    yet reaped by its parent) runs no more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: alive, another user's
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether /proc says the pid has exited and waits to be reaped (False off Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def write_bytes_atomic(fs: Any, path: str, data: bytes) -> None:
    """Write a small object atomically (manifest, stats, markers)."""
    if is_local(fs):
        with open_atomic(fs, path) as out:
            out.write(data)
    else:
        with_retries(lambda: fs.pipe_file(path, data))


def create_bytes(fs: Any, path: str, data: bytes) -> None:
    """Write a small file whole, only where none exists: FileExistsError where one does. On
    file systems a temp copy is linked into place (a link fails where the name is taken; where
    links are not supported it is renamed, as write_bytes_atomic). Object stores differ on
    conditional writes, so there it is write_bytes_atomic: callers read the file back."""
    if not is_local(fs):
        write_bytes_atomic(fs, path, data)
        return
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as out:
            out.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # no hard links on this file system (some FUSE and network mounts)
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def write_parquet(
    table: pa.Table, url: str, storage_options: dict[str, Any], row_group_size: int | None = None
) -> None:
    """Write a table as one parquet object, atomically (signatures, metadata tables)."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=row_group_size)
    fs, path = filesystem(url, storage_options)
    write_bytes_atomic(fs, path, buffer.getvalue())

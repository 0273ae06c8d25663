"""Media too big to hold in memory: a `Spilled` value is a local file standing in for bytes.

A sample's media column holds either `bytes` or a `Spilled(path, size)`. Readers spill a member
above the spill threshold to a local folder as they stream it; stages that only carry media
pass the value on untouched; the tar writer copies it from disk in blocks; stages that must
look at the pixels or frames open it by path (`open_media`) or read it whole only when it is
small (`media_bytes`). Whoever spilled a file removes it (`release`) once it is written out.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

COPY_BLOCK = 1 << 20  # bytes per read when a spilled file is copied or hashed
SPILL_PREFIX = "mmcurate-spill-"  # + the creating process's pid, so a dead one's folder is found


@dataclass(frozen=True)
class Spilled:
    """A media value kept on local disk: `path` holds exactly `size` bytes. `owned` is False
    for a file the build did not write (a local source file passed by path): never removed."""

    path: str
    size: int
    owned: bool = True

    def open(self) -> IO[bytes]:
        return open(self.path, "rb")

    def read(self) -> bytes:
        with self.open() as f:
            return f.read()


Media = bytes | Spilled


def media_size(value: Any) -> int:
    """Bytes of a media value (bytes, str or Spilled); 0 for None."""
    if value is None:
        return 0
    if isinstance(value, Spilled):
        return value.size
    return len(value)


def media_bytes(value: Any) -> Any:
    """The value as bytes (a Spilled file read whole): for callers that need the data in
    memory and have checked its size first."""
    return value.read() if isinstance(value, Spilled) else value


def open_media(value: Media) -> IO[bytes]:
    """A binary file object over a media value, without copying a Spilled file into memory."""
    return value.open() if isinstance(value, Spilled) else io.BytesIO(value)


def spill_folder(parent: str | None = None) -> str:
    """A new, empty folder for one task's spilled members (removed by `remove_folder`)."""
    base = parent or tempfile.gettempdir()
    path = os.path.join(base, f"{SPILL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    return path


_TASK_FOLDER: list[str] = []  # the running task's folder (one task at a time per worker)


def set_task_folder(path: str | None) -> None:
    """Make `path` the folder stages spill into while this task runs (None: no task)."""
    _TASK_FOLDER[:] = [path] if path else []


def task_folder() -> str:
    """The running task's spill folder; outside a task (a stage called directly) a new one in
    the temp folder, which then lasts for the process."""
    if not _TASK_FOLDER:
        _TASK_FOLDER.append(spill_folder())
    return _TASK_FOLDER[0]


class SpillError(RuntimeError):
    """The local spill folder could not take a file (full disk, gone, not writable). Not an
    OSError on purpose: readers treat OSError as damaged or unreachable input and drop it,
    while this is the machine's fault, so the task fails (and is retried) instead."""


def spill_stream(source: IO[bytes], size: int, folder: str, chunk: int = COPY_BLOCK) -> Spilled:
    """Copy exactly `size` bytes of `source` into a new file of `folder`, `chunk` at a time.
    EOFError where the stream ends first, SpillError where the folder cannot take the file
    (the partial file is removed either way)."""
    path = os.path.join(folder, uuid.uuid4().hex)
    left = size
    try:
        out = create(path, size)
        with out:
            while left > 0:
                data = source.read(min(left, chunk))
                if not data:
                    raise EOFError(f"stream ended {left} bytes short")
                write(out, data, path, size)
                left -= len(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    return Spilled(path, size)


def spill_bytes(data: bytes, folder: str) -> Spilled:
    """Write `data` to a new file of `folder` (a stage's big output, such as a clip);
    SpillError where the folder cannot take it."""
    path = os.path.join(folder, uuid.uuid4().hex)
    try:
        with create(path, len(data)) as out:
            write(out, data, path, len(data))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    return Spilled(path, len(data))


def create(path: str, size: int) -> IO[bytes]:
    try:
        return open(path, "wb")
    except OSError as err:
        raise spill_error(path, size, err) from err


def write(out: IO[bytes], data: bytes, path: str, size: int) -> None:
    try:
        out.write(data)
    except OSError as err:
        raise spill_error(path, size, err) from err


def spill_error(path: str, size: int, err: OSError) -> SpillError:
    return SpillError(
        f"cannot spill a {size}-byte member to {os.path.dirname(path)}: "
        f"{err.strerror or err}; free local disk or point TMPDIR at a bigger one"
    )


def copy_media(value: Media, out: IO[bytes]) -> int:
    """Write a media value to `out` (a Spilled file in blocks); returns the bytes written."""
    if not isinstance(value, Spilled):
        out.write(value)
        return len(value)
    written = 0
    with value.open() as f:
        while block := f.read(COPY_BLOCK):
            out.write(block)
            written += len(block)
    if written != value.size:
        raise OSError(f"spilled file {value.path} holds {written} bytes, not {value.size}")
    return written


def release(values: Iterable[Any]) -> None:
    """Remove the files of the Spilled values among `values` (others are ignored)."""
    for value in values:
        if isinstance(value, Spilled) and value.owned:
            with contextlib.suppress(FileNotFoundError):
                os.remove(value.path)


def remove_folder(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


SPILL_STALE_S = 3600  # a dead process's folder is removed once untouched this long
_SWEPT: list[int] = []  # the pid of the process that swept (a forked worker sweeps again)


def sweep_folders(parent: str | None = None) -> None:
    """Remove spill folders that killed processes left in `parent` (the temp folder): those
    whose pid is gone and that are untouched for SPILL_STALE_S (as core.atomic.sweep_uploads;
    a pid in another pid namespace looks dead, hence the age too)."""
    from core.atomic import pid_gone

    if parent is None and _SWEPT == [os.getpid()]:
        return  # once per process: a task's own folder is removed in its `finally`
    if parent is None:
        _SWEPT[:] = [os.getpid()]
    base = parent or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid = entry.name.removeprefix(SPILL_PREFIX).partition("-")[0]
            if not (entry.name.startswith(SPILL_PREFIX) and pid.isdigit() and entry.is_dir()):
                continue
            with contextlib.suppress(OSError):
                old = time.time() - entry.stat().st_mtime > SPILL_STALE_S
                if old and int(pid) != os.getpid() and pid_gone(int(pid)):
                    remove_folder(entry.path)

"""Media too big to hold in memory: a `Spilled` value is a local file standing in for bytes.

A sample's media column holds either `bytes` or a `Spilled(path, size)`. Readers spill a member
above the spill threshold to a local folder as they stream it; stages that only carry media
pass the value on untouched; the tar writer copies it from disk in blocks; stages that must
look at the pixels or frames open it by path (`open_media`) or read it whole only when it is
small (`media_bytes`). Whoever spilled a file removes it (`release`) once it is written out.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

COPY_BLOCK = 1 << 20  # bytes per read when a spilled file is copied or hashed
# + the creating process's pid and this host's tag, so a dead one's folder is found
SPILL_PREFIX = "mmcurate-spill-"
DEFAULT_SPILL_BYTES = 16 << 20  # source.spill_bytes and chunk_bytes's defaults: what a stage
DEFAULT_CHUNK_BYTES = 128 << 20  # called outside a build task holds at most


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


def host_tag() -> str:
    """This host and pid namespace, short: a folder with this tag whose pid is gone was left
    by a dead process of this very machine (a pid of another container only looks dead)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    text = f"{socket.gethostname()}|{namespace}"
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def spill_folder(parent: str | None = None) -> str:
    """A new, empty folder for one task's spilled members (removed by `remove_folder`):
    `mmcurate-spill-<pid>-h<host tag>-<random>`."""
    base = parent or tempfile.gettempdir()
    name = f"{SPILL_PREFIX}{os.getpid()}-h{host_tag()}-{uuid.uuid4().hex[:12]}"
    path = os.path.join(base, name)
    os.makedirs(path)
    return path


_TASK_FOLDER: list[str] = []  # the running task's folder (one task at a time per worker)
_TASK_LIMITS: list[int | None] = [DEFAULT_SPILL_BYTES, DEFAULT_CHUNK_BYTES]


def set_task_folder(
    path: str | None,
    spill_bytes: int | None = DEFAULT_SPILL_BYTES,
    chunk_bytes: int | None = DEFAULT_CHUNK_BYTES,
) -> None:
    """Make `path` the folder stages spill into while this task runs (None: no task), and
    the source's `spill_bytes` / `chunk_bytes` the limits stages that make media (download)
    keep to."""
    _TASK_FOLDER[:] = [path] if path else []
    _TASK_LIMITS[:] = [spill_bytes, chunk_bytes]


def task_limits() -> tuple[int | None, int | None]:
    """(spill_bytes, chunk_bytes) of the running task: a value above the first goes to disk,
    and a chunk holds about the second in memory (None: no limit)."""
    return _TASK_LIMITS[0], _TASK_LIMITS[1]


def task_folder() -> str:
    """The running task's spill folder; outside a task (a stage called directly) a new one in
    the temp folder, which then lasts for the process (removed as it exits)."""
    if not _TASK_FOLDER:
        _TASK_FOLDER.append(spill_folder())
        atexit.register(shutil.rmtree, _TASK_FOLDER[0], True)
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


def removed_when_dropped(value: Spilled) -> Spilled:
    """`value`, whose file is removed once nothing refers to it any more: for media a stage
    makes mid-chain (a download), which no reader noted, so that a later stage replacing it
    (decode_image) or dropping its sample frees the disk at once, not when the task ends.
    Copies sent to other processes carry no such duty; `release` may remove it first."""
    weakref.finalize(value, _remove_quietly, value.path)
    return value


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


class MemoryBudget:
    """Bytes that threads may hold in memory together (a chunk's share: `chunk_bytes`);
    thread-safe. None: no limit."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.held = limit, 0
        self.lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Reserve `size` bytes; False (nothing reserved) where they do not fit."""
        with self.lock:
            if self.limit is not None and self.held + size > self.limit:
                return False
            self.held += size
            return True

    def give(self, size: int) -> None:
        with self.lock:
            self.held -= size


class SpillingBuffer:
    """Bytes arriving in blocks (a download's body): held in memory while the value stays
    within `spill_bytes` and the shared `budget` has room, else moved to a new file of
    `folder` and written there from then on, so memory never holds more than the budget.
    `expected` (a Content-Length): a value known to be big goes to disk from its first byte."""

    def __init__(
        self,
        folder: str | Callable[[], str],
        spill_bytes: int | None,
        budget: MemoryBudget,
        expected: int | None = None,
    ) -> None:
        self.folder, self.spill_bytes, self.budget = folder, spill_bytes, budget
        self.parts: list[bytes] = []
        self.size = self.held = 0
        self.path: str | None = None
        self.file: IO[bytes] | None = None
        if expected is not None and self.over(expected):
            self.to_disk()

    def over(self, size: int) -> bool:
        return self.spill_bytes is not None and size > self.spill_bytes

    def write(self, data: bytes) -> None:
        if self.file is None and (self.over(self.size + len(data)) or not self.take(data)):
            self.to_disk()
        if self.file is not None:
            write(self.file, data, self.file.name, self.size + len(data))
        else:
            self.parts.append(data)
        self.size += len(data)

    def take(self, data: bytes) -> bool:
        if not self.budget.take(len(data)):
            return False
        self.held += len(data)
        return True

    def to_disk(self) -> None:
        folder = self.folder() if callable(self.folder) else self.folder
        self.path = os.path.join(folder, uuid.uuid4().hex)
        self.file = create(self.path, self.size)
        for part in self.parts:
            write(self.file, part, self.path, self.size)
        self.parts = []
        self.budget.give(self.held)
        self.held = 0

    def value(self) -> Media:
        """The bytes, or a Spilled file removed once the value is dropped (the buffer's
        memory stays counted in the budget: the value is still held)."""
        if self.file is None:
            return b"".join(self.parts)
        try:
            self.file.close()
        except OSError as err:
            self.discard()
            raise spill_error(self.path or self.folder, self.size, err) from err
        return removed_when_dropped(Spilled(self.file.name, self.size))

    def discard(self) -> None:
        """Give back what the buffer took (its memory, its file): the value is not wanted."""
        self.parts = []
        self.budget.give(self.held)
        self.held = 0
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            _remove_quietly(self.file.name)


def remove_folder(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


SPILL_STALE_S = 3600  # a folder of another host or namespace: removed once untouched this long
_SWEPT: list[int] = []  # the pid of the process that swept (a forked worker sweeps again)


def folder_owner(name: str) -> tuple[int, str | None] | None:
    """(pid, host tag or None for an untagged, older name) of a spill folder's name; None for
    any other name."""
    if not name.startswith(SPILL_PREFIX):
        return None
    pid, _, rest = name.removeprefix(SPILL_PREFIX).partition("-")
    if not pid.isdigit():
        return None
    tag = rest.partition("-")[0]
    return int(pid), tag[1:] if tag.startswith("h") and len(tag) == 9 else None


def sweep_folders(parent: str | None = None, again: bool = False) -> None:
    """Remove spill folders that dead processes (killed workers, a killed build) left in
    `parent` (the temp folder): at once where the name says this host and pid namespace and
    that pid runs no more, so a rerun clears what a killed run left; a folder of another
    namespace (its pid only looks dead here) once untouched SPILL_STALE_S, as
    core.atomic.sweep_uploads. Once per process unless `again`."""
    from mmcurate.core.atomic import pid_gone

    if parent is None and not again and _SWEPT == [os.getpid()]:
        return  # a task's own folder is removed in its `finally`
    if parent is None:
        _SWEPT[:] = [os.getpid()]
    base, here = parent or tempfile.gettempdir(), host_tag()
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            owner = folder_owner(entry.name)
            if owner is None or owner[0] == os.getpid() or not entry.is_dir():
                continue
            with contextlib.suppress(OSError):
                ours = owner[1] == here
                if not ours and time.time() - entry.stat().st_mtime <= SPILL_STALE_S:
                    continue
                if pid_gone(owner[0]):
                    remove_folder(entry.path)

"""Storage behind fsspec: URL -> filesystem, fast reachability checks, atomic writes."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import random
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from core.config_io import ConfigError
from core.uploads import streamed_upload, streams_uploads

T = TypeVar("T")


def absolute(url: str) -> str:
    """A local path with `~` and relative parts resolved here; other URLs unchanged."""
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for any URL; local paths expand `~`."""
    return url_to_fs(absolute(url), **(storage_options or {}))


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


GLOB_CHARS = "*?["


def is_glob(fs: Any, path: str) -> bool:
    """Whether `path` is a pattern to expand: it has glob characters and names no existing file
    or folder as written (`clips [2020]` is a folder, not a character class)."""
    return any(c in path for c in GLOB_CHARS) and not fs.exists(path)


def matching(fs: Any, path: str) -> list[str]:
    """The paths `path` names: the glob's matches, sorted, or the path itself."""
    return sorted(fs.glob(path)) if is_glob(fs, path) else [path]


def cat_many(fs: Any, paths: list[str]) -> dict[str, bytes | Exception]:
    """Whole files by their exact paths (an object store reads them concurrently); a file that
    fails maps to its exception. Not `fs.cat(paths)`: that expands glob characters in the
    names, so `photo[1].jpg` or anything in `clips [2020]/` was never read."""
    if not paths:
        return {}
    return dict(zip(paths, fs.cat_ranges(paths, None, None, on_error="return"), strict=True))


def files_in(fs: Any, folder: str) -> list[str]:
    """Every file under `folder`, without the folder markers some stores list as entries
    (SeaweedFS keeps an emptied folder and lists it as a file of its own name)."""
    found = fs.find(folder, detail=True)
    root = folder.rstrip("/")
    return [
        path
        for path, info in found.items()
        if info.get("type") != "directory" and path.rstrip("/") != root
    ]


def is_local(fs: Any) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def find_files(fs: Any, root: str) -> list[str]:
    """Every file under `root`, as `fs.find` lists them (a symlinked folder is listed, not
    entered). A local folder is walked without fsspec's stat of each file: 3,000 photos in
    ~5 ms instead of ~60 ms."""
    if not is_local(fs):
        return fs.find(root)
    found: list[str] = []
    pending = [root]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue  # gone since, or unreadable: as os.walk, nothing under it
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif is_input(entry):
                found.append(entry.path)
    return sorted(found)


def is_input(entry: os.DirEntry) -> bool:
    """A regular file, or a link to one; a link to a folder or to nothing is listed too (it
    is then a read error, never entered). FIFOs, sockets and devices, or links to them, are
    not files to read: a FIFO hung the build, /dev/zero filled its memory."""
    if entry.is_file():  # the type comes with the listing: no stat for a plain file
        return True
    if not entry.is_symlink():
        return False
    try:
        return stat.S_ISDIR(os.stat(entry.path).st_mode)
    except OSError:  # dangling, or a loop
        return True


# What a store reports that changes when a file's content does (first one present is taken).
VERSION_KEYS = ("ETag", "etag", "generation", "mtime", "LastModified", "last_modified", "updated")


def store_version(info: dict[str, Any]) -> str:
    """The ETag (else generation, else modification time) in a store's `info` of a file."""
    return next((str(info[k]) for k in VERSION_KEYS if info.get(k) not in (None, "")), "")


def find_versions(fs: Any, root: str) -> dict[str, str]:
    """`find_files` with each file's version, "size:tag": on a local disk the tag is the
    modification time in nanoseconds (one stat a file: ~3 ms per 1,000 here), on a store
    whatever `store_version` finds in the listing itself (no request per file). A file that
    cannot be stat'ed (a dangling link) has the version "" and fails when it is read."""
    if not is_local(fs):
        found = fs.find(root, detail=True)
        return {path: f"{info.get('size')}:{store_version(info)}" for path, info in found.items()}
    return {path: local_version(path) for path in find_files(fs, root)}


def local_version(path: str) -> str:
    try:
        stat = os.stat(path)
    except OSError:
        return ""
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def quick_options(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """Options for a reachability probe: short timeouts, few retries, no cached instance."""
    options = dict(storage_options)
    if url.startswith(("s3://", "s3a://")):
        config = dict(options.get("config_kwargs") or {})
        config.update(connect_timeout=3, read_timeout=5, retries={"max_attempts": 1})
        options.update(config_kwargs=config, skip_instance_cache=True)
    return options


def check_reachable(url: str, storage_options: dict[str, Any], what: str) -> None:
    """Fail fast (ConfigError, one line) if the store behind `url` does not answer."""
    try:
        fs, path = filesystem(url, quick_options(url, storage_options))
        if is_local(fs):
            return
        fs.ls(path.split("/")[0], detail=False)
    except FileNotFoundError:
        raise ConfigError(f"{what}: bucket not found for {url}") from None
    except Exception as err:  # botocore/aiohttp raise many types; all mean "unreachable"
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{what}: storage unreachable for {url}: {reason}") from None


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth retrying: I/O and timeouts, and botocore's connection errors (which are
    not OSErrors) when s3fs is in use."""
    errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:
        return errors
    return (*errors, BotoConnectionError, HTTPClientError)


def storage_errors() -> tuple[type[BaseException], ...]:
    """Every error a storage read may end with: OSError (missing, denied, I/O), timeouts, and
    the client libraries' own types, which are not OSErrors (botocore's, aiohttp's)."""
    errors = transient_errors()
    with contextlib.suppress(ImportError):
        from botocore.exceptions import BotoCoreError, ClientError

        errors = (*errors, BotoCoreError, ClientError)
    with contextlib.suppress(ImportError):
        from aiohttp import ClientError as AiohttpClientError

        errors = (*errors, AiohttpClientError)
    return errors


def with_retries(fn: Callable[[], T], attempts: int = 6, base_s: float = 0.25) -> T:
    """Call `fn`, retrying transient storage errors with exponential backoff and full jitter
    (at most ~16 s of sleeping, on top of the client's own retries)."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as err:  # the error types are looked up only on failure: botocore's
            # import costs each worker ~6 ms, and most calls never fail
            if not isinstance(err, transient_errors()):
                raise
            permanent = isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError))
            if permanent or attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0, min(8.0, base_s * 2**attempt)))
    raise AssertionError("unreachable")


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
    that signals cannot reach, counts as running: its files are kept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: alive, another user's
        return False
    return False


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


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def with_protocol(protocol: str, path: str) -> str:
    """A path from a filesystem listing back into a URL that `filesystem` accepts."""
    return path if protocol == "file" else f"{protocol}://{path}"


def remove_tree(fs: Any, path: str) -> None:
    """Delete a folder and, on object stores, the empty-folder markers some keep (SeaweedFS)."""
    if not fs.exists(path):
        return
    folders = [
        p
        for p, info in fs.find(path, withdirs=True, detail=True).items()
        if info.get("type") == "directory"
    ]
    fs.rm(path, recursive=True)
    if is_local(fs):
        return
    for folder in sorted({*folders, path}, key=lambda p: -p.count("/")):
        try:
            fs.rm_file(folder.rstrip("/") + "/")
        except FileNotFoundError:
            pass
    fs.invalidate_cache(path)


def subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *subclasses(sub)]
    return found


def release_sessions() -> None:
    """Close this process's cached async filesystems (s3fs, gcsfs, HTTP) before it forks
    workers; each is made again on its next use. Why: their sessions belong to this
    process's event loop. A forked child inherits every instance still alive, cached or
    garbage not yet collected, and when its collector frees one there, s3fs's finalizer
    closes the session on whatever loop is running, the child's own ("Task exception was
    never retrieved ... attached to a different loop"), or waits on this process's loop,
    which no thread runs in the child. Dropped and collected here, they close in this
    process, on their own loop."""
    if "fsspec.asyn" not in sys.modules:
        return  # no async filesystem was ever made here
    for cls in subclasses(sys.modules["fsspec.asyn"].AsyncFileSystem):
        cls.clear_instance_cache()
    gc.collect()

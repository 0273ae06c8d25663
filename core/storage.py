"""Storage behind fsspec: URL -> filesystem, listings and versions, fast reachability checks,
retries (atomic writes: core/atomic.py)."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fsspec.core import url_to_fs
from mmcurate.core.config_io import ConfigError

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

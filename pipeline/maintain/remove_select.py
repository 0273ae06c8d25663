"""What `mmcurate remove` is asked to take out: the selector (`--keys`, `--urls`, `--sha256`
FILE, one value a line; `--like` FOLDER of images) read into a `Request`, and the signature
rows it matches.

`--like` matches by the build's own near hashes: the query images are hashed as the build's
`near_dedupe` stage hashed its samples (its `hash`, phash or dhash, of the whole frame and of
its two inset windows), and a row matches when any of its three hashes is within that stage's
`radius` of any of a query's three (near_dedupe's "sure pair" distance, over the windows too:
a stored image may be cropped or resized; the thumbnail check of its wider candidates is not
redone, as a build publishes no thumbnails).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from mmcurate.core.config_io import ConfigError

SELECTORS = ("keys", "urls", "sha256", "like")
COLUMN = {"keys": "key", "urls": "url", "sha256": "sha256", "like": "phash"}  # published names
NEAR_STAGE = "near_dedupe"
NEAR_DEFAULTS = {"radius": 4, "hash": "phash"}  # NearDedupeOptions' defaults


@dataclass(frozen=True)
class Request:
    """A selector as read: its kind, the sha256 of what was given (the file's bytes; for a
    folder, its sorted names and their files' sha256), how many entries, and the values."""

    kind: str
    digest: str
    entries: int
    values: frozenset[str] = frozenset()
    hashes: tuple[int, ...] = ()  # --like: the query images' hashes (frames and windows)
    unreadable: int = 0  # --like: files in the folder that are not images

    def record(self) -> dict[str, Any]:
        """What the plan and the audit keep of it: never the values themselves."""
        return {"selector": self.kind, "selector_sha256": self.digest, "entries": self.entries}


def read_request(kind: str, path: str, near: dict[str, Any] | None = None) -> Request:
    """The selector `kind` read from `path` (a local file, or a folder for `like`); a missing
    or unreadable one is a ConfigError. `near`: the build's near_dedupe options (like)."""
    if kind == "like":
        return read_like(path, near or NEAR_DEFAULTS)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as err:
        raise ConfigError(f"--{kind}: cannot read {path}: {err.strerror or err}") from None
    try:
        lines = blob.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"--{kind}: {path} is not UTF-8 text (one value a line)") from None
    values = {line.strip() for line in lines if line.strip()}
    if kind == "sha256":
        values = {v.lower() for v in values}
    return Request(kind, hashlib.sha256(blob).hexdigest(), len(values), frozenset(values))


def read_like(folder: str, near: dict[str, Any]) -> Request:
    """The images of `folder` (not recursive), hashed as near_dedupe hashes; files that do not
    decode as images are counted (`unreadable`), not fatal."""
    from mmcurate.stages.lib.image_hash import image_signals
    from mmcurate.stages.lib.pixels import DECODE_ERRORS

    if not os.path.isdir(folder):
        raise ConfigError(f"--like: {folder} is not a folder of images")
    digest, hashes, unreadable = hashlib.sha256(), [], 0
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        digest.update(f"{name}\0{hashlib.sha256(data).hexdigest()}\n".encode())
        try:
            full, crops, _, _ = image_signals(data, near["hash"])
            hashes += [full, *crops]
        except DECODE_ERRORS:
            unreadable += 1
    if not hashes:
        raise ConfigError(f"--like: {folder} holds no readable images")
    count = len(hashes) + unreadable
    return Request("like", digest.hexdigest(), count, hashes=tuple(hashes), unreadable=unreadable)


def near_options(manifest: dict[str, Any]) -> dict[str, Any]:
    """The build's near_dedupe hash and radius (the last such stage listed); a ConfigError
    for a build that computed no near hashes."""
    stages = (manifest.get("config") or {}).get("stages") or []
    found = [s for s in stages if isinstance(s, dict) and s.get("name") == NEAR_STAGE]
    if not found:
        raise ConfigError(
            "--like: this build has no near hashes (its config ran no near_dedupe); "
            "use --keys, --urls or --sha256"
        )
    return {key: found[-1].get(key, default) for key, default in NEAR_DEFAULTS.items()}


def matches(request: Request, table: pa.Table, radius: int = 0) -> np.ndarray:
    """Which rows of a published signatures table the request selects (a bool mask)."""
    column = COLUMN[request.kind]
    if column not in table.column_names:
        raise ConfigError(f"--{request.kind}: {missing_column(request.kind)}")
    if request.kind != "like":
        values = pa.array(sorted(request.values), pa.string())
        found = pc.is_in(table[column], value_set=values)
        return found.to_numpy(zero_copy_only=False).astype(bool, copy=False)
    close = np.zeros(table.num_rows, dtype=bool)
    for values, valid in row_hashes(table):
        for query in request.hashes:
            close |= valid & (np.bitwise_count(values ^ np.uint64(query)) <= radius)
    return close


def row_hashes(table: pa.Table) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row's whole-frame hash, then each inset window's (`phash_crops`), as (values,
    present) column pairs."""
    full = table["phash"]
    valid = pc.is_valid(full).to_numpy(zero_copy_only=False)
    pairs = [(full.fill_null(0).to_numpy().astype(np.uint64), valid)]
    crops = table["phash_crops"].to_pylist() if "phash_crops" in table.column_names else []
    for i in range(max((len(c) for c in crops if c), default=0)):
        there = np.array([bool(c) and len(c) > i for c in crops], dtype=bool)
        values = [c[i] if c and len(c) > i else 0 for c in crops]
        pairs.append((np.array(values, dtype=np.uint64), there))
    return pairs


def missing_column(kind: str) -> str:
    if kind == "urls":
        return "this build recorded no urls (its source was not a URL list)"
    if kind == "sha256":
        return "this build recorded no sha256 (it ran neither download nor exact_dedupe)"
    return "this build has no near hashes (its config ran no near_dedupe)"

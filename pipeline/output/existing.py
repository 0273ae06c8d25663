"""What output.path already holds, as a starting build sees it: a finished build's manifest,
an unfinished build's claim (`_work/build.json`), an interrupted build's leftover scratch, and
every other file, which belongs to someone else (pipeline/output/claim.py decides what a
build may do with each)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.storage import (
    files_in,
    join,
    with_retries,
)
from mmcurate.pipeline.output.names import (
    BUILD_FILE,
    BUILD_ID,
    MANIFEST,
    PUBLISHED_FOLDERS,
    RESERVED_FILES,
    SHARD_PREFIX,
    WORK_DIR,
    WORK_NAMES,
    manifest_files,
    ours_manifest,
    safe_recorded,
    temp_of,
)

TOOL = "mmcurate"


RESERVED_FOLDERS = (WORK_DIR, *PUBLISHED_FOLDERS)


RUN_ID = re.compile(r"[0-9a-f]{32}")


MAX_RECORD_BYTES = 256 << 20  # a manifest or marker larger than this is not one of ours


@dataclass
class OutputState:
    """What output.path holds, as a starting build sees it (paths relative to it)."""

    url: str
    manifest: dict | None = None  # a finished mmcurate build's manifest
    marker: dict | None = None  # an mmcurate build's _work/build.json: unfinished, or clearing
    leftover: bool = False  # a _work/ without marker that holds only what a build writes there
    files: set[str] = field(default_factory=set)  # top level, and inside signatures/embeddings
    folders: set[str] = field(default_factory=set)  # top-level folder names
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def previous(self) -> str | None:
        """The build id of the mmcurate build there, if any (None also while one is cleared)."""
        if self.manifest is not None:
            return self.manifest["build_id"]
        return self.marker["build_id"] if self.marker is not None else None

    def recorded(self) -> set[str]:
        """Every file a previous build recorded it wrote (or was about to write)."""
        names = set(self.marker["files"]) if self.marker is not None else set()
        return names | (manifest_files(self.manifest) if self.manifest is not None else set())

    def owned(self) -> set[str]:
        """Present files a previous build recorded, and the temp copies its crashes left."""
        recorded = self.recorded()
        return {f for f in self.files if f in recorded or temp_of(f) in recorded}

    def foreign(self) -> list[str]:
        """Present files and folders no build of ours wrote (folders end in '/')."""
        names = self.files - self.owned()
        folders = self.folders - set(RESERVED_FOLDERS)
        if WORK_DIR in self.folders and self.marker is None and not self.leftover:
            folders.add(WORK_DIR)
        return sorted(names | {f"{name}/" for name in folders})


def collides(rel: str) -> bool:
    """Whether a build may write at `rel` (or inside it): such a foreign file blocks a build."""
    top = rel.partition("/")[0]
    return top in RESERVED_FILES or top in RESERVED_FOLDERS or top.startswith(SHARD_PREFIX)


def ours_marker(value: Any) -> dict | None:
    """`_work/build.json` normalized to {build_id, run, runs, files} if an mmcurate build
    wrote it (a marker from before runs were recorded has none: its work is not trusted)."""
    if not isinstance(value, dict):
        return None
    build_id = value.get("build_id")
    valid_id = isinstance(build_id, str) and BUILD_ID.fullmatch(build_id) is not None
    if value.get("tool") == TOOL and (valid_id or build_id is None):
        run, runs = value.get("run"), value.get("runs")
        runs = [r for r in runs if RUN_ID.fullmatch(str(r))] if isinstance(runs, list) else []
        run = run if RUN_ID.fullmatch(str(run)) else None
        files = safe_recorded(value.get("files", []))
        return {"build_id": build_id, "run": run, "runs": runs, "files": files}
    if "tool" not in value and valid_id:  # written before markers named their tool
        return {"build_id": build_id, "run": None, "runs": [], "files": []}
    return None


def read_json(fs: Any, path: str, size: int | None = None) -> Any:
    """A small JSON file's value; None when absent, a folder, too large, or not JSON."""
    if size is not None and size > MAX_RECORD_BYTES:
        return None
    try:
        return json.loads(with_retries(lambda: fs.cat_file(path)))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, ValueError):
        return None  # UnicodeDecodeError and JSONDecodeError are ValueErrors


def relative(path: str, root: str) -> str:
    prefix = root.rstrip("/") + "/"
    path = path.rstrip("/")
    return path[len(prefix) :] if path.startswith(prefix) else ""


def inspect_output(fs: Any, out: str, url: str) -> OutputState:
    """List output.path: top level, our reserved folders in full, and read its records."""
    state = OutputState(url)
    fs.invalidate_cache(out)  # other processes wrote there: never trust a cached listing
    if fs.isfile(out):
        raise ConfigError(f"output.path: {url} is a file, not a folder")
    try:
        entries = fs.ls(out, detail=True)
    except FileNotFoundError:
        return state
    for entry in entries:
        name = relative(entry["name"], out)
        if name and entry["type"] == "directory":
            state.folders.add(name)
        elif name:
            state.files.add(name)
            state.sizes[name] = entry.get("size") or 0
    for folder in sorted(state.folders & set(PUBLISHED_FOLDERS)):
        state.files |= {relative(p, out) for p in files_in(fs, join(out, folder))}
    if MANIFEST in state.files:
        value = read_json(fs, join(out, MANIFEST), state.sizes[MANIFEST])
        state.manifest = ours_manifest(value)
    if WORK_DIR in state.folders:
        state.marker = ours_marker(read_json(fs, join(out, WORK_DIR, BUILD_FILE)))
        state.leftover = state.marker is None and only_scratch(fs, join(out, WORK_DIR))
    return state


def only_scratch(fs: Any, work: str) -> bool:
    """Whether `_work/` holds nothing but names a build writes there (nothing at all, too): an
    interrupted build's scratch whose marker is gone (killed while writing its first marker or
    while dropping `_work/` after the commit; or a run that wrote on after another finished)."""
    fs.invalidate_cache(work)
    names = [relative(p, work) for p in fs.find(work, withdirs=True)]
    return all(WORK_NAMES.fullmatch(name) for name in names if name)

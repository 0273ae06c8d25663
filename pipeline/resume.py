"""What makes a build resumable and what it may delete: its identity, its ledger, its markers.

`_work/build.json` records the build's identity (the resolved config and the input plan) and
its ledger: every file outside `_work/` it is about to write, recorded *before* writing. A
finished build's manifest lists the files it wrote (`files`). Those records are the only
files a later build deletes: a rerun with the same identity skips every partition whose
signatures file exists and every shard whose marker exists; a different identity is refused
unless `--overwrite`, which deletes exactly the recorded files. A finished build (manifest
present) with the same identity is a no-op. Anything else in output.path belongs to someone
else: refused unless `output.allow_other_files`, and never deleted or overwritten.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from core.config_io import ConfigError
from core.formats import MANIFEST_FORMAT
from core.redaction import redact
from core.storage import (
    files_in,
    filesystem,
    join,
    remove_tree,
    with_retries,
    write_bytes_atomic,
)
from pipeline.config import BuildConfig
from pipeline.embeddings import EMBEDDING_COLUMNS, ROWS_PER_FILE
from pipeline.signatures import signatures_file

WORK_DIR = "_work"
BUILD_FILE = "build.json"
MANIFEST = "manifest.json"
TOOL = "mmcurate"
# Names a build writes: a file there that no build of ours recorded would be overwritten.
RESERVED_FILES = (MANIFEST, "stats.json", "report.html", "shardindex.json")
RESERVED_FOLDERS = (WORK_DIR, "signatures", "embeddings")
SHARD_PREFIX = "shard-"
BUILD_ID = re.compile(r"[0-9a-f]{64}")
ATOMIC_TMP = re.compile(r"(.+)\.tmp-[0-9a-f]{32}")  # storage.write_bytes_atomic's temp names
MAX_RECORD_BYTES = 256 << 20  # a manifest or marker larger than this is not one of ours


class AlreadyBuilt(Exception):
    """The output already holds this very build; carries its manifest."""

    def __init__(self, manifest: dict) -> None:
        super().__init__("already built")
        self.manifest = manifest


def build_identity(cfg: BuildConfig, parts: list[dict]) -> str:
    """Hash of what decides the output: config (minus how it runs) and the input plan."""
    how = {"overwrite", "allow_other_files"}
    config = json.loads(cfg.model_dump_json(exclude={"ray": True, "output": how}))
    # Credentials do not decide the output: rotated keys must still resume or find the build.
    config["storage_options"] = redact(config["storage_options"])
    text = json.dumps({"config": config, "parts": parts}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class OutputState:
    """What output.path holds, as a starting build sees it (paths relative to it)."""

    url: str
    manifest: dict | None = None  # a finished mmcurate build's manifest
    marker: dict | None = None  # an mmcurate build's _work/build.json: unfinished, or clearing
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
        if WORK_DIR in self.folders and self.marker is None:
            folders.add(WORK_DIR)
        return sorted(names | {f"{name}/" for name in folders})


def collides(rel: str) -> bool:
    """Whether a build may write at `rel` (or inside it): such a foreign file blocks a build."""
    top = rel.partition("/")[0]
    return top in RESERVED_FILES or top in RESERVED_FOLDERS or top.startswith(SHARD_PREFIX)


def in_namespace(rel: str) -> bool:
    """Names a build records outside _work: the fixed files, shard-*, signatures/, embeddings/."""
    top, _, rest = rel.partition("/")
    if top in ("signatures", "embeddings"):
        return bool(rest)
    return not rest and (top in RESERVED_FILES or top.startswith(SHARD_PREFIX))


def safe_recorded(names: Any) -> list[str]:
    """Recorded names a build may delete: relative, inside our namespace, no `..` (a forged or
    damaged record can never point a deletion anywhere else)."""
    if not isinstance(names, list):
        return []
    ok = []
    for name in names:
        parts = name.split("/") if isinstance(name, str) else [""]
        if all(p not in ("", ".", "..") for p in parts) and in_namespace(name):
            ok.append(name)
    return ok


def temp_of(rel: str) -> str | None:
    """`x` for `x.tmp-<uuid>` (an atomic write a crash interrupted), else None."""
    match = ATOMIC_TMP.fullmatch(rel)
    return match.group(1) if match else None


def embedding_files(count: int) -> list[str]:
    """Every name pipeline.embeddings may write for `count` file sets (one per group)."""
    folders = [*EMBEDDING_COLUMNS.values(), "metadata"]
    return [
        f"embeddings/{f}/{f}_{i:04d}.{'parquet' if f == 'metadata' else 'npy'}"
        for i in range(count)
        for f in folders
    ]


def shard_files(name: str) -> list[str]:
    """A final shard and its metadata parquet (pipeline.shards.write_shard)."""
    return [name, name.removesuffix(".tar") + ".parquet"]


def output_files(shards: list[str], groups: int) -> list[str]:
    """Every file (but the manifest) a build with these shards and signature groups may write."""
    fixed = ["stats.json", "shardindex.json", "report.html"]
    fixed += [signatures_file(g) for g in range(max(1, groups))]
    return fixed + embedding_files(groups) + [f for name in shards for f in shard_files(name)]


def manifest_files(manifest: dict) -> set[str]:
    """What a finished build wrote: its `files` record, or for a manifest from before that
    record existed, the names such a build wrote (one signatures file, embeddings per 1M)."""
    if "files" in manifest:
        return {MANIFEST, *safe_recorded(manifest["files"])}
    shards = manifest.get("shards")
    names = (
        [e.get("name") for e in shards if isinstance(e, dict)] if isinstance(shards, list) else []
    )
    samples = manifest.get("samples")
    rows = samples if isinstance(samples, int) and samples > 0 else 0
    derived = output_files([n for n in names if isinstance(n, str)], 0)
    derived += embedding_files(-(-rows // ROWS_PER_FILE))
    return {MANIFEST, *safe_recorded(derived)}


def ours_manifest(value: Any) -> dict | None:
    """The manifest if an mmcurate build wrote it (format and build id), else None."""
    if isinstance(value, dict) and value.get("format") == MANIFEST_FORMAT:
        build_id = value.get("build_id")
        if isinstance(build_id, str) and BUILD_ID.fullmatch(build_id):
            return value
    return None


def ours_marker(value: Any) -> dict | None:
    """`_work/build.json` normalized to {build_id, files} if an mmcurate build wrote it."""
    if not isinstance(value, dict):
        return None
    build_id = value.get("build_id")
    valid_id = isinstance(build_id, str) and BUILD_ID.fullmatch(build_id) is not None
    if value.get("tool") == TOOL and (valid_id or build_id is None):
        return {"build_id": build_id, "files": safe_recorded(value.get("files", []))}
    if "tool" not in value and valid_id:  # written before markers named their tool
        return {"build_id": build_id, "files": []}
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
    for folder in sorted(state.folders & {"signatures", "embeddings"}):
        state.files |= {relative(p, out) for p in files_in(fs, join(out, folder))}
    if MANIFEST in state.files:
        value = read_json(fs, join(out, MANIFEST), state.sizes[MANIFEST])
        state.manifest = ours_manifest(value)
    if WORK_DIR in state.folders:
        state.marker = ours_marker(read_json(fs, join(out, WORK_DIR, BUILD_FILE)))
    return state


def claim_output(cfg: BuildConfig, identity: str) -> None:
    """Make output.path ours: fresh, resumable, complete (AlreadyBuilt) or refused. Deletes
    only what an earlier mmcurate build recorded: with --overwrite, or to finish clearing
    what an interrupted --overwrite had started to delete."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    state = inspect_output(fs, out, cfg.output.path)
    overwrite = cfg.output.overwrite
    if state.manifest is not None and state.previous == identity and not overwrite:
        if state.marker is not None:  # scratch a crash right after the commit left behind
            drop_work(fs, out)
        raise AlreadyBuilt(state.manifest)
    refuse_foreign(state, cfg.output.allow_other_files)
    if state.previous not in (None, identity) and not overwrite:
        what = "already holds a different build"
        if state.manifest is None:
            what = "holds an unfinished build of another config or input"
        raise ConfigError(f"output.path: {cfg.output.path} {what}; pass --overwrite")
    if state.manifest is None and state.previous == identity and not overwrite:
        return  # an interrupted build of this very config and input: resume it
    try:
        if state.manifest is not None or state.marker is not None:
            clear_build(fs, out, state)
        write_marker(fs, out, identity, [])
    except (PermissionError, FileNotFoundError, NotADirectoryError) as err:
        # a read-only folder, a dangling link: the first write says so, in one line
        raise ConfigError(f"output.path: {cfg.output.path}: cannot write there ({err})") from None


def refuse_foreign(state: OutputState, allowed: bool) -> None:
    """Files no build of ours wrote: refused where a build writes; elsewhere unless allowed."""
    foreign = state.foreign()
    blocking = [name for name in foreign if collides(name)]
    if blocking:
        raise ConfigError(
            f"output.path: {state.url} holds {listing(blocking)}, which no mmcurate build "
            "wrote and a build would overwrite; choose another output.path"
        )
    if foreign and not allowed:
        raise ConfigError(
            f"output.path: {state.url} holds files no mmcurate build wrote ({listing(foreign)}); "
            "choose an empty folder, or set output.allow_other_files: true to write beside "
            "them (they are never deleted)"
        )


def listing(names: list[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def clear_build(fs: Any, out: str, state: OutputState) -> None:
    """Delete a previous build's recorded files, manifest first so no reader sees a half-deleted
    build; its records move to the marker first, so a crash midway loses track of nothing."""
    owned = state.owned()
    write_marker(fs, out, None, sorted(state.recorded()))
    if MANIFEST in owned:
        fs.rm_file(join(out, MANIFEST))
    rest = [join(out, name) for name in sorted(owned - {MANIFEST})]
    if rest:
        fs.rm(rest)
    clear_work(fs, out)
    for folder in ("embeddings", "signatures"):
        path = join(out, folder)
        if folder in state.folders and not files_in(fs, path):
            remove_tree(fs, path)  # empty now; on object stores, its folder markers too


def clear_work(fs: Any, out: str) -> None:
    """Everything in _work/ except the marker (ours: the marker says so)."""
    work = join(out, WORK_DIR)
    fs.invalidate_cache(work)
    try:
        entries = fs.ls(work, detail=True)
    except FileNotFoundError:
        return
    for entry in entries:
        path = entry["name"].rstrip("/")
        if relative(path, work) in ("", BUILD_FILE):
            continue
        if entry["type"] == "directory":
            remove_tree(fs, path)
        else:
            fs.rm_file(path)


def drop_work(fs: Any, out: str) -> None:
    """Remove _work/, its marker last: a crash midway never leaves scratch without an owner."""
    clear_work(fs, out)
    remove_tree(fs, join(out, WORK_DIR))


def write_marker(fs: Any, out: str, build_id: str | None, files: list[str]) -> None:
    record = {"tool": TOOL, "build_id": build_id, "files": files}
    write_bytes_atomic(fs, join(out, WORK_DIR, BUILD_FILE), json.dumps(record).encode())


def record_files(cfg: BuildConfig, names: list[str]) -> None:
    """Add `names` (relative to output.path) to the ledger, before the build writes them."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    marker = ours_marker(read_json(fs, join(out, WORK_DIR, BUILD_FILE)))
    if marker is None or marker["build_id"] is None:
        raise RuntimeError(f"{cfg.output.path}: the build's marker _work/build.json is gone")
    files = sorted({*marker["files"], *names})
    if files != marker["files"]:
        write_marker(fs, out, marker["build_id"], files)


def final_files(cfg: BuildConfig, expected: list[str]) -> list[str]:
    """Before the manifest: the expected files that exist (the manifest's record); recorded
    leftovers that are not among them (temp copies of interrupted writes) are deleted."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    state = inspect_output(fs, out, cfg.output.path)
    final = sorted(set(expected) & state.files)
    stale = sorted(state.owned() - set(final) - {MANIFEST})
    if stale:
        fs.rm([join(out, name) for name in stale])
    return final


def signatures_name(part: int) -> str:
    return f"part-{part:06d}.parquet"


def done_parts(work_url: str, storage_options: dict) -> set[int]:
    """Partitions whose signatures (their task's last write) exist."""
    fs, folder = filesystem(join(work_url, "signatures"), storage_options)
    fs.invalidate_cache(folder)  # other processes wrote there: never trust a cached listing
    if not fs.exists(folder):
        return set()
    return {
        int(p.rpartition("-")[2].split(".")[0]) for p in fs.glob(join(folder, "part-*.parquet"))
    }


def shard_marker(work_url: str, name: str) -> str:
    return join(work_url, "shards", name.replace(".tar", ".json"))


def done_shards(work_url: str, storage_options: dict) -> dict[str, dict]:
    """Manifest entries of final shards already written (their marker exists)."""
    fs, folder = filesystem(join(work_url, "shards"), storage_options)
    fs.invalidate_cache(folder)
    if not fs.exists(folder):
        return {}
    paths = fs.glob(join(folder, "shard-*.json"))
    entries = [json.loads(blob) for blob in fs.cat(paths).values()] if paths else []
    return {entry["name"]: entry for entry in entries}

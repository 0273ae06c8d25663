"""What makes a build resumable: its identity, and completion markers per task.

`_work/build.json` records the build's identity (the resolved config and the input plan). A
rerun with the same identity skips every partition whose signatures file exists (written last
by its task) and every shard whose marker exists; a different identity is refused unless
`--overwrite`. A finished build (manifest present) with the same identity is a no-op.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import BuildConfig
from pipeline.config_io import ConfigError
from pipeline.storage import filesystem, join, remove_tree, with_retries, write_bytes_atomic

WORK_DIR = "_work"
BUILD_FILE = "build.json"


class AlreadyBuilt(Exception):
    """The output already holds this very build; carries its manifest."""

    def __init__(self, manifest: dict) -> None:
        super().__init__("already built")
        self.manifest = manifest


def build_identity(cfg: BuildConfig, parts: list[dict]) -> str:
    """Hash of what decides the output: config (minus how it runs) and the input plan."""
    config = json.loads(cfg.model_dump_json(exclude={"ray": True, "output": {"overwrite"}}))
    text = json.dumps({"config": config, "parts": parts}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def claim_output(cfg: BuildConfig, identity: str) -> None:
    """Make output.path ours: fresh, resumable, complete (AlreadyBuilt) or refused."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    if cfg.output.overwrite:
        clear_output(fs, out)
    elif fs.exists(join(out, "manifest.json")):
        manifest = json.loads(fs.cat(join(out, "manifest.json")))
        if manifest.get("build_id") == identity:
            raise AlreadyBuilt(manifest)
        raise ConfigError(
            f"output.path: {cfg.output.path} already holds a different build; pass --overwrite"
        )
    elif fs.exists(join(out, WORK_DIR, BUILD_FILE)):
        stored = json.loads(fs.cat(join(out, WORK_DIR, BUILD_FILE)))["build_id"]
        if stored != identity:
            raise ConfigError(
                f"output.path: {cfg.output.path} holds an unfinished build of "
                "another config or input; pass --overwrite"
            )
        return
    write_bytes_atomic(
        fs, join(out, WORK_DIR, BUILD_FILE), json.dumps({"build_id": identity}).encode()
    )


def clear_output(fs: Any, out: str) -> None:
    """Remove a previous build, manifest first so no reader sees a half-deleted one."""
    for name in ("manifest.json", "shardindex.json"):
        if fs.exists(join(out, name)):
            fs.rm(join(out, name))
    for path in fs.glob(join(out, "shard-*.tar")) + fs.glob(join(out, "shard-*.parquet")):
        fs.rm(path)
    for folder in ("signatures", WORK_DIR):
        remove_tree(fs, join(out, folder))


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


def read_signatures(work_url: str, parts: list[int], storage_options: dict) -> pa.Table:
    """All partitions' signature rows, read back from storage (one batched fetch)."""
    fs, folder = filesystem(join(work_url, "signatures"), storage_options)
    paths = [join(folder, signatures_name(p)) for p in parts]
    blobs = with_retries(lambda: fs.cat(paths))
    tables = [pq.read_table(io.BytesIO(blobs[p])) for p in paths]
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


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

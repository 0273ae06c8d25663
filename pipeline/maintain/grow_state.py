"""What `mmcurate retry` and `mmcurate append` (the grow commands) share: the finished build
they grow, and the operation's own record.

A grow operation keeps its scratch in `OUTPUT/_grow/`: `op.json` (what it was asked: written
first, so a rerun after a crash resumes the same operation rather than choosing again), the
sub-build's phase A in `build/` (its own claim and markers, pipeline/output/claim.py) and the
union's decisions and staged files in `merge/`. The manifest is written last; the operation's
id in its `maintenance` record tells a rerun that the commit already happened.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from mmcurate.core.atomic import write_bytes_atomic
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.core.redaction import redact_text
from mmcurate.core.storage import filesystem, join
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.maintain import common
from mmcurate.pipeline.output.existing import read_json
from mmcurate.pipeline.output.names import GROW_DIR, GROW_OP, MANIFEST
from mmcurate.pipeline.sources.records import Partition, partitions_as_dicts

# Global stages whose decisions read columns a finished build does not publish (thumbnails,
# embeddings): their decisions over old and new rows together are not supported yet.
UNSUPPORTED_GLOBAL = ("near_dedupe", "semantic_dedupe")


@dataclass(frozen=True)
class Finished:
    """A finished build: its folder, how to reach it, its manifest and its config."""

    url: str
    storage_options: dict[str, Any]
    manifest: dict[str, Any]
    cfg: BuildConfig

    def grow_url(self, *names: str) -> str:
        return join(self.url, GROW_DIR, *names)


def finished_build(url: str, options: dict[str, Any], command: str = "retry") -> Finished:
    """The build at `url` and its recorded config (storage options: the command's); a
    ConfigError (one line) for a folder without a finished build or one it cannot grow."""
    found = common.finished_build(url, options, command)
    if not isinstance(found.manifest.get("config"), dict):
        raise ConfigError(f"{redact_text(url)}: {MANIFEST} is not an mmcurate build's manifest")
    config = dict(found.manifest["config"]) | {"storage_options": options}
    config["output"] = dict(config["output"]) | {"path": url, "overwrite": False}
    cfg = validate(BuildConfig, config)
    check_growable(cfg)
    if any(str(name).startswith("embeddings/") for name in found.manifest.get("files") or ()):
        # the new and the dropped samples' rows would be missing from or left in embeddings/
        raise ConfigError(
            f"{redact_text(url)}: this build publishes embeddings/ (clip_score): retry and "
            "append do not update them yet; rebuild with the new input instead"
        )
    return Finished(url, options, found.manifest, cfg)


def check_growable(cfg: BuildConfig) -> None:
    names = [stage.get("name") for stage in cfg.model_dump()["stages"]]
    unsupported = sorted(set(names) & set(UNSUPPORTED_GLOBAL))
    if unsupported:
        raise ConfigError(f"this build uses {', '.join(unsupported)}: retry/append not supported")


def sub_config(build: Finished, source: dict[str, Any] | None = None) -> BuildConfig:
    """The build's config for the new samples' phase A: same stages, output in `_grow/build`."""
    config = json.loads(build.cfg.model_dump_json())
    config["storage_options"] = build.storage_options
    # Each new sample's candidate holds its own bytes (no references to copies stored once:
    # the new shards are written from the candidates as they are).
    config["output"] = config["output"] | {
        "path": build.grow_url("build"),
        "store_copies_once": False,
    }
    if source is not None:
        config["source"] = source
    return validate(BuildConfig, config)


def read_op(build: Finished) -> dict[str, Any] | None:
    fs, path = filesystem(build.grow_url(GROW_OP), build.storage_options)
    found = read_json(fs, path)
    return found if isinstance(found, dict) and "op" in found else None


def start_op(build: Finished, command: str, asked: Any, parts: list[Partition]) -> dict[str, Any]:
    """The operation's record, written before any of its work (a rerun resumes it); its
    partitions as their dicts (JSON)."""
    op = {"op": uuid.uuid4().hex, "command": command, "asked": asked}
    op["parts"] = partitions_as_dicts(parts)
    fs, path = filesystem(build.grow_url(GROW_OP), build.storage_options)
    write_bytes_atomic(fs, path, json.dumps(op).encode())
    return op


def resumed_op(build: Finished, command: str, asked: Any) -> dict[str, Any] | None:
    """An unfinished operation's record; a ConfigError when it was another command."""
    op = read_op(build)
    if op is None:
        return None
    if op["command"] != command or op["asked"] != asked:
        raise ConfigError(
            f"{redact_text(build.url)}: an unfinished `mmcurate {op['command']}` is there "
            f"({GROW_DIR}/{GROW_OP}); run that command again to finish it first"
        )
    return op


def committed(build: Finished, op: dict[str, Any]) -> bool:
    """Whether the manifest already records this operation (its commit happened)."""
    records = build.manifest.get("maintenance") or []
    return any(isinstance(r, dict) and r.get("op") == op["op"] for r in records)


def records(manifest: dict[str, Any]) -> int:
    """How many maintenance records the manifest holds."""
    return len(manifest.get("maintenance") or [])


def new_record(manifest: dict[str, Any], before: int) -> dict[str, Any]:
    """The operation's record (what the command prints), or zeros when it changed nothing."""
    found = manifest.get("maintenance") or []
    return found[-1] if len(found) > before else {"fetched": 0, "added": 0}

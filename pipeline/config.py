"""The build config: YAML -> typed, validated models (keys fixed by DESIGN.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from mmcurate.core.config_io import ConfigError, Strict, checked_resources, load_yaml, validate
from mmcurate.core.storage import GLOB_CHARS, absolute
from mmcurate.stages.registry import validate_stage_list
from pydantic import AfterValidator, Field, field_validator, model_validator

PROTOCOL_ALIASES = {"s3a": "s3", "gcs": "gs", "local": "file"}


def resolved_here(path: str) -> str:
    """A local path made absolute (`~` and relative parts) where the config is loaded. Why:
    Ray workers have their own working folder, and may have their own HOME. An empty path
    (an unset shell variable) is refused: made absolute, it would name the current folder."""
    rest = path.partition("://")[2] if "://" in path else path
    if not rest.strip():
        raise ValueError("must not be empty (an unset variable?)")
    return absolute(path)


def plain_output(path: str) -> str:
    """An output path the build can list and delete in exactly: no glob characters (stores
    and fsspec expand them when listing or deleting, which reached another build's files) and,
    on object stores, no empty, `.` or `..` part (a store keeps them in the key or refuses
    them, and SeaweedFS folds `a//b` into `a/b`, so the output's own listing came back empty)."""
    if any(c in path for c in GLOB_CHARS):
        raise ValueError("must not hold glob characters (*, ?, [)")
    protocol, _, rest = path.rpartition("://")
    if PROTOCOL_ALIASES.get(protocol, protocol or "file") != "file":
        parts = rest.rstrip("/").split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"{path}: an empty, '.' or '..' part in an object store path")
    return path


def location(url: str) -> tuple[str, str, bool]:
    """(protocol, path, pattern) that a source or output names. A glob (glob characters, and
    for a local path nothing that exists as written, such as a folder `clips [2020]`) is named
    by its fixed prefix: the text before its first glob character, a string prefix of all it
    can match (`s3://b/in [1]` cannot match `s3://b/out`). Local paths with `~`, relative parts
    and symlinks resolved."""
    protocol, _, rest = url.rpartition("://")
    protocol = PROTOCOL_ALIASES.get(protocol, protocol or "file")
    local = protocol == "file"
    cuts = [rest.find(c) for c in GLOB_CHARS if c in rest]
    pattern = bool(cuts) and not (local and os.path.exists(os.path.expanduser(rest)))
    if pattern:
        rest = rest[: min(cuts)]
    if not local:
        return protocol, rest.lstrip("/") if pattern else rest.strip("/"), pattern
    if pattern:  # the folder resolved, then the start of the name
        folder, _, stem = rest.rpartition("/")
        return (
            protocol,
            os.path.join(os.path.realpath(os.path.expanduser(folder or "/")), stem),
            True,
        )
    return protocol, os.path.realpath(os.path.expanduser(rest)), False


def overlaps(a: str, b: str) -> bool:
    """Whether two locations are equal, one holds the other, or a glob may match within the
    other."""
    (pa, a_path, a_glob), (pb, b_path, b_glob) = location(a), location(b)
    return pa == pb and (
        covers(a_path, a_glob, b_path, b_glob) or covers(b_path, b_glob, a_path, a_glob)
    )


def covers(outer: str, outer_glob: bool, inner: str, inner_glob: bool) -> bool:
    """Whether `inner` (a path, or a glob's fixed prefix) may lie within `outer`."""
    if inner_glob and outer.startswith(inner):  # the glob may match `outer` itself
        return True
    if outer_glob:
        return inner.startswith(outer)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


class SourceConfig(Strict):
    """Where samples come from."""

    kind: Literal["images", "webdataset", "urls", "videos"]
    path: str = Field(description="Folder (images), tar glob (webdataset) or file, any fsspec URL.")
    caption_column: str = "caption"
    url_column: str = "url"
    path_column: str = "path"  # videos from a list file: the column holding each video's path
    files_per_task: int = Field(
        256, gt=0, description="Input files (or samples) read by one Ray task."
    )
    carry_columns: list[str] | None = Field(
        None, description="urls: columns copied into <key>.json (None: all but url and caption)."
    )
    chunk_bytes: int = Field(
        128 << 20, gt=0, description="Media bytes read into one chunk of a task (with batch_size)."
    )
    spill_bytes: int = Field(
        16 << 20, ge=0, description="Media files or tar members above this go to local disk."
    )

    _resolve = field_validator("path")(resolved_here)


class OutputConfig(Strict):
    """Where and how the final shards are written."""

    path: str
    shard_max_samples: int = Field(10_000, gt=0)
    shard_max_bytes: int = Field(1_000_000_000, gt=0)
    overwrite: bool = Field(False, description="replace a previous mmcurate build's own files")
    allow_other_files: bool = Field(
        False, description="write into a folder holding other files (never deleted or overwritten)"
    )
    store_copies_once: bool = Field(
        True, description="phase A stores a media payload seen before as a reference to it"
    )
    copies_index_bytes: int = Field(
        1 << 30, gt=0, description="memory for store_copies_once's index of stored payloads"
    )

    _resolve = field_validator("path")(resolved_here)
    _plain = field_validator("path")(plain_output)


class RayConfig(Strict):
    """How to reach Ray; resources for the per-sample stages."""

    address: str | None = Field(
        None, description="Cluster address; None uses RAY_ADDRESS, else a local Ray."
    )
    num_cpus: int | None = Field(None, gt=0, description="CPUs: local Ray or pool (default: all).")
    batch_size: int = Field(64, gt=0, description="Samples per stage call inside a task.")
    runtime: Literal["auto", "ray", "local"] = Field(
        "auto",
        description="Where tasks run: Ray, or warm local worker processes (auto: local on one "
        "machine without a cluster, custom resources or model actor pools).",
    )
    resources: Annotated[dict[str, float], AfterValidator(checked_resources)] = Field(
        default_factory=dict,
        description="Custom Ray resources each partition task asks for, e.g. {ingest: 1}.",
    )
    task_memory: int | None = Field(
        None,
        gt=0,
        description="Bytes of memory each partition task declares to Ray (None: 3 x "
        "source.chunk_bytes + 512 MiB for the worker itself, see docs/configuration.md).",
    )


class BuildConfig(Strict):
    """A whole build: source, ordered stages, output, storage and Ray settings."""

    source: SourceConfig
    stages: list[dict[str, Any]] = Field(default_factory=list)
    output: OutputConfig
    storage_options: dict[str, Any] = Field(default_factory=dict)
    ray: RayConfig = RayConfig()

    @field_validator("stages")
    @classmethod
    def _stages_are_known(cls, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        validate_stage_list(stages)
        return stages

    @model_validator(mode="after")
    def _kind_is_supported(self) -> BuildConfig:
        if self.source.kind not in ("images", "webdataset", "urls", "videos"):
            raise ValueError(f"source.kind {self.source.kind!r} is not implemented yet")
        return self


def check_ray_resources(cfg: BuildConfig) -> None:
    """Custom resources exist only on a cluster that declares them: a local Ray (no ray.address,
    no RAY_ADDRESS) would leave tasks asking for one waiting forever."""
    if cfg.ray.address or os.environ.get("RAY_ADDRESS"):
        return
    wanted = set(cfg.ray.resources)
    for stage in cfg.stages:
        resources = stage.get("resources")
        wanted |= set(resources) if isinstance(resources, dict) else set()
    if wanted:
        raise ConfigError(
            f"ray.resources: {', '.join(sorted(wanted))} asked for, but a local Ray has no "
            "custom resources; set ray.address (or RAY_ADDRESS) to a cluster that declares them"
        )


def check_paths(cfg: BuildConfig) -> None:
    """Refuse an output that overlaps the source: a build must never read what it writes, nor
    delete or overwrite its own input (deduplicating a folder of shards in place)."""
    if overlaps(cfg.source.path, cfg.output.path):
        raise ConfigError(
            f"output.path: {cfg.output.path} overlaps source.path {cfg.source.path}; "
            "write the output somewhere else"
        )


def load_build_config(path: str | Path | dict, overrides: list[str] | None = None) -> BuildConfig:
    """Read, override and validate a build config; ConfigError holds one line."""
    return validate(BuildConfig, load_yaml(path, overrides))


__all__ = ["BuildConfig", "ConfigError", "load_build_config"]

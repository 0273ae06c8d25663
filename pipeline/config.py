"""The build config: YAML -> typed, validated models (keys fixed by DESIGN.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.config_io import ConfigError, load_yaml, validate
from pipeline.storage import absolute
from stages.registry import validate_stage_list


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def resolved_here(path: str) -> str:
    """A local path made absolute (`~` and relative parts) where the config is loaded. Why:
    Ray workers have their own working folder, and may have their own HOME."""
    return absolute(path)


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

    _resolve = field_validator("path")(resolved_here)


class OutputConfig(Strict):
    """Where and how the final shards are written."""

    path: str
    shard_max_samples: int = Field(10_000, gt=0)
    shard_max_bytes: int = Field(1_000_000_000, gt=0)
    overwrite: bool = False

    _resolve = field_validator("path")(resolved_here)


class RayConfig(Strict):
    """How to reach Ray; resources for the per-sample stages."""

    address: str | None = Field(
        None, description="Cluster address; None uses RAY_ADDRESS, else a local Ray."
    )
    num_cpus: int | None = Field(None, gt=0, description="CPUs for a local Ray (default: all).")
    batch_size: int = Field(64, gt=0, description="Samples per map_batches call.")


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


def load_build_config(path: str | Path, overrides: list[str] | None = None) -> BuildConfig:
    """Read, override and validate a build config; ConfigError holds one line."""
    return validate(BuildConfig, load_yaml(path, overrides))


__all__ = ["BuildConfig", "ConfigError", "load_build_config"]

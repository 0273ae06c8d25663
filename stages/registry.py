"""Look up stages by name and validate a config's stage list with one-line errors."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

import stages.caption_filter  # noqa: F401  (registers)
import stages.clip_score  # noqa: F401
import stages.clip_split  # noqa: F401
import stages.decode_image  # noqa: F401
import stages.download  # noqa: F401
import stages.exact_dedupe  # noqa: F401
import stages.language_filter  # noqa: F401
import stages.metadata_filter  # noqa: F401
import stages.near_dedupe  # noqa: F401
import stages.semantic_dedupe  # noqa: F401
import stages.video_frames  # noqa: F401
from core.config_io import ConfigError, describe_validation_error
from stages.base import _REGISTRY, Stage, label_stages
from stages.semantic_dedupe import SemanticDedupe


def known_stages() -> list[str]:
    return sorted(_REGISTRY)


def build_stage(spec: dict[str, Any], index: int = 0) -> Stage:
    """`{name: decode_image, resize: {...}}` -> a configured stage; ConfigError if invalid."""
    where = f"stages.{index}"
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{where}: each stage needs a 'name'")
    name = spec["name"]
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError(
            f"{where}.name: unknown stage {name!r} (known: {', '.join(known_stages())})"
        )
    options = {k: v for k, v in spec.items() if k != "name"}
    try:
        return cls(cls.Options.model_validate(options), index=index)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err, prefix=where)) from None


def validate_stage_list(specs: list[dict[str, Any]]) -> None:
    """Raise ConfigError for the first invalid stage or a repeated global stage."""
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        stage = build_stage(spec, index)
        if stage.is_global and stage.name in seen:
            raise ConfigError(f"stages.{index}.name: {stage.name!r} appears twice")
        seen.add(stage.name)


def stage_order(stages: list[Stage]) -> list[Stage]:
    """Execution order: per-sample work in config order, then global decisions."""
    return [s for s in stages if not s.is_global] + [s for s in stages if s.is_global]


def build_stages(specs: list[dict[str, Any]]) -> list[Stage]:
    stages = label_stages([build_stage(spec, i) for i, spec in enumerate(specs)])
    ordered = stage_order(stages)
    for at, stage in enumerate(ordered):
        if isinstance(stage, SemanticDedupe):
            stage.embeddings_given = any("embedding" in s.produces for s in ordered[:at])
    return stages

"""Look up stages by name and validate a config's stage list with one-line errors."""

from __future__ import annotations

import importlib
from typing import Any

from mmcurate.core.config_io import ConfigError, describe_validation_error
from mmcurate.stages.base import _REGISTRY, Stage, label_stages
from mmcurate.stages.lib.dead_ends import dead_end
from pydantic import ValidationError

# Each stage's module, imported only when a config names the stage: a build imports what it
# runs (PyAV, pandas, scipy, open_clip stay out of builds that do not use them).
STAGE_MODULES = {
    name: f"mmcurate.stages.{name}"
    for name in (
        "aesthetic_score",
        "aspect_buckets",
        "caption_filter",
        "clip_score",
        "clip_split",
        "decode_image",
        "download",
        "exact_dedupe",
        "face_blur",
        "language_filter",
        "metadata_filter",
        "motion_score",
        "near_dedupe",
        "recaption",
        "semantic_dedupe",
        "text_area",
        "video_frames",
        "video_buckets",
    )
}


def known_stages() -> list[str]:
    return sorted(STAGE_MODULES)


def stage_class(name: str) -> type[Stage] | None:
    """The stage class registered under `name` (its module imported now), or None."""
    if name not in STAGE_MODULES:
        return None
    importlib.import_module(STAGE_MODULES[name])
    return _REGISTRY[name]


def all_stages() -> dict[str, type[Stage]]:
    """Every stage class by name (imports every stage module: for docs and tests)."""
    return {name: stage_class(name) for name in known_stages()}  # type: ignore[misc]


def build_stage(spec: dict[str, Any], index: int = 0) -> Stage:
    """`{name: decode_image, resize: {...}}` -> a configured stage; ConfigError if invalid."""
    where = f"stages.{index}"
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"{where}: each stage needs a 'name'")
    name = spec["name"]
    cls = stage_class(name) if isinstance(name, str) else None
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
    seen: dict[str, Stage] = {}
    built = []
    for index, spec in enumerate(specs):
        stage = build_stage(spec, index)
        if stage.is_global and stage.name in seen:
            raise ConfigError(f"stages.{index}.name: {stage.name!r} appears twice")
        seen.setdefault(stage.name, stage)
        built.append(stage)
    check_embedding_models(seen.get("semantic_dedupe"), seen.get("clip_score"))
    why = dead_end(stage_order(built))  # stages that can never keep a sample together
    if why is not None:
        raise ConfigError(why)
    if "recaption" in seen:
        build_stages(specs)  # binds each recaption to its clip_score (one-line errors)


def check_embedding_models(semantic: Stage | None, clip: Stage | None) -> None:
    """semantic_dedupe listed before clip_score embeds with its own model, and clip_score then
    writes its embeddings over those (the column they share): with two different models the
    dedupe would silently run on clip_score's. Refused; with one model nothing differs."""
    if semantic is None or clip is None or semantic.index > clip.index:
        return
    ours, theirs = semantic.options, clip.options
    if (ours.model, ours.pretrained) != (theirs.model, theirs.pretrained):
        raise ConfigError(
            f"stages.{semantic.index}: semantic_dedupe before clip_score with another model "
            f"({ours.model} {ours.pretrained} vs {theirs.model} {theirs.pretrained}): "
            "clip_score's embeddings would replace its own; list clip_score first "
            "(semantic_dedupe then reuses its embeddings) or give both the same model"
        )


def stage_order(stages: list[Stage]) -> list[Stage]:
    """Execution order of the per-sample work (global decisions come later, on signatures):
    per-sample stages in config order, then the global stages' own per-sample work (scores,
    hashes, embeddings), then the per-sample stages that read a column a global stage listed
    before them writes (`metadata_filter` on `clip_score` or `concept_*`): before, those ran
    first, found the column missing, and dropped every sample."""
    globals_ = [s for s in stages if s.is_global]

    def waits(stage: Stage) -> bool:
        earlier = [g for g in globals_ if g.index < stage.index]
        return any(g.provides(column) for g in earlier for column in stage.consumes)

    late = [s for s in stages if not s.is_global and waits(s)]
    early = [s for s in stages if not s.is_global and s not in late]
    return early + globals_ + late


def build_stages(specs: list[dict[str, Any]]) -> list[Stage]:
    stages = label_stages([build_stage(spec, i) for i, spec in enumerate(specs)])
    ordered = stage_order(stages)
    for at, stage in enumerate(ordered):
        stage.after_io = any(s.io_bound for s in ordered[:at])
        if stage.name == "semantic_dedupe":  # by name: its module is imported only when used
            stage.embeddings_given = any("embedding" in s.produces for s in ordered[:at])
        if stage.name == "aesthetic_score":  # a clip_score before it may embed for it
            stage.share_embeddings(ordered[:at])
        if stage.name == "recaption":  # scores with the clip_score listed before it
            stage.bind_clip([s for s in stages if s.name == "clip_score" and s.index < stage.index])
    return stages

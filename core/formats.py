"""The formats every package shares, defined once: sample columns (WebDataset member names),
the per-sample json, the build manifest's format tag, and the training checkpoint's."""

from __future__ import annotations

import json
import math
import re
from typing import Any

# Media columns a sample may carry; sources fill the one matching the file type.
IMAGE_COLUMNS = ("jpg", "png", "webp", "gif", "bmp", "tiff")
VIDEO_COLUMNS = ("mp4", "webm", "avi", "mkv", "mov")
FRAME_COLUMN = re.compile(r"^\d{3}\.jpg$")  # sampled video frames: 000.jpg, 001.jpg, ...
# Columns that become tar members (frames too); everything else stays in the signatures.
MEMBER_COLUMNS = (*IMAGE_COLUMNS, "txt", "json", "cls", *VIDEO_COLUMNS)

MANIFEST_FORMAT = "mmcurate/1"  # manifest.json's "format" (a build's output)
CHECKPOINT_FORMAT = "mmcurate-checkpoint/1"  # an `mmcurate train` checkpoint's "format"


def frame_column(index: int) -> str:
    return f"{index:03d}.jpg"


def is_media_column(column: str) -> bool:
    """Columns holding media bytes: they go into tars, never into the signatures."""
    return column in IMAGE_COLUMNS or column in VIDEO_COLUMNS or bool(FRAME_COLUMN.match(column))


def is_member_column(column: str) -> bool:
    """Columns written as `<key>.<column>` tar members."""
    return column in MEMBER_COLUMNS or bool(FRAME_COLUMN.match(column))


def meta_json(meta: Any, **options: Any) -> str:
    """json.dumps for what goes into a sample's `.json` (and other JSON we write): never the
    NaN or Infinity that Python writes and no JSON reader accepts (JavaScript's JSON.parse,
    jq, Go); a non-finite float becomes null. `1e400` in a sidecar reads as infinity."""
    try:
        return json.dumps(meta, allow_nan=False, **options)
    except ValueError:
        return json.dumps(finite(meta), allow_nan=False, **options)


def finite(value: Any) -> Any:
    """`value` with every float that is NaN or infinite, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def sample_meta(text: str | bytes | None) -> dict[str, Any]:
    """A sample's `json` member as a dict; {} when absent, not JSON, or not a JSON object.
    Sources drop such samples as `bad_json`; stages still never trust the member."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting overflows
        return {}
    return value if isinstance(value, dict) else {}


def with_fields(text: str | bytes | None, fields: dict[str, Any]) -> str:
    """A sample's `json` member with `fields` set (added or replaced), keys sorted."""
    meta = sample_meta(text)
    meta.update(fields)
    return meta_json(meta, sort_keys=True, ensure_ascii=False)


def package_version(distribution: str) -> str:
    """An installed distribution's version, "unknown" where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"

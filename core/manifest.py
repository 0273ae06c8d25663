"""A build's manifest.json (format `mmcurate/1`), defined once: the build writes it with
`manifest_document`, the trainer and evaluator read it with `parse_manifest`.

Shape: {"format", "samples", "shards": [{"name", "samples", "bytes", "sha256"}], "config",
"build_id", "created"}; the build adds "files" (what it wrote) just before it commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mmcurate.core.formats import MANIFEST_FORMAT

SHARD_FIELDS = ("name", "samples", "bytes", "sha256")  # one manifest entry per shard


class ManifestError(RuntimeError):
    """The manifest is missing, unreadable or malformed; reported as one line."""


@dataclass(frozen=True)
class Shard:
    url: str  # absolute: the manifest's folder joined with the shard name
    samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    url: str
    samples: int
    shards: tuple[Shard, ...]


def manifest_document(
    entries: list[dict[str, Any]],
    config: dict[str, Any],
    build_id: str,
    models: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The manifest a build commits: its shard entries (SHARD_FIELDS each, in name order), the
    resolved config (already redacted by the caller) and the models and detectors its stages
    ran, with their packages' versions (`Stage.models`)."""
    shards = [{field: entry[field] for field in SHARD_FIELDS} for entry in entries]
    return {
        "format": MANIFEST_FORMAT,
        "samples": sum(shard["samples"] for shard in shards),
        "shards": shards,
        "config": config,
        "models": list(models or []),
        "build_id": build_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def shard_url(manifest_url: str, name: str) -> str:
    """Join a shard name to the folder holding the manifest (works for paths and URLs)."""
    if not name or name.startswith("/") or "://" in name or ".." in name.split("/"):
        raise ManifestError(f"{manifest_url}: bad shard name {name!r}")
    folder = manifest_url.rsplit("/", 1)[0] if "/" in manifest_url else "."
    return f"{folder}/{name}"


def parse_manifest(url: str, doc: Any) -> Manifest:
    """Validate the parsed JSON of a manifest and build a Manifest."""
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ManifestError(f"{url}: expected format {MANIFEST_FORMAT!r}, found {found!r}")
    try:
        shards = tuple(
            Shard(
                shard_url(url, e["name"]), count(e["samples"]), count(e["bytes"]), str(e["sha256"])
            )
            for e in doc["shards"]
        )
        samples = count(doc["samples"])
    except (KeyError, TypeError, ValueError, OverflowError) as err:  # Overflow: Infinity
        raise ManifestError(f"{url}: malformed manifest ({type(err).__name__}: {err})") from None
    if not shards:
        raise ManifestError(f"{url}: manifest lists no shards")
    return Manifest(url=url, samples=samples, shards=shards)


def count(value: Any) -> int:
    """A manifest count: a non-negative whole number (2.0 is 2; 1.5, -1, "3" or true are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"not a whole number: {value!r}")
    if value < 0:
        raise ValueError(f"a negative count: {value!r}")
    return int(value)

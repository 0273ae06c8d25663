"""Read a build's manifest.json (format `mmcurate/1`) and resolve its shard URLs.

Kept free of torch so that a bad manifest fails fast, before any model is built.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import fsspec

from core.formats import MANIFEST_FORMAT


class ManifestError(RuntimeError):
    """The manifest is missing, unreadable or malformed; reported as one line."""


class NoUsableData(ManifestError):
    """None of the manifest's shards holds a usable sample; reported as one line."""


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
            Shard(shard_url(url, s["name"]), int(s["samples"]), int(s["bytes"]), str(s["sha256"]))
            for s in doc["shards"]
        )
        samples = int(doc["samples"])
    except (KeyError, TypeError, ValueError) as err:
        raise ManifestError(f"{url}: malformed manifest ({type(err).__name__}: {err})") from None
    if not shards:
        raise ManifestError(f"{url}: manifest lists no shards")
    return Manifest(url=url, samples=samples, shards=shards)


def read_manifest(url: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Fetch and parse the manifest at `url` (local path or fsspec URL)."""
    url = expand_local(url)
    try:
        with fsspec.open(url, "rb", **(storage_options or {})) as f:
            raw = f.read()
    # Why broad: each storage backend raises its own error types (botocore, aiohttp, OSError).
    except Exception as err:  # noqa: BLE001
        raise ManifestError(f"cannot read manifest {url}: {type(err).__name__}: {err}") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ManifestError(f"{url}: not valid JSON ({err})") from None
    return parse_manifest(url, doc)


def expand_local(url: str) -> str:
    """Local paths may start with `~` (as build outputs may)."""
    return url if "://" in url else os.path.expanduser(url)

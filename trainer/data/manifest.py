"""Read a build's manifest.json (its format: core/manifest.py) from local disk or any URL.

Kept free of torch so that a bad manifest fails fast, before any model is built.
"""

from __future__ import annotations

import json
import os
from typing import Any

import fsspec
from mmcurate.core.manifest import Manifest, ManifestError, parse_manifest


class NoUsableData(ManifestError):
    """None of the manifest's shards holds a usable sample; reported as one line."""


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

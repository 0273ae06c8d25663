"""What the commands on a finished build share: their `--storage-options`, and the finished
build they act on (its manifest, read and checked, with no build running there)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.redaction import redact_text
from mmcurate.core.storage import filesystem, join, with_retries
from mmcurate.pipeline.output.existing import read_json
from mmcurate.pipeline.output.publish import MANIFEST, ours_manifest
from mmcurate.pipeline.output.work_names import BUILD_FILE, WORK_DIR


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-options", default="{}", help="fsspec options as JSON (default: environment)"
    )


def storage_options(text: str) -> dict[str, Any]:
    """`--storage-options` parsed: a JSON object, else a one-line ConfigError."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--storage-options: not JSON: {err.msg} (char {err.pos})") from None
    if not isinstance(options, dict):
        raise ConfigError('--storage-options: expected a JSON object such as {"anon": true}')
    return options


@dataclass(frozen=True)
class FinishedBuild:
    """A finished build's folder: where it is, how to reach it, and its manifest."""

    url: str
    storage_options: dict[str, Any]
    fs: Any
    root: str
    manifest: dict[str, Any]
    manifest_bytes: bytes

    def path(self, rel: str) -> str:
        return join(self.root, rel)

    def work(self, rel: str) -> str:
        return join(self.root, WORK_DIR, rel)


def finished_build(url: str, options: dict[str, Any]) -> FinishedBuild:
    """The build at `url`; a ConfigError (one line) for a folder without a finished mmcurate
    build, or one where a build (or another command holding its claim) is unfinished."""
    try:
        fs, root = filesystem(url, options)
        fs.invalidate_cache(root)
        blob = with_retries(lambda: fs.cat_file(join(root, MANIFEST)))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ConfigError(f"{redact_text(url)}: no finished mmcurate build here") from None
    except (ValueError, ImportError) as err:  # a bad URL or an unknown protocol
        raise ConfigError(f"{redact_text(url)}: cannot open ({err})") from None
    try:
        manifest = ours_manifest(json.loads(blob))
    except ValueError:
        manifest = None
    if manifest is None:
        raise ConfigError(f"{redact_text(url)}: {MANIFEST} is not an mmcurate build's manifest")
    if read_json(fs, join(root, WORK_DIR, BUILD_FILE)) is not None:
        raise ConfigError(
            f"{redact_text(url)}: a build is unfinished there ({WORK_DIR}/{BUILD_FILE}); "
            "finish it (run it again) first"
        )
    return FinishedBuild(url, options, fs, root, manifest, blob)

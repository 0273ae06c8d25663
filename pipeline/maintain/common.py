"""What the commands on a finished build share: the finished build they act on (its
manifest, read and checked, with no build and no other command unfinished there)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mmcurate.core.config_io import ConfigError
from mmcurate.core.redaction import redact_text
from mmcurate.core.storage import filesystem, join, with_retries
from mmcurate.pipeline.output.existing import read_json
from mmcurate.pipeline.output.names import (
    BUILD_FILE,
    GROW_DIR,
    GROW_OP,
    MANIFEST,
    REMOVE,
    WORK_DIR,
    ours_manifest,
    remove_file,
)


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


def finished_build(url: str, options: dict[str, Any], command: str) -> FinishedBuild:
    """The build at `url`; a ConfigError (one line) for a folder without a finished mmcurate
    build, or one where a build or another command than `command` (remove | retry | append)
    is unfinished: each rewrites what the other reads."""
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
    check_no_other_command(fs, root, url, command)
    return FinishedBuild(url, options, fs, root, manifest, blob)


def check_no_other_command(fs: Any, root: str, url: str, command: str) -> None:
    """ConfigError when an unfinished remove (for retry/append) or retry/append (for remove)
    holds the folder: run that one again to finish it first."""
    op = read_json(fs, join(root, GROW_DIR, GROW_OP)) if command == "remove" else None
    if isinstance(op, dict):
        other = f"mmcurate {op.get('command', 'retry')}"
        where = f"{GROW_DIR}/{GROW_OP}"
    elif command != "remove" and read_json(fs, join(root, WORK_DIR, remove_file("plan.json"))):
        other, where = "mmcurate remove", f"{WORK_DIR}/{REMOVE}/"
    else:
        return
    raise ConfigError(
        f"{redact_text(url)}: an unfinished `{other}` is there ({where}); run it again to "
        "finish it first"
    )

"""Where a run's files live: `run.output`, a local folder or an object-store URL.

A local folder is written in place. For a URL (s3://, gs://, ...) checkpoints are uploaded
whole (trainer/checkpoint.py), while the logs, which grow line by line and which object
stores cannot append to, are written to a local mirror per rank and uploaded (the files that
changed, each whole) before every checkpoint and at the end. A resume downloads them first,
so the logs continue where the checkpoint left off, on any machine. Each rank owns its
files: rank 0 `metrics.jsonl`, `summary.json` and `tensorboard/`; rank r
`samples/rank-<r>.jsonl`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mmcurate.core.atomic import put_file_atomic
from mmcurate.core.config_io import ConfigError
from mmcurate.core.storage import filesystem, join, protocol_of, remove_tree, with_retries

MIRRORS = Path("~/.cache/mmcurate/runs")


def is_remote(output: str) -> bool:
    return protocol_of(output) != "file"


class RunLogs:
    """One rank's log folder: `run.output` itself, or its local mirror for a URL."""

    def __init__(self, output: str, rank: int, storage_options: dict[str, Any]) -> None:
        self.output, self.rank, self.storage_options = output, rank, storage_options
        self.remote = is_remote(output)
        digest = hashlib.sha256(output.encode()).hexdigest()[:16]
        mirror = MIRRORS.expanduser() / digest / f"rank-{rank}"
        self.folder = mirror if self.remote else Path(output)
        self.sent: dict[Path, tuple[int, int]] = {}  # file -> (size, mtime) uploaded

    def start(self, resume: bool) -> None:
        """Ready for the run: for a URL, an emptied mirror holding the stored logs when the
        run resumes."""
        if self.remote:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.remote and resume:
            self.download()

    def owned(self) -> list[Path]:
        """This rank's log files (relative paths) that exist."""
        names = [Path("samples") / f"rank-{self.rank}.jsonl"]
        if self.rank == 0:
            names += [Path("metrics.jsonl"), Path("summary.json")]
            board = self.folder / "tensorboard"
            names += [p.relative_to(self.folder) for p in board.rglob("*") if p.is_file()]
        return [name for name in names if (self.folder / name).is_file()]

    def download(self) -> None:
        fs, root = filesystem(self.output, self.storage_options)
        names = [f"samples/rank-{self.rank}.jsonl"] + (["metrics.jsonl"] if self.rank == 0 else [])
        for name in names:
            if fs.isfile(join(root, name)):
                (self.folder / name).parent.mkdir(parents=True, exist_ok=True)
                with_retries(lambda n=name: fs.get_file(join(root, n), str(self.folder / n)))

    def upload(self) -> None:
        """For a URL output: this rank's log files that changed since the last upload."""
        if not self.remote:
            return
        fs, root = filesystem(self.output, self.storage_options)
        for name in self.owned():
            stat = (self.folder / name).stat()
            if self.sent.get(name) != (stat.st_size, stat.st_mtime_ns):
                put_file_atomic(fs, str(self.folder / name), join(root, name.as_posix()))
                self.sent[name] = (stat.st_size, stat.st_mtime_ns)

    def finish(self) -> None:
        """The last upload; the mirror is then no longer needed."""
        if self.remote:
            self.upload()
            shutil.rmtree(self.folder, ignore_errors=True)


RUN_FILES = ("checkpoints", "metrics.jsonl", "summary.json", "samples", "tensorboard")


def remove_run(output: str, storage_options: dict[str, Any]) -> None:
    """Delete the files a run wrote to `output` (run.overwrite); nothing else there."""
    fs, root = filesystem(output, storage_options)
    for name in RUN_FILES:
        remove_tree(fs, join(root, name))
    fs.invalidate_cache(root)


def check_output(output: str) -> None:
    """A local run.output that cannot be written fails on one line before training starts
    (not deep in the first listing or log write): the folder, or the nearest folder above it
    that exists (nothing is made here), must be a folder that takes a file."""
    if is_remote(output):
        return  # object storage: its own errors, on its first write
    _, path = filesystem(output, None)
    target = Path(path)
    existing = next((p for p in (target, *target.parents) if p.exists()), target)
    if not existing.is_dir():
        raise ConfigError(f"run.output: {output} is under a file ({existing}), not a folder")
    try:  # a probe file, removed at once: permissions, a read-only or pseudo filesystem
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".mmcurate-probe-"):
            pass
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise ConfigError(f"run.output: cannot write in {existing}: {why}") from None

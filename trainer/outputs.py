"""Where a run's files live: `run.output`, a local folder or an object-store URL.

A local folder is written in place. For a URL (s3://, gs://, ...) checkpoints go straight to
it (trainer/checkpoint.py), while the logs, which grow line by line and which object stores
cannot append to, are written to a local mirror per rank and uploaded whole with every
checkpoint and at the end. A resume downloads them first, so the logs continue where the
checkpoint left off, on any machine. Each rank owns its files: rank 0 `metrics.jsonl`,
`summary.json` and `tensorboard/`; rank r `samples/rank-<r>.jsonl`.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from pipeline.storage import filesystem, join, put_file_atomic, with_retries

MIRRORS = Path("~/.cache/mmcurate/runs")


def is_remote(output: str) -> bool:
    return "://" in output


def log_folder(output: str, rank: int) -> Path:
    """The folder this rank writes its logs to: `output` itself, or its local mirror."""
    if not is_remote(output):
        return Path(output)
    digest = hashlib.sha256(output.encode()).hexdigest()[:16]
    return MIRRORS.expanduser() / digest / f"rank-{rank}"


def owned(logs: Path, rank: int) -> list[Path]:
    """The log files of `rank` under `logs` (relative paths)."""
    if rank != 0:
        names = [Path("samples") / f"rank-{rank}.jsonl"]
    else:
        names = [Path("metrics.jsonl"), Path("summary.json"), Path("samples/rank-0.jsonl")]
        board = logs / "tensorboard"
        names += [p.relative_to(logs) for p in board.rglob("*") if p.is_file()]
    return [name for name in names if (logs / name).is_file()]


def start_logs(output: str, rank: int, resume: bool, storage_options: dict[str, Any]) -> Path:
    """This rank's log folder, ready for the run: for a URL, an emptied mirror, holding the
    stored logs when the run resumes."""
    logs = log_folder(output, rank)
    if is_remote(output):
        shutil.rmtree(logs, ignore_errors=True)
        if resume:
            download_logs(output, logs, rank, storage_options)
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def download_logs(output: str, logs: Path, rank: int, storage_options: dict[str, Any]) -> None:
    fs, root = filesystem(output, storage_options)
    names = ["metrics.jsonl"] if rank == 0 else []
    names.append(f"samples/rank-{rank}.jsonl")
    for name in names:
        if fs.isfile(join(root, name)):
            (logs / name).parent.mkdir(parents=True, exist_ok=True)
            with_retries(lambda name=name: fs.get_file(join(root, name), str(logs / name)))


def upload_logs(output: str, logs: Path, rank: int, storage_options: dict[str, Any]) -> None:
    """Upload this rank's logs to a URL output (each file whole: readers never see half)."""
    if not is_remote(output):
        return
    fs, root = filesystem(output, storage_options)
    for name in owned(logs, rank):
        put_file_atomic(fs, str(logs / name), join(root, name.as_posix()))

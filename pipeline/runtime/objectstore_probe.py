"""Readiness checks for `pipeline.runtime.objectstore.LocalS3`: enough free disk before SeaweedFS
starts, and one real write through S3 before anyone relies on it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# The volume server's own floor (its -minFreeSpace, which `weed mini` does not expose), plus a
# margin for what the server and its clients write after start.
MIN_FREE_FRACTION = 0.011
PROBE_BUCKET = "mmcurate-ready-probe"


def disk_too_full(folder: Path, fraction: float | None = None) -> str | None:
    """Why SeaweedFS could not take writes in `folder`, or None. Its volume server refuses
    to grow volumes with under 1% of the disk free, and S3 PUTs then hang, retrying."""
    fraction = MIN_FREE_FRACTION if fraction is None else fraction
    usage = shutil.disk_usage(folder)
    if usage.free >= fraction * usage.total:
        return None
    return (
        f"SeaweedFS needs {fraction:.1%} of the disk free and takes no writes below it: "
        f"{folder} has {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.0f} GiB"
    )


def probe_filesystem(storage_options: dict) -> Any:
    """s3fs for the readiness probe: one try per call (botocore's and s3fs's own retry loops
    both off) and short timeouts, since the probe loop retries until its deadline itself."""
    import fsspec

    config = {"connect_timeout": 2, "read_timeout": 5, "retries": {"total_max_attempts": 1}}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, config_kwargs=config, **storage_options)
    fs.retries = 1  # s3fs's loop around each call (5 by default); no constructor argument
    return fs


def write_and_remove_probe(fs: Any, timeout: float) -> None:
    """Create a bucket, write, read back and delete one object, then drop the bucket; each
    call given up after `timeout` seconds (fsspec's FSTimeoutError, a TimeoutError)."""
    try:
        fs.mkdir(PROBE_BUCKET, timeout=timeout)
    except FileExistsError:  # left by a start on the same data dir that stopped half-way
        pass
    fs.pipe(f"{PROBE_BUCKET}/ready", b"ready", timeout=timeout)
    if fs.cat(f"{PROBE_BUCKET}/ready", timeout=timeout) != b"ready":
        raise ValueError("the readiness probe read back other bytes than it wrote")
    fs.rm(f"{PROBE_BUCKET}/ready", timeout=timeout)
    fs.rmdir(PROBE_BUCKET, timeout=timeout)

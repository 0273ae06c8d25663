"""Shared helpers for source tests: rows of a batch, every sample of a URL list's plan, and a
fixed set of small inputs on fsspec's in-memory store whose plans pin the build identity
(memory:// paths are fixed and its listings carry no modification time, so the identity of
these inputs is the same on every machine and run)."""

from __future__ import annotations

import gzip
import io
import tarfile

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.pipeline.config import BuildConfig, SourceConfig
from mmcurate.pipeline.sources.staging import stage_sources
from mmcurate.pipeline.sources.urls import plan_urls, read_urls

PIN_ROOT = "memory://mmcurate-identity-pin"


def rows(batch: dict) -> list[dict]:
    return [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def read_all(cfg: SourceConfig, work=None) -> tuple[list[dict], list]:
    """Every sample of the plan's partitions (staged into `work` first, when given)."""
    parts = plan_urls(cfg, {})
    if work is not None:
        parts = stage_sources(parts, str(work), {})
    rows = []
    for part in parts:
        batch = read_urls(part, {})
        rows += [dict(zip(batch, v, strict=True)) for v in zip(*batch.values(), strict=True)]
    return rows, parts


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_pin_inputs() -> dict[str, dict]:
    """Write the pinned inputs (replacing any earlier copy); the source section of each."""
    fs = fsspec.filesystem("memory")
    root = PIN_ROOT.removeprefix("memory://")
    if fs.exists(root):
        fs.rm(root, recursive=True)
    for i in range(5):
        fs.pipe(f"{root}/images/img{i}.jpg", b"jpeg" * (i + 1))
        fs.pipe(f"{root}/images/img{i}.txt", f"caption {i}".encode())
    fs.pipe(f"{root}/images/img1.json", b'{"a": 1}')
    fs.pipe(f"{root}/images/img1.png", b"png")  # a stem shared with img1.jpg
    for t in range(2):
        members = [(f"s{t}{i}.jpg", b"img") for i in range(3)]
        fs.pipe(f"{root}/tars/shard-{t}.tar", tar_bytes(members + [(f"s{t}0.txt", b"cap")]))
    csv = "url,caption,extra\n" + "".join(
        f"http://127.0.0.1:9/{i}.jpg,c{i},{i}\n" for i in range(7)
    )
    fs.pipe(f"{root}/lists/urls.csv", csv.encode())
    fs.pipe(f"{root}/lists/urls.csv.gz", gzip.compress(csv.encode(), mtime=0))
    table = pa.table({"url": [f"http://127.0.0.1:9/{i}" for i in range(9)], "caption": ["c"] * 9})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=9)
    fs.pipe(f"{root}/lists/urls.parquet", buffer.getvalue())
    for i in range(3):
        fs.pipe(f"{root}/videos/clip{i}.mp4", b"mp4" * (i + 1))
        fs.pipe(f"{root}/videos/clip{i}.txt", f"video {i}".encode())
    fs.pipe(f"{root}/videos/clip0_0001.mp4", b"mp4")  # a name clip_split could make
    fs.pipe(f"{root}/vlist/list.csv", b"path,caption\nclip0.mp4,a\n/abs/clip1.mp4,b\n")
    return {
        "images": {"kind": "images", "path": f"{PIN_ROOT}/images", "files_per_task": 2},
        "webdataset": {"kind": "webdataset", "path": f"{PIN_ROOT}/tars/*.tar"},
        "urls": {"kind": "urls", "path": f"{PIN_ROOT}/lists/urls.csv", "files_per_task": 3},
        "urls_gz": {"kind": "urls", "path": f"{PIN_ROOT}/lists/urls.csv.gz", "files_per_task": 3},
        "urls_parquet": {
            "kind": "urls",
            "path": f"{PIN_ROOT}/lists/urls.parquet",
            "files_per_task": 2,
        },
        "videos": {"kind": "videos", "path": f"{PIN_ROOT}/videos", "files_per_task": 2},
        "video_glob": {"kind": "videos", "path": f"{PIN_ROOT}/videos/clip*.mp4"},
        "video_list": {"kind": "videos", "path": f"{PIN_ROOT}/vlist/list.csv"},
    }


def pin_config(source: dict) -> BuildConfig:
    return BuildConfig.model_validate(
        {"source": source, "output": {"path": f"{PIN_ROOT}/out", "shard_max_samples": 4}}
    )

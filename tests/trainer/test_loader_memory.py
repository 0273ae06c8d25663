"""The trainer's loader in bounded memory (issue 37): the epoch plan is drawn, not listed; a
worker reads past members training does not use (a video's mp4); the shuffle buffer holds at
most its byte cap in memory (the rest waits on disk) in the same order as before; a streamed
shard is hashed as it passes and still caught when damaged. Real shards, real S3, real models."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import tracemalloc
from pathlib import Path

import pytest
import torch
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.plan import Layout, WeightedManifest, epoch_pieces, worker_plan
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.models import build_model
from PIL import Image

from tests.kit_shards import write_uneven_shards

REPO = Path(__file__).resolve().parents[2]

MiB = 1 << 20


@pytest.fixture(scope="module")
def tiny_transform():
    cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
    _, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
    return ImageTransform(preprocess), tokenizer


def test_planning_a_50m_sample_span_allocates_under_10mib():
    sizes = (10_000,) * 5_000  # 50M samples, one worker of one rank
    tracemalloc.start()
    try:
        pieces = epoch_pieces([WeightedManifest(tuple(range(len(sizes))), sizes)], 3, 0)
        plan = worker_plan(pieces, 3, 0, Layout(), 32, 1000, consumed_batches=10)
        drawn = [p for _, p in zip(range(100_000), plan.emit, strict=False)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.batches == 50_000_000 // 32 - 10 and len(plan.emit) == plan.batches * 32
    assert len(set(drawn)) == len(drawn) and min(plan.emit[:1000]) >= 0
    assert peak < 10 * MiB, f"{peak / MiB:.1f} MiB"


def old_shuffled(first: int, count: int, buffer: int, seed: str) -> list[int]:
    """The emission as the loader listed it before issue 37 (the list it built)."""
    positions = range(first, first + count)
    if buffer <= 1:
        return list(positions)
    rng, held, out = random.Random(seed), [], []
    for position in positions:
        held.append(position)
        if len(held) >= buffer:
            j = rng.randrange(len(held))
            held[j], held[-1] = held[-1], held[j]
            out.append(held.pop())
    rng.shuffle(held)
    return out + held


def old_keys(sizes: tuple[int, ...], seed: int, batch: int, buffer: int, consumed: int) -> list:
    """Keys in the order the old loader gave them (one worker, one rank)."""
    pieces = epoch_pieces([WeightedManifest(tuple(range(len(sizes))), sizes)], seed, 0)
    keys = [f"k{sum(sizes[: p.shard]) + i:06d}" for p in pieces for i in range(p.start, p.stop)]
    count = sum(sizes) // batch * batch
    emit = old_shuffled(0, count, buffer, f"{seed}:0:0:0")[consumed * batch :]
    return [keys[position] for position in emit]


@pytest.mark.parametrize("limit,consumed", [(None, 0), (None, 3), (20_000, 0), (20_000, 3)])
def test_sample_order_is_the_old_one_under_and_over_the_byte_cap(
    tmp_path, tiny_transform, limit, consumed
):
    """Same keys in the same order as the old list-built loader, fresh and resumed, with the
    default cap (not reached) and a 20 kB one (most samples wait on disk)."""
    sizes = (30, 7, 50)
    manifest = read_manifest(str(write_uneven_shards(tmp_path, sizes)))
    dataset = ShardDataset(
        manifest, *tiny_transform, batch_size=8, seed=5, shuffle_buffer=40,
        shuffle_buffer_bytes=limit,
    )  # fmt: skip
    dataset.resume_at(0, consumed)
    before = spill_folders()  # a stage an earlier test called directly keeps one per process
    keys = [key for batch in make_loader(dataset, 0) for key in batch.keys]
    assert keys == old_keys(sizes, 5, 8, 40, consumed)
    assert spill_folders() == before  # the loader left none of its own


def spill_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob(f"mmcurate-spill-{os.getpid()}-*"))


def frame_jpeg(rng: random.Random, side: int = 96) -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3)).save(buf, "JPEG")
    return buf.getvalue()


def write_video_shard(path: Path, samples: int, mp4_bytes: list[int]) -> dict:
    """A video shard: per sample 4 real JPEG frames, json, txt and an mp4 member of the given
    size whose data is a hole in a sparse file (no disk)."""
    rng = random.Random(1)
    with open(path, "wb") as f:
        for index in range(samples):
            key = f"v{index:05d}"
            members = {f"{i:03d}.jpg": frame_jpeg(rng) for i in range(4)}
            members |= {"json": b"{}", "mp4": None, "txt": f"clip {index}".encode()}
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data) if data is not None else mp4_bytes[index]
                f.write(info.tobuf(tarfile.USTAR_FORMAT))
                if data is None:
                    f.seek(info.size + -info.size % 512, 1)  # a hole: read back as zeros
                else:
                    f.write(data + b"\0" * (-len(data) % 512))
        f.write(b"\0" * 1024)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            digest.update(chunk)
    return {"name": path.name, "samples": samples, "bytes": path.stat().st_size,
            "sha256": digest.hexdigest()}  # fmt: skip


MEASURE = """
import json, resource, sys, torch
from bench.memwatch import PeakMemory, tree_pss
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.models import build_model
cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
_, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
dataset = ShardDataset(read_manifest(sys.argv[1]), ImageTransform(preprocess), tokenizer,
                       batch_size=4, seed=1)
idle, idle_rss = tree_pss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with PeakMemory(interval=0.01) as peak:
    batches = list(make_loader(dataset, 0))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"batches": len(batches), "clip": list(batches[0].images.shape),
                  "pss_above_idle": peak.bytes - idle, "rss_peak_above_idle": rss - idle_rss}))
"""


def test_a_worker_over_video_shards_stays_under_128mib(tmp_path):
    """40 video samples (4 JPEG frames each) with 8 MiB mp4 members, one of 400 MiB: the
    worker reads past the mp4s (the old one held every one in its shuffle buffer: ~700 MiB)."""
    sizes = [8 * MiB] * 40
    sizes[17] = 400 * MiB
    entry = write_video_shard(tmp_path / "shard-000000.tar", 40, sizes)
    doc = {"format": "mmcurate/1", "samples": 40, "shards": [entry]}
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MEASURE), str(tmp_path / "manifest.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["batches"] == 10 and found["clip"][:2] == [4, 4]  # every sample, 4 frames
    assert found["pss_above_idle"] < 128 * MiB, found
    assert found["rss_peak_above_idle"] < 128 * MiB, found


def test_streamed_verification_catches_a_damaged_shard_and_reads_an_intact_one(
    s3, s3_bucket, tmp_path
):
    """Remote shards hashed as they stream: a flipped byte (its tar still parses) is found at
    the end, after two more downloads, and none of its samples comes; an intact shard's come
    whole and in order, through a 4 kB hold (spilled to disk) and without unused members."""
    manifest_path = write_uneven_shards(tmp_path, (20, 20))
    raw = (tmp_path / "shard-000000.tar").read_bytes()
    middle = len(raw) // 2
    (tmp_path / "shard-000000.tar").write_bytes(
        raw[:middle] + bytes([raw[middle] ^ 0x55]) + raw[middle + 1 :]
    )
    fs = s3.filesystem()
    for path in tmp_path.iterdir():
        fs.pipe(f"{s3_bucket}/b/{path.name}", path.read_bytes())
    shards = read_manifest(f"s3://{s3_bucket}/b/manifest.json", s3.storage_options).shards
    reader = ShardReader(shards, s3.storage_options, used=lambda ext: ext == "txt", hold_bytes=4096)
    assert list(reader.samples(0)) == []
    assert "sha256" in reader.corrupt[0] and "(downloaded 3 times)" in reader.corrupt[0]
    assert reader.take_skipped() == (0,)
    got = list(reader.samples(1, 5, 15))
    assert [s["__key__"] for s in got] == [f"k{i:06d}" for i in range(25, 35)]
    assert all(sorted(s) == ["__key__", "txt"] for s in got)
    assert not reader.take_skipped()
    assert manifest_path.exists()

"""Small eval sets for the `mmcurate eval` tests: hand-written shards with multi-caption
images, class folders of the demo photos, tiny open_clip weights, config files."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import torch
import yaml
from mmcurate.pipeline.demo_data import iter_samples
from mmcurate.trainer.eval.evaluate import main

PHOTOS = list(iter_samples(30, seed=5))


def add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_build(folder: Path, shards: list[list[dict]]) -> Path:
    """Shards of samples {key, image?: bytes, ext?, txt?, json?: dict} and a manifest.json."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for s, samples in enumerate(shards):
        path = folder / f"shard-{s:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for sample in samples:
                if "image" in sample:
                    add_member(tar, f"{sample['key']}.{sample.get('ext', 'jpg')}", sample["image"])
                if "txt" in sample:
                    add_member(tar, f"{sample['key']}.txt", sample["txt"].encode())
                if "json" in sample:
                    add_member(tar, f"{sample['key']}.json", json.dumps(sample["json"]).encode())
        raw = path.read_bytes()
        sha = hashlib.sha256(raw).hexdigest()
        entries.append(
            {"name": path.name, "samples": len(samples), "bytes": len(raw), "sha256": sha}
        )
    total = sum(len(s) for s in shards)
    manifest = {"format": "mmcurate/1", "samples": total, "shards": entries, "config": {}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "manifest.json"


def photo(i: int) -> bytes:
    return PHOTOS[i].data


def flickr_like(folder: Path) -> Path:
    """Shard 0: images 0-2 with 5 captions each as json lists; image 3 as two samples sharing
    an image_id whose first copy is corrupt (the second carries it); a sample without any
    caption; one without an image. Shard 1: COCO style, one caption per sample, 3 samples per
    image_id, plus image_id "a" again (a second copy, in another shard)."""
    five = [
        {"key": f"f{i}", "image": photo(i), "json": {"captions": [f"{i} {c}" for c in "abcde"]}}
        for i in range(3)
    ]
    shard0 = [
        *five,
        {"key": "s3a", "image": b"not a jpeg", "txt": "three a", "json": {"image_id": "a"}},
        {"key": "s3b", "image": photo(3), "txt": "three b", "json": {"image_id": "a"}},
        {"key": "nocap", "image": photo(4), "json": {"captions": []}},
        {"key": "noimg", "txt": "nothing to see"},
    ]
    shard1 = [
        {"key": f"c{i}{j}", "image": photo(5 + i), "txt": f"coco {i} {j}", "json": {"image_id": i}}
        for i in range(3)
        for j in range(3)
    ]
    shard1.append({"key": "again", "image": photo(3), "txt": "three c", "json": {"image_id": "a"}})
    return write_build(folder, [shard0, shard1])


def tiny_weights(folder: Path, seed: int = 0) -> Path:
    """A plain open_clip file (`state_dict` key) of a randomly initialised mmcurate-tiny."""
    import open_clip

    torch.manual_seed(seed)
    model = open_clip.create_model("mmcurate-tiny")
    path = folder / f"tiny-{seed}.pt"
    torch.save({"state_dict": model.state_dict()}, path)
    return path


def eval_config(folder: Path, **sections) -> Path:
    body = {"model": {"name": "mmcurate-tiny"}, "data": {"batch_size": 8, "workers": 0}, **sections}
    path = folder / "eval.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def run_main(args: list[str], capsys) -> tuple[int, str, str]:
    code = main([*args, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def class_folder(folder: Path) -> dict[str, int]:
    """Class folders named by the demo photo subjects; returns images per class."""
    counts: dict[str, int] = {}
    for sample in PHOTOS:
        target = (
            folder / sample.source / "deeper"
            if sample.source == "coins"
            else folder / sample.source
        )
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{sample.key}.{sample.ext}").write_bytes(sample.data)
        (target / f"{sample.key}.txt").write_text("sidecar captions are not samples")
        counts[sample.source] = counts.get(sample.source, 0) + 1
    return counts


def rewrite_with_cls(shard: Path, key: str, value: bytes) -> None:
    """Insert a `<key>.cls` member right after the key's other members and fix the manifest."""
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for name, data in members:
            add_member(tar, name, data)
            if name.startswith(f"{key}."):
                add_member(tar, f"{key}.cls", value)
    manifest_path = shard.parent / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    raw = shard.read_bytes()
    manifest["shards"][0].update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    manifest_path.write_text(json.dumps(manifest))

"""A video-generation build (clip_split, motion_score, text_area, video_frames over small real
videos, one file per partition): a driver killed with SIGKILL mid-build, then run again,
commits the same manifest as a build that was never interrupted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from PIL import Image

from tests.kit_builds import kill_build_after
from tests.kit_motion import encode, path_frames
from tests.kit_text_area import with_text

SHOTS = [
    ("pan_right", 2, "astronaut"),
    ("zoom_in", 3, "coffee"),
    ("tilt_down", 2, "chelsea"),
    ("static", 0, "astronaut"),
    ("pan_left", 4, "coffee"),
    ("shake", 3, "chelsea"),
]


def captioned(frames: list, seed: int) -> list:
    """Every frame with the same two lines of text burnt in (a subtitle-like overlay)."""
    out = []
    for pixels in frames:
        image, _ = with_text(Image.fromarray(pixels), 12, 2, seed)
        out.append(np.asarray(image))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Six videos; each a hard cut between two shots of different photos, half with text."""
    root = tmp_path_factory.mktemp("videogen")
    for i, (kind, speed, name) in enumerate(SHOTS):
        other = SHOTS[(i + 1) % len(SHOTS)]
        frames = path_frames(kind, speed, name, seed=i)
        frames += path_frames(other[0], other[1], other[2], seed=i + 10)
        if i % 2:
            frames = captioned(frames, i)
        (root / f"v{i}.mp4").write_bytes(encode(frames, bf="2"))
        (root / f"v{i}.txt").write_text(f"video number {i}")
    return root


def spec(folder: Path, out: Path) -> dict:
    return {
        "source": {"kind": "videos", "path": str(folder), "files_per_task": 1},
        "stages": [
            {"name": "clip_split", "mode": "scenes", "analysis_fps": 25, "min_clip_s": 0.5},
            {"name": "motion_score"},
            {"name": "text_area", "num_frames": 2},
            {"name": "video_frames", "num_frames": 2, "size": 96},
        ],
        "output": {"path": str(out), "shard_max_samples": 4},
    }


def shard_jsons(out: Path) -> dict[str, dict]:
    """Every sample's json, by key, read from the committed shards."""
    from mmcurate.core.tario import iter_tar_samples

    found = {}
    for shard in json.loads((out / "manifest.json").read_text())["shards"]:
        with open(out / shard["name"], "rb") as f:
            for sample in iter_tar_samples(f):
                found[sample["__key__"]] = json.loads(sample["json"])
    return found


@pytest.mark.slow
def test_killed_driver_reruns_to_the_same_manifest(ray_session, folder, tmp_path):
    clean = run_build(BuildConfig.model_validate(spec(folder, tmp_path / "clean")), False)
    assert clean["samples"] >= 2 * len(SHOTS)  # every video was cut into its two shots
    out = tmp_path / "out"
    kill_build_after(spec(folder, out), out, partitions=2)

    resumed = run_build(BuildConfig.model_validate(spec(folder, out)), False)
    assert resumed["shards"] == clean["shards"]  # same samples, bytes and digests
    metas = shard_jsons(out)
    assert metas == shard_jsons(tmp_path / "clean")
    assert all({"motion_score", "camera_motion", "text_area"} <= set(m) for m in metas.values())

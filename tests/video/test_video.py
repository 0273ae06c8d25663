"""Videos: frame plans, the isolated decoder, and a 34-file folder built end to end."""

import io
import json
import math
import os
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import webdataset as wds
from mmcurate.core.tar_writer import write_tar
from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.video_data import (
    audio_only,
    encode_video,
    lying_avi,
    read_frame_number,
    truncated,
)
from mmcurate.stages.lib.isolation import CallCrashed, CallFailed, CallTimeout, Isolated
from mmcurate.stages.lib.video_decode import plan_indices, sample_video, to_jpeg
from mmcurate.stages.registry import build_stage
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.models import build_model
from mmcurate.trainer.train import train
from PIL import Image

OPTS = {"mode": "uniform", "num_frames": 8, "fps": 1.0, "size": 224, "crop": True, "quality": 90}


def test_uniform_plan_takes_the_middle_of_equal_spans():
    assert plan_indices("uniform", 48, 24.0, 8, 1.0, []) == [3, 9, 15, 21, 27, 33, 39, 45]
    assert plan_indices("uniform", 5, 24.0, 8, 1.0, []) == [0, 1, 2, 3, 4]  # fewer frames
    assert plan_indices("uniform", 0, 24.0, 8, 1.0, []) == []
    for count in range(1, 200):
        plan = plan_indices("uniform", count, 30.0, 8, 1.0, [])
        assert plan == sorted(set(plan)) and 0 <= plan[0] and plan[-1] < count


def test_long_fps_plans_are_thinned_to_999_frames():
    plan = plan_indices("fps", 72_000, 30.0, 8, 1.0, [])  # 40 minutes at one frame a second
    assert len(plan) == 999 and plan == sorted(set(plan)) and plan[-1] < 72_000


def test_fps_and_keyframe_plans():
    assert plan_indices("fps", 72, 24.0, 8, 1.0, []) == [0, 24, 48]  # 3 s at 1 frame a second
    assert plan_indices("fps", 72, 24.0, 8, 4.0, [])[:3] == [0, 6, 12]
    assert plan_indices("keyframes", 100, 25.0, 0, 1.0, [0, 50, 99]) == [0, 50, 99]
    assert plan_indices("keyframes", 100, 25.0, 2, 1.0, [0, 25, 50, 75]) == [25, 75]


def test_isolated_calls_survive_hangs_crashes_and_errors():
    worker = Isolated()
    worker.start()
    hung = worker.process
    with pytest.raises(CallTimeout):
        worker.call(time.sleep, (30,), timeout=0.5)
    assert hung.poll() is not None and worker.process is None  # the hung child was killed
    assert worker.call(math.sqrt, (16.0,), timeout=30) == 4.0  # a fresh child took over
    with pytest.raises(CallCrashed):
        worker.call(os.abort, (), timeout=30)
    with pytest.raises(CallFailed, match="ValueError"):
        worker.call(int, ("not a number",), timeout=30)
    worker.stop()


def frames_of(sample: dict) -> list[np.ndarray]:
    names = sorted(c for c in sample if c.endswith(".jpg") and c[:3].isdigit())
    return [np.asarray(Image.open(io.BytesIO(sample[n])).convert("RGB")) for n in names]


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory):
    """34 files: 14 H.264/mp4, 8 MPEG-4/avi, 6 VP9/webm, one AVI that claims 5,000 frames, and
    a truncated mp4, a zero-byte mp4, an audio-only mp4, garbage named .mp4, one without a
    caption. Returns (folder, {name: (frames, fps)} of the good ones)."""
    folder = tmp_path_factory.mktemp("videos")
    truth = {}
    specs = [("mp4", "libx264", 14), ("avi", "mpeg4", 8), ("webm", "libvpx-vp9", 6)]
    rng = np.random.default_rng(0)
    for ext, codec, count in specs:
        for i in range(count):
            frames, fps = int(rng.integers(20, 70)), int(rng.choice([12, 24, 30]))
            name = f"{ext}_{i:02d}"
            (folder / f"{name}.{ext}").write_bytes(
                encode_video(frames, fps, (256, 144), codec, "matroska" if ext == "mkv" else ext)
            )
            (folder / f"{name}.txt").write_text(f"a moving gradient number {i}")
            truth[name] = (frames, fps)
    bad = {
        "bad_lying": lying_avi(48),
        "bad_truncated": truncated(encode_video(60)),
        "bad_zero": b"",
        "bad_audio": audio_only(),
        "bad_garbage": os.urandom(4096),
    }
    for name, data in bad.items():
        ext = "avi" if name == "bad_lying" else "mp4"
        (folder / f"{name}.{ext}").write_bytes(data)
        (folder / f"{name}.txt").write_text("a broken video")
    truth["bad_lying"] = (48, 24)
    (folder / "no_caption.mp4").write_bytes(encode_video(24))
    truth["no_caption"] = (24, 24)
    return folder, truth


@pytest.fixture(scope="module")
def video_build(video_folder, tmp_path_factory, ray_session):
    folder, truth = video_folder
    out = tmp_path_factory.mktemp("video-out")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "videos", "path": str(folder), "files_per_task": 5},
            "stages": [
                {
                    "name": "video_frames",
                    "num_frames": 8,
                    "size": 512,
                    "crop": False,
                    "timeout_s": 60,
                }
            ],
            "output": {"path": str(out), "shard_max_samples": 10},
        }
    )
    return run_build(cfg, progress=False), out, truth


def test_video_folder_builds_with_bad_files_dropped(video_build):
    manifest, out, truth = video_build
    rows = {r["key"]: r for r in pq.read_table(out / "signatures").to_pylist()}
    assert len(rows) == 34
    dropped = {k: r["drop_reason"] for k, r in rows.items() if r["drop_reason"]}
    assert dropped == {
        "bad_truncated": "decode_error",
        "bad_zero": "decode_error",
        "bad_audio": "no_video_stream",
        "bad_garbage": "decode_error",
    }
    assert manifest["samples"] == 30  # including the lying AVI and the caption-less video


def test_sampled_frames_and_timestamps_are_the_planned_ones(video_build):
    manifest, out, truth = video_build
    seen = 0
    for shard in manifest["shards"]:
        with open(out / shard["name"], "rb") as f:
            for sample in iter_tar_samples(f):
                frames, fps = truth[sample["__key__"]]
                meta = json.loads(sample["json"])
                expected = plan_indices("uniform", frames, float(fps), 8, 1.0, [])
                assert meta["frame_indices"] == expected
                assert meta["frame_count"] == frames and meta["fps"] == pytest.approx(fps)
                assert [read_frame_number(f) for f in frames_of(sample)] == expected
                assert meta["frame_timestamps"] == pytest.approx(
                    [i / fps for i in expected], abs=2e-3
                )
                assert meta["clip_end"] == pytest.approx(frames / fps, abs=1e-3)
                assert any(ext in sample for ext in ("mp4", "avi", "webm"))  # video kept
                seen += 1
    assert seen == 30


def test_video_shards_load_in_webdataset_and_the_trainer(video_build, tmp_path):
    manifest, out, _ = video_build
    urls = [str(out / s["name"]) for s in manifest["shards"]]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert len(samples) == 30 and all("007.jpg" in s for s in samples)
    model, preprocess, tokenizer = build_model(
        TrainConfig.model_validate(
            {"data": {"manifest": "x"}, "run": {"output": str(tmp_path)}}
        ).model,
        torch.device("cpu"),
    )
    manifest = read_manifest(str(out / "manifest.json"))
    dataset = ShardDataset(manifest, ImageTransform(preprocess), tokenizer, batch_size=5)
    batches = list(dataset)
    assert len(batches) == 6 and batches[0].images.shape == (5, 8, 3, 64, 64)
    # the caption-less video is replaced by another of its batch: batches stay full
    assert dataset.counters.substituted == 1 and dataset.counters.samples == 30
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": str(out / "manifest.json"), "batch_size": 4, "workers": 0},
            "run": {"output": str(tmp_path / "run"), "max_steps": 3, "log_every": 1},
        }
    )
    summary = train(cfg)
    assert summary["steps"] == 3 and math.isfinite(summary["last_loss"])


def test_a_decode_past_its_time_limit_is_dropped_and_the_next_one_works():
    video = encode_video(48)
    batch = {"__key__": ["a", "b"], "__drop__": [None, None], "__drop_stage__": [None, None]}
    batch["mp4"], batch["txt"], batch["json"] = [video, video], ["x", "y"], [None, None]
    slow = build_stage({"name": "video_frames", "timeout_s": 0.001})
    assert slow({k: list(v) for k, v in batch.items()})["__drop__"] == [
        "decode_timeout",
        "decode_timeout",
    ]
    normal = build_stage({"name": "video_frames"})
    out = normal({k: list(v) for k, v in batch.items()})
    assert out["__drop__"] == [None, None] and out["007.jpg"][1] is not None


def test_clip_score_and_near_dedupe_on_video_frames():
    video = encode_video(48)
    batch = {"__key__": ["a", "b"], "__drop__": [None, None], "__drop_stage__": [None, None]}
    batch["mp4"], batch["txt"], batch["json"] = (
        [video, encode_video(30)],
        ["x y", "x y"],
        [None] * 2,
    )
    frames = build_stage({"name": "video_frames", "num_frames": 4})(batch)
    frames["mp4"] = [None, None]  # frames only: scores and hashes must come from them
    tiny = {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}
    scored = build_stage({**tiny, "batch_size": 3})(frames)  # a video spans two model batches
    assert scored["__drop__"] == [None, None]
    assert all(-1 <= s <= 1 for s in scored["clip_score"])
    stage = build_stage({"name": "clip_score", **{k: v for k, v in tiny.items() if k != "name"}})
    first = stage.local_model()
    pixels, _ = first.prepare([frames[f"{i:03d}.jpg"][0] for i in range(4)])
    image, _ = first.encode(np.stack(pixels))
    mean = image.mean(axis=0) / np.linalg.norm(image.mean(axis=0))
    assert np.allclose(scored["embedding"][0].astype(np.float32), mean, atol=2e-3)
    hashed = build_stage({"name": "near_dedupe"})(frames)
    assert hashed["__drop__"] == [None, None] and hashed["phash"][0] is not None


def test_clip_split_by_scenes_then_frames_per_clip(ray_session, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for name, data in {
        "scenes_a": encode_video(84, 24, cuts=(24, 60)),
        "scenes_b": encode_video(84, 24, cuts=(24, 60), codec="libvpx-vp9", container="webm"),
        "plain": encode_video(48, 24),
        "audio": audio_only(),
    }.items():
        ext = "webm" if name == "scenes_b" else "mp4"
        (folder / f"{name}.{ext}").write_bytes(data)
        (folder / f"{name}.txt").write_text(f"the {name} video")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "videos", "path": str(folder), "files_per_task": 2},
            "stages": [
                {"name": "clip_split", "mode": "scenes", "analysis_fps": 24, "min_clip_s": 0.4},
                {"name": "video_frames", "num_frames": 4, "size": 512, "crop": False},
            ],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 7  # 3 + 3 scenes, and the plain video whole
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    split = stats["stages"][1]
    assert split == {**split, "in": 4, "out": 7, "dropped": {"no_video_stream": 1}}
    assert stats["samples_in"] == 4 and stats["samples_out"] == 7
    expected_bounds = {0: (0.0, 1.0), 1: (1.0, 2.5), 2: (2.5, 3.5)}
    seen = set()
    for shard in manifest["shards"]:
        with open(tmp_path / "out" / shard["name"], "rb") as f:
            for sample in iter_tar_samples(f):
                meta = json.loads(sample["json"])
                key = sample["__key__"]
                seen.add(key)
                if key.startswith("scenes"):
                    start, end = expected_bounds[int(key[-4:])]
                    assert (meta["clip_start"], meta["clip_end"]) == (start, end)
                    numbers = [read_frame_number(f) for f in frames_of(sample)]
                    assert all(start * 24 <= n < end * 24 for n in numbers), (key, numbers)
                    times = [n / 24 for n in numbers]
                    assert meta["frame_timestamps"] == pytest.approx(times, abs=2e-3)
                else:
                    assert (meta["clip_start"], meta["clip_end"]) == (0.0, 2.0)
                    assert sample["mp4"] == (folder / "plain.mp4").read_bytes()  # not re-encoded
    assert seen == {f"scenes_{s}_{i:04d}" for s in "ab" for i in range(3)} | {"plain_0000"}
    parents = pq.read_table(tmp_path / "out" / "signatures")["parent"].to_pylist()
    assert sorted(p for p in parents if p) == ["plain", *["scenes_a"] * 3, *["scenes_b"] * 3]


def video_config(path, out, storage_options=None, kind="videos"):
    return BuildConfig.model_validate(
        {
            "source": {"kind": kind, "path": path, "files_per_task": 2},
            "stages": [{"name": "video_frames", "num_frames": 2, "size": 512, "crop": False}],
            "output": {"path": str(out)},
            "storage_options": storage_options or {},
        }
    )


def test_videos_from_a_glob_a_list_on_s3_and_tar_shards(ray_session, s3, s3_bucket, tmp_path):
    root = tmp_path / "v"
    for sub, name, ext in (("a", "x", "mp4"), ("b", "y", "webm"), ("b", "z", "mp4")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        codec = "libvpx-vp9" if ext == "webm" else "libx264"
        (root / sub / f"{name}.{ext}").write_bytes(encode_video(24, 24, codec=codec, container=ext))
        (root / sub / f"{name}.txt").write_text(f"video {name}")
    globbed = run_build(video_config(f"{root}/*/*.mp4", tmp_path / "g"), progress=False)
    assert globbed["samples"] == 2  # x.mp4 and z.mp4, not the webm
    fs = s3.filesystem()
    for path in root.glob("*/*.*"):
        fs.put_file(str(path), f"{s3_bucket}/videos/{path.parent.name}/{path.name}")
    listing = tmp_path / "list.csv"
    listing.write_text("path,caption\na/x.mp4,first\nb/y.webm,second\nb/missing.mp4,third\n")
    fs.put_file(str(listing), f"{s3_bucket}/videos/list.csv")
    listed = run_build(
        video_config(f"s3://{s3_bucket}/videos/list.csv", tmp_path / "l", s3.storage_options),
        progress=False,
    )
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "l" / "signatures").to_pylist()}
    assert listed["samples"] == 2 and rows["000000002"]["drop_reason"] == "read_error"
    shard = tmp_path / "shards" / "videos-000000.tar"
    shard.parent.mkdir()
    with open(shard, "wb") as f:
        write_tar([{"__key__": "clip1", "mp4": encode_video(24), "txt": "from a tar"}], f)
    from_tar = run_build(
        video_config(str(shard), tmp_path / "t", kind="webdataset"), progress=False
    )
    assert from_tar["samples"] == 1
    with open(tmp_path / "t" / from_tar["shards"][0]["name"], "rb") as f:
        sample = next(iter_tar_samples(f))
    assert [read_frame_number(x) for x in frames_of(sample)] == [6, 18]


def test_clip_split_of_an_odd_sized_video_crops_to_even_sides():
    from mmcurate.stages.lib.video_split import split_video

    video = encode_video(48, 24, size=(251, 143), pixel_format="yuv444p", cuts=(24,))
    opts = {"mode": "scenes", "window_s": 1.0, "stride_s": None, "analysis_fps": 24,
            "threshold": 30, "min_clip_s": 0.0, "max_clips": None}  # fmt: skip
    clips = split_video(video, opts)
    assert [(c["start"], c["end"]) for c in clips] == [(0.0, 1.0), (1.0, 2.0)]
    for clip in clips:
        result = sample_video(clip["data"], dict(OPTS, size=512, crop=False))
        assert (result["width"], result["height"]) == (250, 142)


def test_samples_without_media_or_clips_get_named_reasons():
    image_only = {"__key__": ["i"], "__drop__": [None], "__drop_stage__": [None]}
    image_only.update({"jpg": [b"not a video"], "txt": ["x"], "json": [None], "__index__": [0]})
    frames = build_stage({"name": "video_frames"})({k: list(v) for k, v in image_only.items()})
    assert frames["__drop__"] == ["no_video"]
    split = build_stage({"name": "clip_split"})({k: list(v) for k, v in image_only.items()})
    assert split["__drop__"] == ["no_video"] and split["__drop_stage__"] == ["clip_split"]
    short = {k: list(v) for k, v in image_only.items()} | {"jpg": [None], "mp4": [encode_video(24)]}
    split = build_stage({"name": "clip_split", "mode": "fixed", "min_clip_s": 5.0})(short)
    assert split["__drop__"] == ["no_clips"] and split["mp4"] == [None]  # 1 s < 5 s
    video_only = {k: list(v) for k, v in short.items()} | {"__drop__": [None]}
    for stage in ("exact_dedupe", "near_dedupe"):
        out = build_stage({"name": stage})({k: list(v) for k, v in video_only.items()})
        assert out["__drop__"] == ["no_image"]


def test_frames_are_cropped_to_the_centre_and_shrunk_by_area_never_enlarged():
    """A frame with a bright centre square: cropped and resized it stays bright; the sizes
    follow the short side; a small frame keeps its size."""
    frame = np.zeros((360, 640, 3), np.uint8)
    frame[:, 140:500] = 200  # the centre square of a 640x360 frame
    square = Image.open(io.BytesIO(to_jpeg(frame, 224, True, 95)))
    assert square.size == (224, 224)
    pixels = np.asarray(square, dtype=np.float64)
    assert pixels.mean() > 190 and pixels[:, :4].mean() > 150 and pixels[:, -4:].mean() > 150
    assert Image.open(io.BytesIO(to_jpeg(frame, 224, False, 95))).size == (398, 224)
    small = np.full((90, 120, 3), 50, np.uint8)
    assert Image.open(io.BytesIO(to_jpeg(small, 224, False, 95))).size == (120, 90)
    assert Image.open(io.BytesIO(to_jpeg(small, 224, True, 95))).size == (90, 90)
    odd = np.full((143, 251, 3), 80, np.uint8)
    assert Image.open(io.BytesIO(to_jpeg(odd, 64, True, 95))).size == (64, 64)

"""mmcurate.video_loader: random temporal windows of a real video build, one bucket a batch,
the same windows for the same seed, exact mid-epoch resume, equal steps on every rank."""

import io
import json
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.video_data import encode_video
from mmcurate.trainer.data.bucket_plan import NO_BUCKET
from mmcurate.trainer.data.video_windows import ClipInfo, index_clips, window_start

import mmcurate

T = 8  # the window
SHORT = "short"  # a 6-frame clip: fewer than T, left out


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """A video build: 8 clips of 12-26 frames, half 64x48 and half 48x64, and one short one,
    in shards of 3 samples; returns (manifest url, {key: clip bytes})."""
    root = tmp_path_factory.mktemp("video_loader")
    source = root / "in"
    source.mkdir()
    for i in range(8):
        size = (64, 48) if i % 2 else (48, 64)
        (source / f"clip{i}.mp4").write_bytes(encode_video(12 + 2 * i, 24, size=size))
        (source / f"clip{i}.txt").write_text(f"caption {i}")
    (source / f"{SHORT}.mp4").write_bytes(encode_video(6, 24, size=(64, 48)))
    (source / f"{SHORT}.txt").write_text("too short")
    config = {
        "source": {"kind": "videos", "path": str(source), "files_per_task": 3},
        "stages": [],
        "output": {"path": str(root / "out"), "shard_max_samples": 3},
    }
    result = mmcurate.build(config)
    clips = {}
    for shard in json.loads(Path(result["manifest"]).read_text())["shards"]:
        with open(root / "out" / shard["name"], "rb") as f:
            clips.update({s["__key__"]: s["mp4"] for s in iter_tar_samples(f)})
    assert len(clips) == 9 and result["shards"] >= 3
    return result["manifest"], clips


def epoch_of(loader) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """(keys, window starts) of every batch of one iteration."""
    return [(tuple(b["__key__"]), tuple(b["frame_start"])) for b in loader]


def pyav_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as box:
        return [frame.to_ndarray(format="rgb24") for frame in box.decode(video=0)]


def test_windows_and_clip_index_are_pure_functions():
    starts = {window_start(0, e, "clip", 30, T) for e in range(20)}
    assert starts <= set(range(30 - T + 1)) and len(starts) > 5  # redrawn per epoch
    assert window_start(3, 1, "clip", 30, T) == window_start(3, 1, "clip", 30, T)
    assert window_start(0, 0, "clip", T, T) == 0  # exactly T frames: one window
    with pytest.raises(ValueError):
        window_start(0, 0, "clip", T - 1, T)
    shards = [
        [ClipInfo("64x48", 20), ClipInfo(None, reason="no_video"), ClipInfo("48x64", 5)],
        [ClipInfo("48x64", 9), ClipInfo(None, reason="unreadable")],
    ]
    index = index_clips(shards)
    assert index.names == ("48x64", "64x48")
    assert [list(labels) for labels in index.labels(T)] == [
        [1, NO_BUCKET, NO_BUCKET],
        [0, NO_BUCKET],
    ]
    assert index.dropped(T) == {"no_video": 1, "unreadable": 1, "too_short": 1}


def test_batches_are_one_bucket_and_hold_the_frames_pyav_decodes(build):
    manifest, clips = build
    loader = mmcurate.video_loader(manifest, 2, T, workers=0)
    assert loader.buckets == ("48x64", "64x48") and loader.dropped == {"too_short": 1}
    seen = []
    batches = list(loader)
    assert len(batches) == len(loader)
    for batch in batches:
        width, height = map(int, batch["bucket"].split("x"))
        video = batch["video"]
        assert video.dtype.is_floating_point is False and video.dtype.itemsize == 1
        assert tuple(video.shape) == (len(batch["__key__"]), T, 3, height, width)
        assert batch["txt"] == [f"caption {key[4:]}" for key in batch["__key__"]]
        windows = zip(batch["__key__"], batch["frame_start"], strict=True)
        for place, (key, start) in enumerate(windows):
            truth = np.stack(pyav_frames(clips[key])[start : start + T])
            got = video[place].permute(0, 2, 3, 1).numpy()
            assert got.shape == truth.shape
            assert np.abs(got.astype(int) - truth).max() <= 2, key  # same frames, same pixels
            seen.append(key)
    assert sorted(seen) == sorted(k for k in clips if k != SHORT)  # each clip once an epoch


def test_the_same_seed_draws_the_same_windows_and_each_epoch_others(build):
    manifest, _ = build
    first = mmcurate.video_loader(manifest, 2, T, seed=5, workers=0)
    again = mmcurate.video_loader(manifest, 2, T, seed=5, workers=0)
    assert epoch_of(first) == epoch_of(again)
    epochs = []
    for epoch in (0, 1):
        first.set_epoch(epoch)
        epochs.append(epoch_of(first))
    windows = [
        {k: s for keys, starts in e for k, s in zip(keys, starts, strict=True)} for e in epochs
    ]
    assert windows[0].keys() == windows[1].keys() and windows[0] != windows[1]
    other = mmcurate.video_loader(manifest, 2, T, seed=6, workers=0)
    assert epoch_of(other) != epochs[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_mid_epoch_continues_exactly(build, workers):
    manifest, _ = build
    whole = mmcurate.video_loader(manifest, 2, T, seed=1, workers=workers)
    whole.set_epoch(3)
    uninterrupted = epoch_of(whole)
    stopped = mmcurate.video_loader(manifest, 2, T, seed=1, workers=workers)
    stopped.set_epoch(3)
    head = []
    for batch in stopped:
        head.append((tuple(batch["__key__"]), tuple(batch["frame_start"])))
        if len(head) == 2:
            break
    state = stopped.state_dict()
    assert state["epoch"] == 3 and state["consumed"] == 2
    resumed = mmcurate.video_loader(manifest, 2, T, seed=1, workers=workers)
    resumed.load_state_dict(state)
    assert head + epoch_of(resumed) == uninterrupted
    with pytest.raises(ValueError, match="frames"):
        mmcurate.video_loader(manifest, 2, T - 1, seed=1, workers=0).load_state_dict(state)


def test_two_ranks_get_equal_steps_and_disjoint_clips(build):
    manifest, clips = build
    ranks = [mmcurate.video_loader(manifest, 3, T, rank=r, world=2, workers=0) for r in (0, 1)]
    runs = [epoch_of(loader) for loader in ranks]
    assert len(ranks[0]) == len(ranks[1]) == len(runs[0]) == len(runs[1]) > 0
    keys = [[k for keys, _ in run for k in keys] for run in runs]
    assert not set(keys[0]) & set(keys[1])
    assert sorted(keys[0] + keys[1]) == sorted(k for k in clips if k != SHORT)


# --- progressive resolution: a schedule of (step, size, frames) ---

SCHEDULE = [{"step": 0, "size": "32x24", "frames": 4}, {"step": 3, "frames": T}]


def schedule_run(manifest, stop=None, state=None, workers=0):
    """(step, bucket, shape, keys, starts) of every batch over epochs 0-1 with SCHEDULE; stops
    after `stop` batches (returning the state too) or starts from `state`."""
    loader = mmcurate.video_loader(manifest, 2, T, seed=2, workers=workers, schedule=SCHEDULE)
    if state is not None:
        loader.load_state_dict(state)
    seen = []
    for epoch in range(loader.epoch, 2):
        if epoch != loader.epoch:
            loader.set_epoch(epoch)
        for batch in loader:
            seen.append(
                (loader.step - 1, batch["bucket"], tuple(batch["video"].shape))
                + (tuple(batch["__key__"]), tuple(batch["frame_start"]))
            )
            if stop is not None and len(seen) == stop:
                return seen, loader.state_dict()
    return seen, None


def test_schedule_phases_sizes_and_windows_are_pure_functions():
    from mmcurate.trainer.data.video_windows import (
        Phase,
        epoch_window,
        parse_schedule,
        phase_at,
        scaled_size,
    )

    phases = parse_schedule(
        [{"step": 0, "size": "256x144", "frames": 8}, {"step": 100, "size": "360p", "frames": 16}],
        4,
    )
    assert phases == (Phase(0, 8, 256 * 144, "256x144"), Phase(100, 16, 640 * 360, "360p"))
    assert parse_schedule(None, 4) == (Phase(0, 4),)
    assert parse_schedule([{"step": 5, "frames": 2}], 4)[0] == Phase(0, 4)  # frames until 5
    assert [phase_at(phases, s).frames for s in (0, 99, 100, 10**6)] == [8, 8, 16, 16]
    # each bucket keeps its shape at the phase's area, never upscaled
    assert scaled_size(640, 360, 256 * 144) == (256, 144)
    assert scaled_size(480, 480, 256 * 144) == (192, 192)
    assert scaled_size(360, 640, 256 * 144) == (144, 256)
    assert scaled_size(256, 144, 640 * 360) == (256, 144)
    assert scaled_size(640, 360, None) == (640, 360)
    # an epoch reaching the switch is planned with the larger window
    assert epoch_window(phases, 0, 100) == 8 and epoch_window(phases, 50, 51) == 16
    for bad in (
        [{"step": 4}, {"step": 2}],
        [{"step": 0, "frames": 0}],
        [{"step": 0, "size": "big"}],
        [{"step": 0, "fps": 3}],
    ):
        with pytest.raises(ValueError):
            parse_schedule(bad, 4)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_schedule_switches_size_and_frames_at_its_step(build, workers):
    manifest, clips = build
    run, _ = schedule_run(manifest, workers=workers)
    assert [step for step, *_ in run] == list(range(len(run))) and len(run) > 4
    for step, bucket, shape, keys, starts in run:
        width, height = map(int, bucket.split("x"))
        if step < 3:  # 32x24 pixels: each bucket at that area, its own shape
            size = (24, 32) if (width, height) == (64, 48) else (32, 24)
            assert shape == (len(keys), 4, 3, *size)
        else:
            assert shape == (len(keys), T, 3, height, width)
        for key, start in zip(keys, starts, strict=True):
            assert 0 <= start <= len(pyav_frames(clips[key])) - shape[1]


@pytest.mark.parametrize(("stop", "workers"), [(3, 0), (2, 2), (5, 2)])
def test_a_resume_across_the_switch_continues_exactly(build, stop, workers):
    """Killed before the switch (step 2), at it (3) or after it and an epoch (5): the rest of
    the run, keys, windows and shapes, is the uninterrupted run's."""
    manifest, _ = build
    whole, _ = schedule_run(manifest, workers=workers)
    head, state = schedule_run(manifest, stop=stop, workers=workers)
    assert state["step"] == stop
    rest, _ = schedule_run(manifest, state=state, workers=workers)
    assert head + rest == whole
    with pytest.raises(ValueError, match="schedule"):
        mmcurate.video_loader(manifest, 2, T, seed=2, workers=0).load_state_dict(state)


def test_images_that_video_buckets_took_come_as_their_frame_repeated(tmp_path):
    """A webdataset source of clips and images through video_buckets: images are one-frame
    clips, in batches of their bucket's shape with their frame over the whole window."""
    import tarfile

    from PIL import Image

    members = {}
    for i in range(3):
        members[f"v{i}.mp4"] = encode_video(10 + i, 24, size=(64, 48))
        members[f"i{i}.jpg"] = jpeg_of(np.full((48, 64, 3), 40 + 60 * i, dtype=np.uint8), Image)
    for name in list(members):
        members[name.split(".")[0] + ".txt"] = name.encode()
    (tmp_path / "in").mkdir()
    with tarfile.open(tmp_path / "in" / "a.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    result = mmcurate.build(
        {
            "source": {"kind": "webdataset", "path": str(tmp_path / "in" / "*.tar")},
            "stages": [{"name": "video_buckets", "buckets": ["64x48"]}],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    loader = mmcurate.video_loader(result["manifest"], 2, T, workers=0)
    seen = {}
    for batch in loader:
        assert tuple(batch["video"].shape[1:]) == (T, 3, 48, 64)
        for place, key in enumerate(batch["__key__"]):
            seen[key] = (batch["video"][place].numpy(), batch["frame_start"][place])
    assert sorted(seen) == ["i0", "i1", "i2", "v0", "v1", "v2"] and loader.dropped == {}
    for i in range(3):
        video, start = seen[f"i{i}"]
        assert start == 0 and (video == video[:1]).all()  # one frame, T times
        assert abs(float(video.mean()) - (40 + 60 * i)) < 3


def jpeg_of(pixels, image_module) -> bytes:
    out = io.BytesIO()
    image_module.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_clips_waiting_for_their_batch_stay_within_the_byte_cap(build):
    manifest, clips = build
    cap = max(len(c) for c in clips.values()) + 1  # about one clip in memory
    free = mmcurate.video_loader(manifest, 2, T, seed=4, workers=0, shuffle_buffer_bytes=1 << 30)
    capped = mmcurate.video_loader(manifest, 2, T, seed=4, workers=0, shuffle_buffer_bytes=cap)
    none = mmcurate.video_loader(manifest, 2, T, seed=4, workers=0, shuffle_buffer_bytes=0)
    videos = [[b["video"] for b in loader] for loader in (free, none)]
    # past the cap a clip is decoded by PyAV (reading packets as it decodes): the same frames
    assert all(torch.equal(a, b) for a, b in zip(*videos, strict=True))
    runs = [epoch_of(loader) for loader in (free, capped, none)]
    assert runs[0] == runs[1] == runs[2]  # the cap moves clips to disk, never changes a batch
    assert free.dataset.held_peak > cap  # clips did wait: the cap had something to bound
    assert 0 < capped.dataset.held_peak <= cap and none.dataset.held_peak == 0

"""mmcurate.video_loader: random temporal windows of a real video build, one bucket a batch,
the same windows for the same seed, exact mid-epoch resume, equal steps on every rank."""

import io
import json
from pathlib import Path

import av
import numpy as np
import pytest
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

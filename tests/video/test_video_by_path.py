"""Videos travel by path (issue 37): a Spilled video is decoded from its file, never read whole;
clip_split encodes clips into files of the task's spill folder and returns Spilled values.
Real MP4s made with PyAV; a 1 GiB `free` box padding is a hole in a sparse file."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from mmcurate.core.spill import Spilled, media_bytes, set_task_folder
from mmcurate.pipeline.video_data import encode_video, frame_pixels, read_frame_number, write_padded
from mmcurate.stages.lib.video_decode import sample_video
from mmcurate.stages.lib.video_probe import display_rotation, may_be_rotated, refuse_images
from mmcurate.stages.lib.video_split import split_video
from mmcurate.stages.registry import build_stage
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
OPTS = {"mode": "uniform", "num_frames": 4, "fps": 1.0, "size": 512, "crop": False, "quality": 95}


@pytest.fixture
def spill(tmp_path):
    """The task spill folder stages write into, empty, for this test only."""
    folder = tmp_path / "spill"
    folder.mkdir()
    set_task_folder(str(folder))
    yield folder
    set_task_folder(None)


def batch_of(value, key="v"):
    batch = {"__key__": [key], "__drop__": [None], "__drop_stage__": [None], "__index__": [0]}
    return batch | {"txt": ["a video"], "json": [None], "mp4": [value]}


def padded(tmp_path, data, pad=GIB, name="padded.mp4"):
    path = tmp_path / name
    return Spilled(str(path), write_padded(data, str(path), pad), owned=False)


@pytest.mark.parametrize("stage", ["video_frames", "clip_split"])
def test_a_video_padded_to_1_gib_is_decoded_by_path_in_little_memory(stage, tmp_path):
    """In a fresh process: the stage on the padded file (a Spilled value) stays < 96 MiB of
    peak PSS of the whole tree above idle (before, by bytes: 7.0 GiB for video_frames, 3.1 GiB
    for clip_split) and gives the small file's frames, or its clips byte for byte, as files."""
    small = tmp_path / "small.mp4"
    small.write_bytes(encode_video(48))
    big = padded(tmp_path, small.read_bytes())
    (tmp_path / "spill").mkdir()
    child = [sys.executable, str(REPO / "tests" / "video_by_path_child.py"), stage]
    args = [str(small), big.path, "spilled", str(tmp_path / "spill")]
    done = subprocess.run(child + args, capture_output=True, text=True, timeout=300, check=True)
    found = json.loads(done.stdout)
    assert found["same"], found
    assert found["peak"] < 96 << 20, found
    if stage == "clip_split":
        assert found["found"]["spilled"] == [True, True]
    else:
        assert found["found"]["meta"]["decoder"] == "decord"  # decord opened the path


def test_clip_split_returns_spilled_clips_equal_to_the_bytes_path(spill):
    """Clips as files of the spill folder: the same bounds, keys and bytes as clips kept in
    memory, and the frames each clip holds are its scene's; a small budget inlines the first."""
    video = encode_video(84, 24, cuts=(24, 60))
    spec = {"name": "clip_split", "mode": "scenes", "analysis_fps": 24, "min_clip_s": 0.4}
    in_memory = build_stage(spec)(batch_of(video))
    as_files = build_stage(spec | {"inline_clip_bytes": 0})(batch_of(video))
    assert as_files["__key__"] == in_memory["__key__"] == ["v_0000", "v_0001", "v_0002"]
    assert as_files["json"] == in_memory["json"]
    assert all(isinstance(clip, bytes) for clip in in_memory["mp4"])
    for clip, same in zip(as_files["mp4"], in_memory["mp4"], strict=True):
        assert isinstance(clip, Spilled) and Path(clip.path).parent == spill
        assert clip.size == os.path.getsize(clip.path) and media_bytes(clip) == same
    scenes = [(0, 24), (24, 60), (60, 84)]
    for clip, (first, stop) in zip(as_files["mp4"], scenes, strict=True):
        result = sample_video(clip, dict(OPTS, num_frames=stop - first))
        assert result["frame_count"] == stop - first
        assert [read_frame_number(f) for f in pixels(result["frames"])] == list(range(first, stop))
    budget = build_stage(spec | {"inline_clip_bytes": len(in_memory["mp4"][0])})(batch_of(video))
    assert [type(c) for c in budget["mp4"]] == [bytes, Spilled, Spilled]
    assert [media_bytes(c) for c in budget["mp4"]] == in_memory["mp4"]


def test_split_video_into_files_equals_in_memory_and_reads_a_spilled_source(tmp_path):
    video = encode_video(48, 24, cuts=(24,))
    opts = {"mode": "fixed", "window_s": 1.0, "stride_s": None, "analysis_fps": 4.0,
            "threshold": 30.0, "min_clip_s": 0.0, "max_clips": None}  # fmt: skip
    in_memory = split_video(video, opts)
    source = padded(tmp_path, video, pad=64 << 20)
    to_files = split_video(source, opts, prefix=str(tmp_path / "c"))
    assert [(c["start"], c["end"]) for c in to_files] == [(0.0, 1.0), (1.0, 2.0)]
    assert [media_bytes(c["data"]) for c in to_files] == [c["data"] for c in in_memory]
    assert sorted(p.name for p in tmp_path.glob("c-*")) == ["c-00000.mp4", "c-00001.mp4"]


def test_header_probes_read_only_the_boxes_they_need(tmp_path):
    """The screens on 1 GiB padded files answer as on the plain bytes, reading (rchar of this
    process: real reads, not a count we keep) a small part of the file."""
    plain, turned = encode_video(24), make_rotated(24, -90)
    files = [padded(tmp_path, plain, name="a.mp4"), padded(tmp_path, turned, name="b.mp4")]
    before = read_chars()
    for value, data in zip(files, (plain, turned), strict=True):
        refuse_images(value)
        assert may_be_rotated(value) == may_be_rotated(data)
        assert display_rotation(value) == display_rotation(data)
    assert (may_be_rotated(files[0]), display_rotation(files[1])) == (False, 270)
    assert read_chars() - before < 64 << 20


def test_big_bytes_go_by_a_temporary_file_that_is_removed(spill):
    """A bytes video over 1 MiB is written to the spill folder for the decoder child and
    removed after it; frames equal the unpadded video's."""
    video = encode_video(48)
    path = spill.parent / "p.mp4"
    write_padded(video, str(path), 2 << 20)
    stage = build_stage({"name": "video_frames", "num_frames": 4})
    big, small = stage(batch_of(path.read_bytes())), stage(batch_of(video))
    frames = [c for c in small if c.endswith(".jpg")]
    assert len(frames) == 4 and all(big[c] == small[c] for c in frames)
    assert big["__drop__"] == [None] and list(spill.iterdir()) == []


def test_a_split_past_its_time_limit_leaves_no_clip_files(spill):
    stage = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 0.5,
                         "timeout_s": 0.001, "inline_clip_bytes": 0})  # fmt: skip
    out = stage(batch_of(encode_video(96)))
    assert out["__drop__"] == ["decode_timeout"] and list(spill.iterdir()) == []
    good = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 1.0,
                        "inline_clip_bytes": 0})(batch_of(encode_video(48)))  # fmt: skip
    assert len(list(spill.iterdir())) == 2 and all(isinstance(c, Spilled) for c in good["mp4"])


def make_rotated(frames: int, rotation: int) -> bytes:
    """H.264 frames in an mp4 whose track has a display rotation."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 256, 144, "yuv420p"
        stream.set_display_rotation(rotation)
        for i in range(frames):
            image = av.VideoFrame.from_ndarray(frame_pixels(i, 256, 144), format="rgb24")
            for packet in stream.encode(image):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def pixels(jpegs):
    return [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs]


def read_chars() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise OSError("no rchar in /proc/self/io")

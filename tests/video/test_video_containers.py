"""A stored video member's extension names the container its bytes are (issue 45, item 13):
clips that clip_split re-encodes are mp4 whatever the source was (webm, mkv, mov, avi); a clip
that is the whole video keeps the source's bytes and extension. Checked with PyAV."""

import io
import json

import av
import pytest
from mmcurate.core.formats import VIDEO_COLUMNS
from mmcurate.core.tario import iter_tar_samples
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.video_data import encode_video
from mmcurate.stages.registry import build_stage

# (extension, codec, PyAV's muxer): the sources a user's folder may hold
SOURCES = [
    ("webm", "libvpx", "webm"),  # VP8
    ("webm", "libvpx-vp9", "webm"),
    ("mkv", "libx264", "matroska"),
    ("mov", "libx264", "mov"),
    ("avi", "mpeg4", "avi"),
    ("mp4", "libx264", "mp4"),
]


def container_of(data: bytes) -> str:
    """The container a video's bytes are, as its extension should say: PyAV's demuxer, then
    the brand (mp4 / QuickTime) or DocType (webm / Matroska) that tells the pairs apart."""
    with av.open(io.BytesIO(data)) as box:
        demuxer = box.format.name
        assert box.streams.video and next(box.decode(video=0)) is not None
    if demuxer.startswith("mov,mp4"):
        return "mov" if data[8:12] == b"qt  " else "mp4"
    if demuxer == "matroska,webm":
        return "webm" if b"webm" in data[:64] else "mkv"
    return demuxer


def source_batch(ext: str, data: bytes) -> dict:
    batch = {"__key__": ["v"], "__drop__": [None], "__drop_stage__": [None], "__index__": [0]}
    return batch | {"txt": ["a video"], "json": [None], "__parent__": [None], ext: [data]}


@pytest.mark.parametrize(("ext", "codec", "muxer"), SOURCES)
def test_cut_clips_are_stored_as_mp4_and_a_whole_clip_keeps_its_container(ext, codec, muxer):
    source = encode_video(48, 24, (192, 64), codec, muxer)
    assert container_of(source) == ext
    cut = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 1.0})(
        source_batch(ext, source)
    )
    assert cut["__key__"] == ["v_0000", "v_0001"]
    for row in range(2):
        assert container_of(cut["mp4"][row]) == "mp4"
        assert ext == "mp4" or cut[ext][row] is None  # never a second, stale video
        assert json.loads(cut["json"][row])["source_container"] == ext
    whole = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 5.0})(
        source_batch(ext, source)
    )
    assert whole[ext] == [source] and container_of(whole[ext][0]) == ext
    assert ext == "mp4" or whole.get("mp4", [None]) == [None]


def test_every_video_member_of_a_clip_split_build_is_the_container_it_says(ray_session, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i, (ext, codec, muxer) in enumerate(SOURCES[:-1]):
        (folder / f"long{i}.{ext}").write_bytes(encode_video(48, 24, (192, 64), codec, muxer))
        (folder / f"short{i}.{ext}").write_bytes(encode_video(18, 24, (192, 64), codec, muxer))
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "videos", "path": str(folder), "files_per_task": 4},
            "stages": [
                {"name": "clip_split", "mode": "fixed", "window_s": 1.0, "min_clip_s": 0.5},
                {"name": "video_frames", "num_frames": 2, "size": 32},
            ],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 15  # each long video: 2 clips; each short one: itself
    seen = {}
    for shard in manifest["shards"]:
        with open(tmp_path / "out" / shard["name"], "rb") as f:
            for sample in iter_tar_samples(f):
                videos = [c for c in VIDEO_COLUMNS if c in sample]
                assert len(videos) == 1, sample["__key__"]
                assert container_of(sample[videos[0]]) == videos[0], sample["__key__"]
                seen[sample["__key__"]] = videos[0]
    for i, (ext, _, _) in enumerate(SOURCES[:-1]):
        assert seen[f"long{i}_0000"] == seen[f"long{i}_0001"] == "mp4"
        assert seen[f"short{i}_0000"] == ext

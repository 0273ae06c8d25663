"""Video fixes: odd `clip_start` values, keyframes, rotated and variable-frame-rate videos,
repeated stages, samples with two videos, and 1-pixel videos. Real videos made with PyAV."""

import io
import json
from fractions import Fraction

import av
import numpy as np
import pytest
from mmcurate.pipeline.video_data import encode_video, frame_pixels, read_frame_number
from mmcurate.stages.lib.video_decode import sample_video, to_jpeg, with_pyav
from mmcurate.stages.lib.video_probe import display_rotation, may_be_rotated
from mmcurate.stages.lib.video_split import split_video
from mmcurate.stages.registry import build_stage
from PIL import Image

OPTS = {"mode": "uniform", "num_frames": 8, "fps": 1.0, "size": 512, "crop": False, "quality": 95}
SPLIT = {"mode": "fixed", "window_s": 1.0, "stride_s": None, "analysis_fps": 4.0,
         "threshold": 30.0, "min_clip_s": 0.0, "max_clips": None}  # fmt: skip


def make_video(
    frames: int,
    size: tuple[int, int] = (256, 144),
    options: dict | None = None,
    rotation: int | None = None,
    steps: list[int] | None = None,
) -> bytes:
    """Numbered H.264 frames at 24 fps; `rotation`: a display matrix; `steps`: each frame's
    pts step in 1/24 s (variable frame rate)."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=24)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = options or {"preset": "ultrafast", "crf": "18"}
        stream.codec_context.time_base = Fraction(1, 24)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        pts = 0
        for i in range(frames):
            image = av.VideoFrame.from_ndarray(frame_pixels(i, *size), format="rgb24")
            image.pts, image.time_base = pts, Fraction(1, 24)
            pts += steps[i] if steps else 1
            for packet in stream.encode(image):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def pixels_of(jpegs: list[bytes]) -> list[np.ndarray]:
    return [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpegs]


def batch_of(columns: dict, meta: str | None = None, parent: str | None = None) -> dict:
    batch = {"__key__": ["v"], "__drop__": [None], "__drop_stage__": [None], "__index__": [0]}
    batch |= {"txt": ["a video"], "json": [meta], "__parent__": [parent]}
    return batch | {col: [data] for col, data in columns.items()}


def frame_columns(batch: dict, row: int = 0) -> list[str]:
    return sorted(c for c in batch if c[:3].isdigit() and batch[c][row] is not None)


@pytest.mark.parametrize(
    "start", ['"10"', '"00:00:05.000"', "null", "true", "[1]", "{}", "NaN", "5.0"]
)
def test_a_users_clip_start_is_kept_and_never_shifts_or_breaks_frame_times(start):
    stage = build_stage({"name": "video_frames", "num_frames": 2})
    text = f'{{"clip_start": {start}, "id": 7}}'
    out = stage(batch_of({"mp4": encode_video(48)}, text))
    assert out["__drop__"] == [None]
    meta = json.loads(out["json"][0])
    assert meta["frame_timestamps"] == pytest.approx([12 / 24, 36 / 24], abs=2e-3)
    kept = json.loads(text)["clip_start"]  # as given; NaN, not JSON, is written as null
    assert meta["clip_start"] == (None if start == "NaN" else kept)
    assert meta["id"] == 7


def test_a_clip_cut_by_clip_split_reports_frame_times_in_source_seconds():
    stage = build_stage({"name": "video_frames", "num_frames": 2})
    clip = batch_of({"mp4": encode_video(48)}, '{"clip_start": 2.5}', parent="src")
    meta = json.loads(stage(clip)["json"][0])
    assert meta["frame_timestamps"] == pytest.approx([3.0, 4.0], abs=2e-3)


def test_keyframes_mode_samples_the_real_keyframes_with_decord_and_pyav():
    x264 = {"preset": "fast", "g": "12", "keyint_min": "12", "sc_threshold": "0", "bf": "2"}
    video = make_video(48, options=x264)
    with av.open(io.BytesIO(video)) as box:  # the truth, in presentation order
        truth = [i for i, frame in enumerate(box.decode(video=0)) if frame.key_frame]
    assert truth == [0, 12, 24, 36]
    opts = dict(OPTS, mode="keyframes")
    for result in (sample_video(video, opts), with_pyav(video, opts)):
        assert result["indices"] == truth
        assert [read_frame_number(p) for p in pixels_of(result["frames"])] == truth
    assert sample_video(video, opts)["decoder"] == "decord"


# A display rotation is degrees counterclockwise (ffmpeg's av_display_rotation_get); a phone's
# portrait video says -90 and ffmpeg shows it turned clockwise. np.rot90(stored, k) turns the
# stored frame counterclockwise k times: the k that undoes each rotation gives the coded frame.
UNDO = {-90: 1, 90: -1, 180: 2}


@pytest.mark.parametrize("rotation", sorted(UNDO))
def test_rotated_videos_are_stored_upright(rotation):
    video = make_video(24, rotation=rotation)
    result = sample_video(video, dict(OPTS, num_frames=2))
    side = rotation % 180 == 90
    assert (result["width"], result["height"]) == ((144, 256) if side else (256, 144))
    for index, pixels in zip(result["indices"], pixels_of(result["frames"]), strict=True):
        assert pixels.shape[:2] == (result["height"], result["width"])
        assert read_frame_number(np.rot90(pixels, UNDO[rotation])) == index
    small = sample_video(video, dict(OPTS, num_frames=1, size=64))
    expected = (64, 114) if side else (114, 64)
    assert Image.open(io.BytesIO(small["frames"][0])).size == expected


@pytest.mark.parametrize(
    ("codec", "container"), [("libx264", "mp4"), ("libx264", "mov"), ("libvpx-vp9", "webm")]
)
def test_the_rotation_screen_passes_plain_videos_and_never_a_rotated_one(codec, container):
    """may_be_rotated spares plain videos PyAV's first-frame decode; it must never pass over
    a rotated one (then its frames would come out sideways)."""
    plain = encode_video(6, 24, (64, 48), codec, container)
    assert display_rotation(plain) == 0 and not may_be_rotated(plain)
    for rotation in (-90, 90, 180):
        video = make_video(6, rotation=rotation)
        assert may_be_rotated(video) and display_rotation(video) == rotation % 360
    assert may_be_rotated(b"") and may_be_rotated(b"\xff\xd8\xff" + bytes(64))  # unknown: check


def test_clips_of_a_rotated_video_are_upright_and_frames_have_no_alpha():
    clips = split_video(make_video(48, rotation=-90), dict(SPLIT))
    assert [(c["start"], c["end"]) for c in clips] == [(0.0, 1.0), (1.0, 2.0)]
    result = sample_video(clips[1]["data"], dict(OPTS, num_frames=2))
    assert (result["width"], result["height"]) == (144, 256)
    numbers = [read_frame_number(np.rot90(p, 1)) for p in pixels_of(result["frames"])]
    assert numbers == [24 + i for i in result["indices"]]
    rgba = np.zeros((16, 24, 4), np.uint8)
    assert Image.open(io.BytesIO(to_jpeg(rgba, 224, False, 90))).mode == "RGB"


def test_a_second_video_frames_pass_replaces_all_frames_of_the_first():
    batch = batch_of({"mp4": encode_video(48)})
    batch = build_stage({"name": "video_frames", "num_frames": 8, "size": 512, "crop": False})(
        batch
    )
    assert len(frame_columns(batch)) == 8
    batch = build_stage({"name": "video_frames", "num_frames": 2, "size": 512, "crop": False})(
        batch
    )
    assert frame_columns(batch) == ["000.jpg", "001.jpg"]
    numbers = [read_frame_number(p) for p in pixels_of([batch["000.jpg"][0], batch["001.jpg"][0]])]
    assert numbers == json.loads(batch["json"][0])["frame_indices"] == [12, 36]


def test_a_clip_holds_only_its_own_video_and_keep_video_false_clears_every_video():
    webm = encode_video(24, codec="libvpx-vp9", container="webm")
    source = batch_of({"mp4": encode_video(48), "webm": webm})
    framed = build_stage({"name": "video_frames", "num_frames": 2})(source)
    clips = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 1.0})(framed)
    assert clips["__key__"] == ["v_0000", "v_0001"] and clips["webm"] == [None, None]
    for row in range(2):
        assert frame_columns(clips, row) == []  # the whole source's frames are not the clip's
        with av.open(io.BytesIO(clips["mp4"][row])) as box:
            first = next(box.decode(video=0)).to_ndarray(format="rgb24")
            assert read_frame_number(first) == 24 * row
    both = batch_of({"mp4": encode_video(24), "webm": webm})
    out = build_stage({"name": "video_frames", "num_frames": 2, "keep_video": False})(both)
    assert out["__drop__"] == [None] and out["mp4"] == [None] and out["webm"] == [None]


def vfr_video() -> bytes:
    """48 frames: 24 at 1/24 s, then 24 one second apart (frame 24 + k at 1 + k s)."""
    return make_video(48, steps=[1] * 24 + [24] * 24)


def test_fps_mode_samples_a_variable_frame_rate_video_by_time():
    video = vfr_video()
    expected = [0, *range(24, 48)]  # one frame a second: 0 s, then 1 s ... 24 s
    opts = dict(OPTS, mode="fps")
    for result in (sample_video(video, opts), with_pyav(video, opts)):
        assert result["indices"] == expected
        assert result["timestamps"] == pytest.approx(range(25), abs=2e-3)
        assert [read_frame_number(p) for p in pixels_of(result["frames"])] == expected


def test_clip_split_cuts_a_variable_frame_rate_video_by_time():
    clips = split_video(vfr_video(), dict(SPLIT, window_s=5.0))
    assert [(c["start"], c["end"]) for c in clips] == [(5.0 * i, 5.0 * i + 5) for i in range(5)]
    with av.open(io.BytesIO(clips[1]["data"])) as box:
        numbers = [read_frame_number(f.to_ndarray(format="rgb24")) for f in box.decode(video=0)]
    assert numbers == [28, 29, 30, 31, 32]  # the frames shown from 5 s to 10 s


def test_a_one_pixel_video_splits_into_2x2_clips():
    out = io.BytesIO()
    with av.open(out, "w", format="avi") as box:
        stream = box.add_stream("rawvideo", rate=24)
        stream.width, stream.height, stream.pix_fmt = 1, 1, "bgr24"
        for i in range(6):
            pixels = np.full((1, 1, 3), i * 40, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    batch = batch_of({"avi": out.getvalue()})
    clips = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 0.125,
                         "min_clip_s": 0.0})(batch)  # fmt: skip
    assert clips["__drop__"] == [None, None]
    assert clips["avi"] == [None, None]  # re-encoded clips are mp4s, stored as such
    for data in clips["mp4"]:
        result = sample_video(data, dict(OPTS, num_frames=1))
        assert (result["width"], result["height"]) == (2, 2)


def test_two_videos_sharing_a_key_count_as_two_inputs_when_split(tmp_path):
    """Bug: stats told videos apart by key, so two tars each holding a video `k1` counted one
    video in; its repeat's clips were then dropped as `duplicate_key` one by one, and the
    inputs did not add up (2 + 1 videos, 2 counted). Now: 3 in, one duplicate_key."""
    import tarfile

    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    (tmp_path / "in").mkdir()
    for name, keys in (("a", ["k1", "k2"]), ("b", ["k1"])):
        with tarfile.open(tmp_path / "in" / f"{name}.tar", "w") as tar:
            for key in keys:
                data = encode_video(24, 24, (64, 48))
                info = tarfile.TarInfo(f"{key}.mp4")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "webdataset", "path": str(tmp_path / "in" / "*.tar")},
            "stages": [{"name": "clip_split", "mode": "fixed", "window_s": 0.5, "min_clip_s": 0.1}],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    assert run_build(cfg, False)["samples"] == 4  # two videos of 1 s, two clips each
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["samples_in"] == 3
    source, split = stats["stages"]
    assert (source["in"], source["out"], source["dropped"]) == (3, 2, {"duplicate_key": 1})
    assert (split["in"], split["out"]) == (2, 4)


def test_a_still_image_named_like_a_video_is_no_video():
    """Bug: FFmpeg opens a JPEG as a one-frame video, so a photo saved as .mp4 was kept, its
    `.mp4` member a JPEG. Now both video stages drop it as `no_video_stream`."""
    stills = []
    for fmt in ("JPEG", "PNG", "GIF", "WEBP"):
        buffer = io.BytesIO()
        Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, fmt)
        stills.append(buffer.getvalue())
    for spec in ({"name": "video_frames"}, {"name": "clip_split"}):
        stage = build_stage(spec)
        for still in stills:
            assert stage(batch_of({"mp4": still}))["__drop__"] == ["no_video_stream"], spec

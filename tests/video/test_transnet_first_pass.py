"""clip_split `mode: transnetv2` beyond the network itself: the cheap first pass that decides
where the network runs, flashes held a few frames, and the decoder's time limit by length.
Real videos encoded here over scikit-image photos; the real TransNetV2 weights."""

from __future__ import annotations

import numpy as np
from mmcurate.stages.clip_split import (
    BASE_TIMEOUT_S,
    TIMEOUT_PER_VIDEO_S,
    ClipSplit,
    ClipSplitOptions,
)
from mmcurate.stages.lib import transnet
from mmcurate.stages.lib.shot_candidates import ChangeSignal
from skimage import data

from tests.kit_transnet import FPS, blend, encode, flash_video, pan


def options(**extra: object) -> dict:
    return ClipSplitOptions(mode="transnetv2", min_clip_s=0.5, **extra).model_dump()


def small(frames: list[np.ndarray]) -> list[np.ndarray]:
    """Frames as the first pass sees them (27x48), shrunk here without a codec."""
    from PIL import Image

    return [
        np.asarray(Image.fromarray(f).resize((48, 27), Image.Resampling.BICUBIC)) for f in frames
    ]


def flags(frames: list[np.ndarray]) -> list[int]:
    signal = ChangeSignal()
    for frame in small(frames):
        signal.add(frame)
    return [i for i, flag in enumerate(signal.flags) if flag]


def slow_dissolve(length: int = 28) -> tuple[list[np.ndarray], range]:
    """A slow pan over one photo dissolving over `length` frames into a pan over another."""
    a, b = pan(data.coffee(), 50 + length, (1, 0), 1), pan(data.astronaut(), 50 + length, (1, 0), 2)
    mixed = [blend(a[50 + i], b[i], (i + 1) / (length + 1)) for i in range(length)]
    return a[:50] + mixed + b[length : length + 30], range(50, 50 + length)


def test_first_pass_flags_cuts_and_slow_dissolves_not_a_steady_pan() -> None:
    steady = pan(data.chelsea(), 80, (3, 1), 3)
    assert flags(steady) == []  # nothing for the network to look at
    cut = steady[:40] + pan(data.rocket(), 40, (3, 1), 4)
    assert 40 in flags(cut)
    frames, blended = slow_dissolve(40)  # 2.5% of the picture a frame: no per-frame spike
    assert set(flags(frames)) & set(blended)


def test_network_runs_only_around_candidates() -> None:
    """A steady shot: the first pass leaves the network nothing to run; without it (the full
    run, `first_pass: false`) every 50-frame step is scored. Same single shot either way."""
    video = encode(pan(data.chelsea(), 150, (3, 1), 3))
    found, spans, predictor = transnet.detect_shots(video, options())
    assert (spans, predictor.scored) == ([(0, 150)], 0)
    found, spans, predictor = transnet.detect_shots(video, options(first_pass=False))
    assert (spans, predictor.scored) == ([(0, 150)], 3)


def test_slow_dissolve_found_with_and_without_the_first_pass() -> None:
    frames, blended = slow_dissolve()  # 28 frames (the network misses a 40-frame one here)
    video = encode(frames)
    fast = transnet.detect_shots(video, options())
    full = transnet.detect_shots(video, options(first_pass=False))
    for _, spans, _ in (fast, full):
        assert len(spans) == 2  # one transition, between the two shots
        (_, end), (start, _) = spans
        assert end <= blended.start + 4 and start >= blended.stop - 4  # its frames in no clip
    assert fast[2].scored < full[2].scored  # and the first pass ran the network on fewer windows


def test_flash_held_three_frames_is_no_cut() -> None:
    """A brightness flash over 3 frames (its edges score above 0.5): one shot, both ways."""
    frames = flash_video()
    for i in (30, 31):
        frames[i] = np.clip(frames[i].astype(np.float32) * 2.5 + 40, 0, 255).astype(np.uint8)
    for first_pass in (True, False):
        clips = transnet.split_shots(encode(frames), options(first_pass=first_pass))
        assert [(c["start"], c["end"]) for c in clips] == [(0.0, len(frames) / FPS)]


def test_transitions_close_together_are_one() -> None:
    assert transnet.joined([(1, 2), (5, 6), (20, 30), (36, 40)]) == [(1, 6), (20, 30), (36, 40)]


def test_two_close_cuts_that_do_not_come_back_are_no_flash() -> None:
    """Two cuts 5 frames apart where the picture does not come back: no clip spans them."""
    frames = pan(data.coffee(), 40, (2, 0), 1) + pan(data.astronaut(), 5, (2, 0), 2)
    frames += pan(data.rocket(), 40, (2, 0), 3)
    spans = transnet.detect_shots(encode(frames), options())[1]
    assert len(spans) >= 2 and spans[0][1] <= 40 and spans[-1][0] >= 44


def test_timeout_scales_with_the_video_length() -> None:
    stage = ClipSplit(ClipSplitOptions(mode="transnetv2"))
    stage.setup()
    seconds = 150 / FPS
    limit = stage.timeout_for(encode(pan(data.chelsea(), 150, (3, 1), 3)))
    assert abs(limit - (BASE_TIMEOUT_S + TIMEOUT_PER_VIDEO_S["transnetv2"] * seconds)) < 0.5
    assert stage.timeout_for(b"not a video at all") == BASE_TIMEOUT_S  # unreadable: the base
    assert ClipSplitOptions(mode="transnetv2", timeout_s=30).timeout_s == 30  # given: kept

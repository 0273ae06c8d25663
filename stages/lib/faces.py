"""Face detection and blurring for face_blur, offline, from the Haar cascades that ship inside
opencv-python-headless (`cv2.data.haarcascades`; Intel License Agreement for the Open Source
Computer Vision Library, a 3-clause BSD-style licence, as the header of each .xml states).

One cascade alone is not enough on real photos: `frontalface_default` at OpenCV's defaults
found faces in textures and a cat (bench/faces.py). Here `frontalface_alt2` proposes
candidates on a downscaled grey picture (faces below `min_face` of its short side are not
searched: that is where most false boxes and most of the scanning time are). A candidate is a
face when it shows two of three signs: many neighbouring hits, an eye found by the eye cascade
in its upper part, agreement from a second face cascade, `frontalface_alt`. Both checks look
only at the candidate (a few thousand pixels), never the whole picture again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import cv2
import numpy as np

PRIMARY = "haarcascade_frontalface_alt2.xml"
CONFIRM = "haarcascade_frontalface_alt.xml"
EYES = "haarcascade_eye.xml"
EYE_VIEW = 120  # a weak candidate is enlarged to this side before looking for eyes
EYE_MIN = 15
DETECTOR_NAME = "opencv-haar:frontalface_alt2+alt+eye"
WINDOW = 20  # the cascades' own window: nothing smaller can be found
SCALE_STEP = 1.1  # detectMultiScale's pyramid step (OpenCV's default)
MATCH_IOU = 0.3  # a confirming box must overlap the candidate this much


def detector_version() -> str:
    """The detector's version: the OpenCV build whose cascades and code ran."""
    return cv2.__version__


@dataclass(frozen=True)
class DetectSettings:
    work_side: int = 400  # pictures are searched with their short side at most this
    min_face: float = 0.04  # smallest face searched, as a share of the short side
    min_neighbors: int = 2  # hits a candidate needs at all
    strong_neighbors: int = 6  # hits that make a candidate a face without confirmation
    confirm: bool = True  # a candidate needs two of three signs (see confirmed)


@cache
def cascade(name: str) -> cv2.CascadeClassifier:
    """A cascade from the installed wheel (loaded once per process)."""
    classifier = cv2.CascadeClassifier(cv2.data.haarcascades + name)
    if classifier.empty():
        raise FileNotFoundError(f"OpenCV cascade {name} not found in {cv2.data.haarcascades}")
    return classifier


class FaceDetector:
    """Face boxes (x0, y0, x1, y1 in the picture's pixels) in a grey picture."""

    def __init__(self, settings: DetectSettings) -> None:
        self.settings = settings
        self.primary = cascade(PRIMARY)
        self.confirmer = cascade(CONFIRM)
        self.eye = cascade(EYES)

    def detect(self, grey: np.ndarray) -> np.ndarray:
        s = self.settings
        height, width = grey.shape
        scale = min(1.0, s.work_side / max(min(height, width), 1))
        work = grey
        if scale < 1.0:
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            work = cv2.resize(grey, size, interpolation=cv2.INTER_AREA)
        side = max(WINDOW, int(s.min_face * min(work.shape)))
        if min(work.shape) < side:
            return np.zeros((0, 4), np.float64)
        found, hits = self.primary.detectMultiScale2(work, SCALE_STEP, 1, minSize=(side, side))
        boxes = []
        for (x, y, w, h), count in zip(found, hits, strict=True):
            if count < s.min_neighbors:
                continue
            box = (int(x), int(y), int(x + w), int(y + h))
            if not s.confirm or self.confirmed(work, box, count >= s.strong_neighbors):
                boxes.append(box)
        return np.asarray(boxes, np.float64).reshape(-1, 4) / scale

    def confirmed(self, work: np.ndarray, box: tuple[int, int, int, int], strong: bool) -> bool:
        """A face shows two of three signs: many hits of the first cascade (`strong`), an eye
        found by the eye cascade, agreement of a second face cascade. Any one alone let
        textures through (bench/faces.py: 0.075 false boxes a picture with "strong, or two
        eyes, or one eye and agreement"; 0.04 with two of three, for one face in 180 lost)."""
        eye = self.eyes(work, box) >= 1
        if strong and eye:
            return True
        return (strong or eye) and self.agrees(work, box)

    def eyes(self, work: np.ndarray, box: tuple[int, int, int, int]) -> int:
        """Eyes found in the box's upper 60%, the box enlarged to EYE_VIEW pixels first (the
        eye cascade's window is 20 px: a 40 px face's eyes are far smaller)."""
        x0, y0, x1, y1 = box
        face = cv2.resize(work[y0:y1, x0:x1], (EYE_VIEW, EYE_VIEW), interpolation=cv2.INTER_CUBIC)
        upper = face[: int(EYE_VIEW * 0.6)]
        found = self.eye.detectMultiScale(upper, SCALE_STEP, 2, minSize=(EYE_MIN, EYE_MIN))
        return len(found)

    def agrees(self, work: np.ndarray, box: tuple[int, int, int, int]) -> bool:
        """Whether the second cascade finds a face of about the same place and size, searched
        only around the candidate."""
        x0, y0, x1, y1 = box
        side, pad = x1 - x0, (x1 - x0) // 2
        left, top = max(0, x0 - pad), max(0, y0 - pad)
        roi = work[top : y1 + pad, left : x1 + pad]
        low, high = max(WINDOW, int(side * 0.6)), int(side * 1.6) + 1
        found, _ = self.confirmer.detectMultiScale2(
            roi, SCALE_STEP, 1, minSize=(low, low), maxSize=(high, high)
        )
        for x, y, w, h in found:
            other = (left + x, top + y, left + x + w, top + y + h)
            if iou(box, other) >= MATCH_IOU:  # any hit: the cascades err independently
                return True
        return False


def iou(a: tuple | np.ndarray, b: tuple | np.ndarray) -> float:
    """Intersection over union of two (x0, y0, x1, y1) boxes."""
    wide = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    tall = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = wide * tall
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def blur_regions(rgb: np.ndarray, boxes: np.ndarray, margin: float, strength: float) -> np.ndarray:
    """A copy of `rgb` with each box, grown by `margin` of its side on every side, blurred:
    shrunk to about 1 / (strength x side) of its size and enlarged back, so no detail finer
    than `strength` of the face survives (a Gaussian that wide is far slower on big faces)."""
    out = rgb.copy()
    height, width = rgb.shape[:2]
    for x0, y0, x1, y1 in grown(boxes, margin, width, height):
        region = out[y0:y1, x0:x1]
        step = max(2.0, strength * max(x1 - x0, y1 - y0))
        small = (max(1, round((x1 - x0) / step)), max(1, round((y1 - y0) / step)))
        tiny = cv2.resize(region, small, interpolation=cv2.INTER_AREA)
        smooth = cv2.resize(tiny, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
        out[y0:y1, x0:x1] = cv2.GaussianBlur(smooth, (0, 0), step / 2)
    return out


def grown(boxes: np.ndarray, margin: float, width: int, height: int) -> list[tuple[int, ...]]:
    """Boxes grown by `margin` of their size on each side, as whole pixels inside the picture."""
    out = []
    for x0, y0, x1, y1 in boxes:
        dx, dy = (x1 - x0) * margin, (y1 - y0) * margin
        box = (
            max(0, int(x0 - dx)),
            max(0, int(y0 - dy)),
            min(width, int(np.ceil(x1 + dx))),
            min(height, int(np.ceil(y1 + dy))),
        )
        if box[2] > box[0] and box[3] > box[1]:
            out.append(box)
    return out


def covered_share(boxes: np.ndarray, width: int, height: int) -> float:
    """The share of the picture inside the union of the boxes (0..1)."""
    if len(boxes) == 0 or width <= 0 or height <= 0:
        return 0.0
    mask = np.zeros((height, width), bool)
    for x0, y0, x1, y1 in grown(boxes, 0.0, width, height):
        mask[y0:y1, x0:x1] = True
    return float(mask.mean())

"""Faces composited into photos with their truth boxes, and the detection score."""

from __future__ import annotations

from functools import cache

import cv2
import numpy as np
from mmcurate.stages.lib.faces import iou
from skimage import data

# Faceless real photos and textures (camera is left out: it shows a man's face).
BACKGROUNDS = ("chelsea", "coffee", "coins", "rocket", "moon", "grass", "gravel", "brick")


ASTRONAUT_HEAD = (130, 20, 330, 220)  # x0, y0, x1, y1 in data.astronaut()


ASTRONAUT_FACE = (48, 48, 144, 162)  # her face (brow to chin) inside that head crop


MATCH = 0.3  # IoU a found box needs with a truth box to count as finding it


@cache
def background(name: str) -> np.ndarray:
    array = getattr(data, name)()
    array = array[0] if isinstance(array, tuple) else array
    if array.dtype != np.uint8:
        array = (array / max(float(array.max()), 1e-9) * 255).astype(np.uint8)
    if array.ndim == 2:
        array = np.stack([array] * 3, -1)
    return np.ascontiguousarray(array[..., :3])


@cache
def face_sources() -> list[tuple[np.ndarray, tuple[int, int, int, int]]]:
    """(RGB patch, the face's box in it): the astronaut (and mirrored), 100 LFW faces tinted."""
    x0, y0, x1, y1 = ASTRONAUT_HEAD
    head = data.astronaut()[y0:y1, x0:x1]
    fx0, fy0, fx1, fy1 = ASTRONAUT_FACE
    out = [(head, ASTRONAUT_FACE), (head[:, ::-1].copy(), (200 - fx1, fy0, 200 - fx0, fy1))]
    tint = np.array([1.0, 0.86, 0.74], np.float32)
    for face in (data.lfw_subset()[:100] * 255).astype(np.float32):
        out.append((np.clip(face[..., None] * tint, 0, 255).astype(np.uint8), (1, 1, 24, 25)))
    return out


def paste(canvas, source, at, size, angle, gain) -> tuple[tuple[int, ...], int]:
    """Paste a face patch whose face is `size` px wide, turned `angle` degrees, lit by
    `gain`, feathered by an ellipse; (truth box, side of the square it occupies)."""
    patch, (bx0, by0, bx1, by1) = source
    scale = size / (bx1 - bx0)
    h, w = (max(2, round(n * scale)) for n in patch.shape[:2])
    grown = cv2.resize(patch, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float32) * gain
    mask = np.zeros((h, w), np.float32)
    axis = 0.47 if patch.shape[0] > 100 else 0.6  # a tight LFW crop keeps its whole face
    cv2.ellipse(mask, (w // 2, h // 2), (int(w * axis), int(h * axis)), 0, 0, 360, 1.0, -1)
    mask = cv2.GaussianBlur(mask, (0, 0), max(1.0, w / 40))
    side = int(np.ceil(np.hypot(w, h)))
    turn = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
    turn[:, 2] += [(side - w) / 2, (side - h) / 2]
    grown, mask = (cv2.warpAffine(a, turn, (side, side)) for a in (grown, mask))
    x, y = at
    region = canvas[y : y + side, x : x + side].astype(np.float32)
    region = region * (1 - mask[..., None]) + np.clip(grown, 0, 255) * mask[..., None]
    canvas[y : y + side, x : x + side] = np.clip(region, 0, 255).astype(np.uint8)
    corners = np.array([[bx0, by0, 1], [bx1, by0, 1], [bx0, by1, 1], [bx1, by1, 1]], float)
    corners[:, :2] *= scale
    moved = corners @ turn.T
    low, high = moved.min(0), moved.max(0)
    return (
        x + int(low[0]),
        y + int(low[1]),
        x + int(np.ceil(high[0])),
        y + int(np.ceil(high[1])),
    ), side


def composite(index: int, rng: np.random.Generator, long_side=(400, 900), faces=(0, 4)):
    """(RGB picture, truth boxes): a crop of a real photo with 0-3 faces pasted in. A face is
    32 px or more and never enlarged past 3x its source pixels (LFW crops are 25 px)."""
    photo = background(BACKGROUNDS[index % len(BACKGROUNDS)])
    height, width = photo.shape[:2]
    cw, ch = int(width * rng.uniform(0.6, 1.0)), int(height * rng.uniform(0.6, 1.0))
    x, y = int(rng.integers(0, width - cw + 1)), int(rng.integers(0, height - ch + 1))
    scale = rng.uniform(*long_side) / max(cw, ch)
    size = (max(8, round(cw * scale)), max(8, round(ch * scale)))
    canvas = cv2.resize(photo[y : y + ch, x : x + cw], size, interpolation=cv2.INTER_AREA)
    height, width = canvas.shape[:2]
    truth, taken = [], []
    for _ in range(int(rng.integers(*faces))):
        source = face_sources()[int(rng.integers(len(face_sources())))]
        box = source[1]
        face = min(max(int(min(height, width) * rng.uniform(0.08, 0.3)), 32), 3 * (box[2] - box[0]))
        need = int(np.ceil(np.hypot(*source[0].shape[:2]) * face / (box[2] - box[0])))
        if need >= min(height, width):
            continue
        for _try in range(20):
            at = (int(rng.integers(0, width - need)), int(rng.integers(0, height - need)))
            if all(not overlaps((*at, at[0] + need, at[1] + need), t) for t in taken):
                found, side = paste(
                    canvas, source, at, face, rng.uniform(-10, 10), rng.uniform(0.6, 1.3)
                )
                truth.append(found)
                taken.append((*at, at[0] + side, at[1] + side))
                break
    return canvas, truth


def overlaps(a, b) -> bool:
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


def face_set(n: int, seed: int = 0, long_side=(400, 900)) -> list[tuple[np.ndarray, list]]:
    rng = np.random.default_rng(seed)
    return [composite(i, rng, long_side) for i in range(n)]


def score(truths: list[list], found: list[list]) -> tuple[float, float, list]:
    """(recall, false boxes per picture, missed (picture, truth box) pairs)."""
    hits, total, false, missed = 0, 0, 0, []
    for index, (faces, boxes) in enumerate(zip(truths, found, strict=True)):
        total += len(faces)
        used: set[int] = set()
        for face in faces:
            ranked = sorted(range(len(boxes)), key=lambda j: -iou(face, boxes[j]))
            best = next((j for j in ranked if j not in used), None)
            if best is not None and iou(face, boxes[best]) >= MATCH:
                hits += 1
                used.add(best)
            else:
                missed.append((index, face))
        false += sum(
            1
            for j, box in enumerate(boxes)
            if j not in used and max((iou(box, f) for f in faces), default=0.0) < MATCH
        )
    return hits / max(total, 1), false / max(len(truths), 1), missed

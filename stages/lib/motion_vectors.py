"""Global motion of a video from a field of motion vectors (pure; no video needed).

A frame's field is a set of block positions and forward displacements in pixels per frame
(where the content at that point moves to in the next frame). Both come from the codec's
own motion vectors (`codec_flow`) or from dense optical flow sampled on a grid.

Units: positions and displacements are divided by the frame diagonal, so a field means
the same at any resolution. Per frame, an affine fit (started from the median vector, then
least squares over the vectors within 3x the median residual, three rounds) gives the
translation at the centre `tx`, `ty`, the divergence `div` (zoom) and `explained`, the share
of the field's energy the fit accounts for. `motion_score` is the median over the analysed
frames of each frame's median vector length, in frame diagonals per second: a pan across the
whole width of a 4:3 frame in one second scores 0.8 (at the source's own frame rate).

Sign conventions. FFmpeg's AVMotionVector says where the block at `dst` in this frame was
predicted from: `src = dst + motion / motion_scale` in the reference frame, `source` < 0 for
a past reference, > 0 for a future one. Content moves from the past src to dst, so the
forward displacement is `-motion / scale`; only past vectors are used (`codec_flow`). They
span an unknown number of frames (the encoder picks among several references and does not
say which): `reference_distance` finds it. Image y grows downwards: a camera panning right
moves the content left (tx < 0); tilting up moves it down (ty > 0); zooming in spreads it
out from the centre (div > 0).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

LABELS = (
    "static",
    "pan_left",
    "pan_right",
    "tilt_up",
    "tilt_down",
    "zoom_in",
    "zoom_out",
    "shake",
    "mixed",
)
STATIC_SCORE = 0.005  # below this (diagonals a second) a clip is static
MIN_EXPLAINED = 0.5  # a field the global fit explains less of is `mixed` (objects, rotation)
DOMINANT = 2.0  # one component must be this much stronger than the others to name it
SHAKE_FLIPS = 0.3  # share of direction reversals between analysed frames that makes shake
SHAKE_DRIFT = 0.5  # ... while the mean translation is under this share of its mean length
MAX_DISTANCE = 16  # frames back a vector may reach (x264: 3 references, up to 3 B-frames apart)
QUANTUM = 0.5  # pixels: twice the quarter-pixel step of H.264 vectors
CHECK_POINTS = 4096  # pixels compared per candidate distance


class FrameMotion(NamedTuple):
    """One frame's global motion; every length in frame diagonals per frame."""

    tx: float
    ty: float
    div: float
    magnitude: float  # median vector length
    explained: float  # 0..1, share of the field's energy the affine fit accounts for
    radius: float  # mean distance of the vectors from the centre (scales div to a length)
    affine: tuple[float, ...]  # [1, x, y] @ affine.reshape(3, 2): the fitted field
    frames_apart: float = 1.0  # frames the vectors spanned (per_frame divided them by it)


def per_frame(motion: FrameMotion, frames_apart: float) -> FrameMotion:
    """A field found over `frames_apart` frames as a field per frame (smooth motion adds up)."""
    factor = 1.0 / frames_apart
    return motion._replace(
        tx=motion.tx * factor,
        ty=motion.ty * factor,
        div=motion.div * factor,
        magnitude=motion.magnitude * factor,
        affine=tuple(v * factor for v in motion.affine),
        frames_apart=frames_apart,
    )


def upright_motion(frames: list[FrameMotion], rotation: float) -> list[FrameMotion]:
    """Fits of a video stored with a display rotation (degrees counterclockwise, as PyAV's
    `frame.rotation` and video_decode.upright turn the pixels) as the video is shown: each
    quarter turn takes a displacement (dx, dy) to (dy, -dx). Zoom does not turn."""
    turns = round((rotation or 0) / 90) % 4
    out = []
    for motion in frames:
        tx, ty = motion.tx, motion.ty
        for _ in range(turns):
            tx, ty = ty, -tx
        out.append(motion._replace(tx=tx, ty=ty))
    return out


def codec_flow(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions [N, 2], forward displacement [N, 2]) in pixels from PyAV's MOTION_VECTORS
    array: the vectors into past references only, each over its own (unknown) number of
    frames; `reference_distance` finds that number."""
    past = vectors[vectors["source"] < 0]
    scale = np.maximum(past["motion_scale"].astype(np.float64), 1.0)
    motion = np.stack([past["motion_x"], past["motion_y"]], axis=1) / scale[:, None]
    positions = np.stack([past["dst_x"], past["dst_y"]], axis=1).astype(np.float64)
    return positions, -motion


def reference_distance(
    before: np.ndarray, after: np.ndarray, motion: FrameMotion, candidates: int = MAX_DISTANCE
) -> int:
    """Frames the fitted field spans. An encoder may predict from any of several past frames
    (x264 keeps 3 by default and favours the one where a slow pan lands on whole pixels), and
    the exported vectors do not say which: the k in 1..candidates whose field / k best carries
    `before` (the frame just before, grey) onto `after` (this frame, grey) at a few thousand
    points. Not optical flow: one bilinear lookup per point and candidate."""
    height, width = after.shape
    diag = float(np.hypot(width, height))
    rng = np.random.default_rng(0)
    points = rng.uniform([0, 0], [width - 1, height - 1], (CHECK_POINTS, 2))
    design = np.column_stack([np.ones(len(points)), (points - [width / 2, height / 2]) / diag])
    shift = design @ np.asarray(motion.affine).reshape(3, 2) * diag
    if float(np.abs(shift).max(initial=0.0)) < 0.25:  # under a quarter pixel: any k fits
        return 1
    target = bilinear(after.astype(np.float32), points)
    errors = [
        float(np.nanmean(np.abs(bilinear(before.astype(np.float32), points - shift / k) - target)))
        for k in range(1, candidates + 1)
    ]
    return 1 + int(np.nanargmin(errors)) if np.isfinite(errors).any() else 1


def bilinear(image: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Values at (x, y) points; NaN outside the image."""
    height, width = image.shape
    x, y = points[:, 0], points[:, 1]
    inside = (x >= 0) & (x <= width - 1) & (y >= 0) & (y <= height - 1)
    x0 = np.clip(np.floor(x).astype(int), 0, width - 2)
    y0 = np.clip(np.floor(y).astype(int), 0, height - 2)
    fx, fy = np.clip(x - x0, 0, 1), np.clip(y - y0, 0, 1)
    top = image[y0, x0] * (1 - fx) + image[y0, x0 + 1] * fx
    bottom = image[y0 + 1, x0] * (1 - fx) + image[y0 + 1, x0 + 1] * fx
    return np.where(inside, top * (1 - fy) + bottom * fy, np.nan)


def fit_frame(
    positions: np.ndarray, flow: np.ndarray, width: int, height: int
) -> FrameMotion | None:
    """The affine fit of one frame's field (pixels in); None for fewer than 3 vectors."""
    if len(positions) < 3:
        return None
    diag = float(np.hypot(width, height))
    points = (positions - [width / 2, height / 2]) / diag
    field = flow / diag
    design = np.column_stack([np.ones(len(points)), points])
    # Start from the median vector, not a least-squares fit: blocks predicted from another
    # reference frame (2x, 3x as long) or moving objects must not pull the first model.
    coef = np.zeros((3, 2))
    coef[0] = np.median(field, axis=0)
    floor = QUANTUM / diag  # vectors are quarter pixels: residuals below this are rounding
    keep = np.ones(len(points), dtype=bool)
    for _ in range(3):
        residual = np.linalg.norm(field - design @ coef, axis=1)
        inliers = residual <= max(3 * float(np.median(residual)), floor)
        if inliers.sum() < 3:
            break
        keep = inliers
        coef, *_ = np.linalg.lstsq(design[keep], field[keep], rcond=None)
    energy = float((field[keep] ** 2).sum())
    left = float(((field[keep] - design[keep] @ coef) ** 2).sum())
    explained = 1.0 if energy <= 1e-12 else max(0.0, 1.0 - left / energy)
    return FrameMotion(
        tx=float(coef[0, 0]),
        ty=float(coef[0, 1]),
        div=float(coef[1, 0] + coef[2, 1]) / 2,
        magnitude=float(np.median(np.linalg.norm(field, axis=1))),
        explained=explained,
        radius=float(np.linalg.norm(points, axis=1).mean()),
        affine=tuple(float(v) for v in coef.ravel()),
    )


def motion_score(frames: list[FrameMotion], fps: float, shake: bool = False) -> float:
    """Frame diagonals per second: the median of the frames' median vector lengths. For
    `shake`, each frame's length as found between it and its reference, not divided by the
    frames between them: jitter does not add up over frames as a pan does."""
    if not frames:
        return 0.0
    return float(np.median([f.magnitude * (f.frames_apart if shake else 1) for f in frames])) * fps


def camera_motion(frames: list[FrameMotion], fps: float) -> str:
    """One of LABELS for a clip from its frames' fits (see the module's conventions)."""
    if not frames or motion_score(frames, fps) < STATIC_SCORE:
        return "static"
    moving = [f for f in frames if f.magnitude * fps >= STATIC_SCORE] or frames
    if is_shake(moving):
        return "shake"
    if float(np.median([f.explained for f in moving])) < MIN_EXPLAINED:
        return "mixed"
    tx = float(np.mean([f.tx for f in moving]))
    ty = float(np.mean([f.ty for f in moving]))
    zoom = float(np.mean([f.div * f.radius for f in moving]))  # a length, like tx and ty
    strengths = {"x": abs(tx), "y": abs(ty), "zoom": abs(zoom)}
    axis = max(strengths, key=strengths.__getitem__)
    if any(v * DOMINANT > strengths[axis] for k, v in strengths.items() if k != axis):
        return "mixed"
    if axis == "zoom":
        return "zoom_in" if zoom > 0 else "zoom_out"
    if axis == "x":
        return "pan_right" if tx < 0 else "pan_left"  # the content moves against the camera
    return "tilt_up" if ty > 0 else "tilt_down"


def is_shake(frames: list[FrameMotion]) -> bool:
    """Translation that keeps reversing and goes nowhere on average."""
    if len(frames) < 4:
        return False
    shifts = np.array([[f.tx, f.ty] for f in frames])
    lengths = np.linalg.norm(shifts, axis=1)
    if float(lengths.mean()) < 0.5 * float(np.mean([f.magnitude for f in frames])):
        return False  # the motion is not mostly translation (a zoom, objects)
    drift = float(np.linalg.norm(shifts.mean(axis=0))) / float(lengths.mean())
    turns = (shifts[1:] * shifts[:-1]).sum(axis=1) < 0  # the direction turned by > 90 degrees
    return drift < SHAKE_DRIFT and float(turns.mean()) >= SHAKE_FLIPS

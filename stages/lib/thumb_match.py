"""Is this pair one image? Two 32x32 grey thumbnails compared after alignment.

A near-duplicate may be a crop of the other (up to 5% cut from any side), re-encoded, resized
or a little brighter. For each direction (A's window against B, B's window against A) the
window is found per axis from the 1-D profiles (column and row means): every cut of 0-5% per
side in 1% steps, the one whose resampled profile correlates best. The windowed thumbnail is
then compared with the other, both normalised to zero mean and unit variance (brightness and
contrast drop out), by mean squared difference.

`mismatch` is that difference over the image's own one-pixel-shift difference (the larger of
the two images'): 0 for the same pixels, about 1 for unrelated pictures whatever their texture.
Measured on the bench's photos (docs/benchmarks/dedupe.md, "Hybrid near_dedupe on larger
photos"): injected near-duplicates, crops included, stay at or below 0.301; distinct views of
one scene that pHash calls close start at 0.51.
"""

from __future__ import annotations

import numpy as np

SIDE = 32
CUTS = np.arange(0.0, 0.0501, 0.01)  # fractions cut from a side
CHUNK = 2048  # pairs compared at once


def resample_matrix(start: float, stop: float, n: int = SIDE) -> np.ndarray:
    """n x n linear interpolation from the window [start, stop] (fractions) onto n pixels."""
    x = np.clip(start * n + (np.arange(n) + 0.5) * (stop - start) - 0.5, 0, n - 1)
    low = np.floor(x).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    weight = x - low
    matrix = np.zeros((n, n))
    matrix[np.arange(n), low] += 1 - weight
    matrix[np.arange(n), high] += weight
    return matrix


WINDOWS = np.stack([resample_matrix(a, 1 - b) for a in CUTS for b in CUTS])  # (36, n, n)


def normalised(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    x = x - x.mean(axis=axes, keepdims=True)
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + 1e-9)


def best_window(profile: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per pair, the window index whose resampled `profile` (P, n) best matches `target`."""
    resampled = normalised(np.einsum("kij,pj->pki", WINDOWS, profile), (2,))
    return np.einsum("pki,pi->pk", resampled, normalised(target, (1,))).argmax(1)


def aligned_residual(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mean squared difference of normalised y and x's best window, per pair (P, n, n)."""
    columns = best_window(x.mean(axis=1), y.mean(axis=1))
    rows = best_window(x.mean(axis=2), y.mean(axis=2))
    windowed = WINDOWS[rows] @ x @ WINDOWS[columns].transpose(0, 2, 1)
    diff = normalised(windowed, (1, 2)) - normalised(y, (1, 2))
    return (diff * diff).mean(axis=(1, 2))


def shift_residual(x: np.ndarray) -> np.ndarray:
    """The image's own mean squared difference to itself moved by one pixel (normalised)."""
    x = normalised(x, (1, 2))
    down = ((x[:, 1:, :] - x[:, :-1, :]) ** 2).mean(axis=(1, 2))
    across = ((x[:, :, 1:] - x[:, :, :-1]) ** 2).mean(axis=(1, 2))
    return (down + across) / 2


def mismatch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair of thumbnails (P, 32, 32, any numeric type): the aligned mismatch (see above).
    Flat thumbnails (no texture to align) get infinity: never verified by their looks."""
    out = np.empty(len(a))
    for start in range(0, len(a), CHUNK):
        x = a[start : start + CHUNK].astype(np.float64)
        y = b[start : start + CHUNK].astype(np.float64)
        residual = np.minimum(aligned_residual(x, y), aligned_residual(y, x))
        scale = np.maximum(shift_residual(x), shift_residual(y))
        flat = (x.std(axis=(1, 2)) < 1.0) | (y.std(axis=(1, 2)) < 1.0)
        out[start : start + CHUNK] = np.where(flat, np.inf, residual / np.maximum(scale, 1e-9))
    return out


def thumbnails(blobs: list[bytes]) -> np.ndarray:
    """Stored thumbnail bytes -> (P, 32, 32) uint8."""
    return np.frombuffer(b"".join(blobs), np.uint8).reshape(len(blobs), SIDE, SIDE)

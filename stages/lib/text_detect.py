"""Text detection with the PP-OCRv4 DB detector (ONNX) through onnxruntime, on numpy alone.

The network ships inside the `rapidocr-onnxruntime` wheel (Apache-2.0). Its file is found with
`importlib.util.find_spec`, which never imports the package: rapidocr imports OpenCV, and its
wheel requires `opencv-python`, which would replace the project's headless OpenCV. So the
package is installed without its dependencies and only its .onnx file is read here.

Pre-processing as rapidocr's `DetPreProcess` (limit_type "min"): the short side scaled to
`short_side` (rapidocr only enlarges; here large pictures shrink too, which bounds the work per
picture), the long side capped at `max_side`, both rounded to a multiple of 32; BGR channels,
(x / 255 - 0.5) / 0.5. Pictures of one batch are padded (with the normalised 0, mid grey) to
the batch's largest size, so one `run` serves them all.

Post-processing as rapidocr's `DBPostProcess`, for axis-aligned boxes: probability > `thresh`,
a 2x2 dilation, 8-connected components (scipy.ndimage.label) instead of OpenCV contours; a box
per component from its pixel centres (as minAreaRect of a contour sees it), dropped when its
short side is under 3 or its mean probability under `box_thresh`; grown on every side by
area x unclip_ratio / perimeter (the distance pyclipper offsets the polygon by; the round
corners do not change the bounding box), then dropped when its short side is under 5.
Rotated text gets its axis-aligned box, a little larger than the rotated one.

The text's area (`Found.lines`) is measured on the same kernels grown by `area_unclip_ratio`
(1.4) instead: rapidocr's 1.6 leaves a margin of about 0.05 line heights above and below the
ink, which on a picture half covered by text adds ~0.04 to its share; word boxes on one line
are then joined across their spaces (`joined_lines`), as a line's box holds its spaces.
Measured on rendered lines over photos (tests/video/test_text_area.py).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from PIL import Image
from scipy import ndimage

DETECTOR_FILE = "models/ch_PP-OCRv4_det_infer.onnx"
PACKAGE = "rapidocr_onnxruntime"
MIN_SIZE = 3  # rapidocr's DBPostProcess.min_size (in probability-map pixels)
EIGHT = np.ones((3, 3), bool)  # OpenCV's contours follow 8-connected pixels
DILATE = np.ones((2, 2), bool)  # rapidocr's use_dilation kernel
LINE_GAP = 0.8  # word boxes closer than this many line heights are one line (text_area)


def model_file(name: str = DETECTOR_FILE) -> str:
    """The path of a model file inside the installed rapidocr package (not imported);
    FileNotFoundError with the install line when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"{PACKAGE} is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)"
        )
    path = os.path.join(os.path.dirname(spec.origin), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing from the installed {PACKAGE}")
    return path


@dataclass(frozen=True)
class DetectSettings:
    short_side: int = 736
    max_side: int = 2000
    thresh: float = 0.3
    box_thresh: float = 0.5
    unclip_ratio: float = 1.6
    area_unclip_ratio: float = 1.4
    max_candidates: int = 1000


def net_size(width: int, height: int, s: DetectSettings) -> tuple[int, int]:
    """(width, height) the picture is resized to: the short side to `short_side`, the long
    side at most `max_side`, each a multiple of 32 (at least 32)."""
    ratio = s.short_side / min(width, height)
    ratio = min(ratio, s.max_side / max(width, height))
    return tuple(max(32, int(round(v * ratio / 32)) * 32) for v in (width, height))  # type: ignore[return-value]


def net_input(picture: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """An RGB picture -> the network's CHW float32 input (BGR, scaled to -1..1)."""
    pixels = np.asarray(picture.resize(size, Image.Resampling.BILINEAR), dtype=np.float32)
    pixels = pixels[:, :, ::-1] * np.float32(2.0 / 255.0) - np.float32(1.0)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def padded_batch(inputs: list[np.ndarray]) -> np.ndarray:
    """Stack CHW inputs of different sizes, padded at the right and bottom with 0."""
    height = max(x.shape[1] for x in inputs)
    width = max(x.shape[2] for x in inputs)
    batch = np.zeros((len(inputs), 3, height, width), np.float32)
    for i, x in enumerate(inputs):
        batch[i, :, : x.shape[1], : x.shape[2]] = x
    return batch


class Found(NamedTuple):
    """One picture's text, boxes normalised to the picture as [x0, y0, x1, y1] in 0..1."""

    boxes: np.ndarray  # (n, 4): rapidocr's boxes (grown by unclip_ratio), one per component
    lines: np.ndarray  # (m, 4): the same text grown by area_unclip_ratio, words joined in lines


def kernel_boxes(prob: np.ndarray, s: DetectSettings) -> np.ndarray:
    """Axis-aligned boxes of the text kernels (connected regions over `thresh`, before the
    unclip) in probability-map pixels, kept by size and mean probability as rapidocr does."""
    mask = ndimage.binary_dilation(prob > s.thresh, structure=DILATE)
    labels, count = ndimage.label(mask, structure=EIGHT)
    if count == 0:
        return np.zeros((0, 4), np.float32)
    spans = ndimage.find_objects(labels)[: s.max_candidates]
    # pixel centres, as a contour's points are: a run of n pixels is n - 1 long
    y0 = np.array([sl[0].start for sl in spans], np.float32)
    y1 = np.array([sl[0].stop - 1 for sl in spans], np.float32)
    x0 = np.array([sl[1].start for sl in spans], np.float32)
    x1 = np.array([sl[1].stop - 1 for sl in spans], np.float32)
    kernels = np.stack([x0, y0, x1, y1], axis=1)
    keep = (np.minimum(x1 - x0, y1 - y0) >= MIN_SIZE) & (box_scores(prob, spans) >= s.box_thresh)
    keep &= np.minimum(x1 - x0, y1 - y0) + 2 * grown_by(kernels, s.unclip_ratio) >= MIN_SIZE + 2
    return kernels[keep]


def grown_by(kernels: np.ndarray, ratio: float) -> np.ndarray:
    """DB's unclip distance: area x ratio / perimeter (what pyclipper offsets the polygon by;
    the round corners do not change the bounding box)."""
    w, h = kernels[:, 2] - kernels[:, 0], kernels[:, 3] - kernels[:, 1]
    return w * h * ratio / np.maximum(2 * (w + h), 1e-6)


def unclipped(kernels: np.ndarray, ratio: float) -> np.ndarray:
    grow = grown_by(kernels, ratio)[:, None]
    return kernels + np.concatenate([-grow, -grow, grow, grow], axis=1)


def boxes_from_map(prob: np.ndarray, s: DetectSettings) -> np.ndarray:
    """Axis-aligned text boxes [x0, y0, x1, y1] in probability-map pixels (float)."""
    return unclipped(kernel_boxes(prob, s), s.unclip_ratio)


def joined_lines(boxes: np.ndarray, gap: float = LINE_GAP, shared: float = 0.6) -> np.ndarray:
    """Boxes (map pixels) of words on one line joined across the spaces between them: the
    detector may split a line at wide word spaces, and a line's box holds its spaces. Two
    boxes join when they share `shared` of the lower one's height and the space between them
    is at most `gap` of the taller one's height."""
    lines: list[np.ndarray] = []
    for box in boxes[np.argsort(boxes[:, 0], kind="stable")]:
        height = box[3] - box[1]
        for line in lines:
            tall = max(height, line[3] - line[1])
            common = min(line[3], box[3]) - max(line[1], box[1])
            if common >= shared * min(height, line[3] - line[1]) and box[0] - line[2] <= gap * tall:
                line[:] = np.minimum(line, box)[:2].tolist() + np.maximum(line, box)[2:].tolist()
                break
        else:
            lines.append(box.astype(np.float32).copy())
    return np.array(lines, np.float32).reshape(-1, 4)


def box_scores(prob: np.ndarray, spans: list) -> np.ndarray:
    """Mean probability inside each component's bounding box ("fast" score mode)."""
    return np.array([float(prob[sl].mean()) for sl in spans], np.float32)


def scale_boxes(boxes: np.ndarray, net: tuple[int, int]) -> np.ndarray:
    """Map-pixel boxes -> boxes normalised to the picture (0..1), clipped."""
    if len(boxes) == 0:
        return boxes
    # the map has the network input's size; rapidocr scales x by width / map width
    scale = np.array([1 / net[0], 1 / net[1], 1 / net[0], 1 / net[1]], np.float32)
    out = np.clip(boxes * scale, 0.0, 1.0)
    return out[(out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])]


def union_area(boxes: np.ndarray) -> float:
    """The area of the union of normalised boxes (coordinate compression: exact)."""
    if len(boxes) == 0:
        return 0.0
    xs = np.unique(boxes[:, [0, 2]])
    ys = np.unique(boxes[:, [1, 3]])
    covered = np.zeros((len(ys) - 1, len(xs) - 1), bool)
    for x0, y0, x1, y1 in boxes:
        i0, i1 = np.searchsorted(ys, [y0, y1])
        j0, j1 = np.searchsorted(xs, [x0, x1])
        covered[i0:i1, j0:j1] = True
    cells = np.outer(np.diff(ys), np.diff(xs))
    return float(min(1.0, cells[covered].sum()))


class TextDetector:
    """The ONNX detector: `detect(pictures)` -> normalised boxes per picture, run in batches."""

    def __init__(
        self,
        settings: DetectSettings,
        threads: int = 1,
        batch_size: int = 8,
        device: str = "cpu",
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime's own choice (all cores)
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        if device != "cpu" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")  # a GPU actor (onnxruntime-gpu)
        self.session = ort.InferenceSession(model_file(), options, providers=providers)
        self.input = self.session.get_inputs()[0].name
        self.settings = settings
        self.batch_size = batch_size

    @classmethod
    def on(
        cls, device: str, settings: DetectSettings, threads: int, batch_size: int
    ) -> TextDetector:
        """A pool actor's detector (ModelActor's `loader`, given its device)."""
        return cls(settings, threads, batch_size, device)

    def detect(self, pictures: list[Image.Image]) -> list[Found]:
        """RGB pictures -> for each, its boxes and lines (`Found`, float32, 0..1).
        Pictures are batched by size (largest first), so padding stays small."""
        sizes = [net_size(p.width, p.height, self.settings) for p in pictures]
        order = sorted(range(len(pictures)), key=lambda i: sizes[i][0] * sizes[i][1])
        empty = np.zeros((0, 4), np.float32)
        found: list[Found] = [Found(empty, empty)] * len(pictures)
        for at in range(0, len(order), self.batch_size):
            rows = order[at : at + self.batch_size]
            batch = padded_batch([net_input(pictures[i], sizes[i]) for i in rows])
            probs = self.session.run(None, {self.input: batch})[0][:, 0]
            for i, prob in zip(rows, probs, strict=True):
                width, height = sizes[i]
                kernels = kernel_boxes(prob[:height, :width], self.settings)
                boxes = unclipped(kernels, self.settings.unclip_ratio)
                lines = joined_lines(unclipped(kernels, self.settings.area_unclip_ratio))
                found[i] = Found(*(scale_boxes(b, (width, height)) for b in (boxes, lines)))
        return found

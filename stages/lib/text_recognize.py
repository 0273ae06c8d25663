"""Text recognition with the PP-OCRv4 recogniser (ONNX, CTC) through onnxruntime, on numpy alone.

The network ships in the same `rapidocr-onnxruntime` wheel as the detector
(models/ch_PP-OCRv4_rec_infer.onnx); its character list (6,623 entries: Chinese, Latin, digits,
punctuation) is stored in the model file's own metadata under `character`. Output classes are
0 = CTC blank, 1..N = that list, N + 1 = space.

Each detected box is cropped from the picture (the box is axis-aligned, so the crop is the
box; a box at least 1.5 times as tall as wide is vertical text and is turned a quarter turn,
as rapidocr's rotated crop does), scaled to 48 pixels high keeping its aspect, BGR,
(x / 255 - 0.5) / 0.5, and padded on the right (zeros) to the widest crop of its batch, at least
320 wide. Crops are batched by aspect ratio so the padding stays small. Decoding is CTC greedy:
the most likely class at each step, repeats merged, blanks removed; a line's score is the mean
probability of its kept characters.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from mmcurate.stages.lib.text_detect import model_file
from PIL import Image

RECOGNIZER_FILE = "models/ch_PP-OCRv4_rec_infer.onnx"
HEIGHT = 48  # the network's input height
MIN_WIDTH = 320  # rapidocr's rec_img_shape width: narrower batches are padded to it
MAX_RATIO = 40.0  # a crop wider than 40 x its height is squeezed (bounds one run's width)
VERTICAL = 1.5  # height / width from which a box is vertical text


class Line(NamedTuple):
    text: str
    score: float


def characters(session: Any) -> list[str]:
    """Class index -> character: blank, the model's own list, space."""
    listed = session.get_modelmeta().custom_metadata_map["character"].splitlines()
    return ["", *listed, " "]


def crop(picture: Image.Image, box: np.ndarray) -> Image.Image:
    """The box (normalised [x0, y0, x1, y1]) cut from the picture, vertical text turned."""
    width, height = picture.size
    x0, x1 = (int(round(float(v) * width)) for v in (box[0], box[2]))
    y0, y1 = (int(round(float(v) * height)) for v in (box[1], box[3]))
    piece = picture.crop((x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)))
    if piece.height >= VERTICAL * piece.width:
        piece = piece.transpose(Image.Transpose.ROTATE_90)
    return piece


def net_batch(crops: list[Image.Image]) -> np.ndarray:
    """Crops -> one (n, 3, 48, W) float32 batch, each scaled to 48 high, padded right."""
    ratios = [min(c.width / c.height, MAX_RATIO) for c in crops]
    width = max(MIN_WIDTH, int(HEIGHT * max(ratios)))
    batch = np.zeros((len(crops), 3, HEIGHT, width), np.float32)
    for i, (piece, ratio) in enumerate(zip(crops, ratios, strict=True)):
        scaled = min(width, max(1, math.ceil(HEIGHT * ratio)))
        pixels = np.asarray(
            piece.convert("RGB").resize((scaled, HEIGHT), Image.Resampling.BILINEAR), np.float32
        )
        batch[i, :, :, :scaled] = (pixels[:, :, ::-1] * np.float32(2 / 255) - 1).transpose(2, 0, 1)
    return batch


def greedy_decode(probs: np.ndarray, table: list[str]) -> list[Line]:
    """CTC greedy decoding of (n, steps, classes) probabilities."""
    best, chance = probs.argmax(axis=2), probs.max(axis=2)
    lines = []
    for classes, scores in zip(best, chance, strict=True):
        keep = classes != 0
        keep[1:] &= classes[1:] != classes[:-1]  # a repeat is one character
        text = "".join(table[c] for c in classes[keep] if c < len(table))
        lines.append(Line(text, float(scores[keep].mean()) if keep.any() else 0.0))
    return lines


class TextRecognizer:
    """The ONNX recogniser: `recognize(crops)` -> a Line per crop, run in batches."""

    def __init__(self, threads: int = 1, batch_size: int = 6) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            model_file(RECOGNIZER_FILE), options, providers=["CPUExecutionProvider"]
        )
        self.input = self.session.get_inputs()[0].name
        self.table = characters(self.session)
        self.batch_size = batch_size

    def recognize(self, crops: list[Image.Image]) -> list[Line]:
        order = sorted(range(len(crops)), key=lambda i: crops[i].width / crops[i].height)
        found: list[Line] = [Line("", 0.0)] * len(crops)
        for at in range(0, len(order), self.batch_size):
            rows = order[at : at + self.batch_size]
            probs = self.session.run(None, {self.input: net_batch([crops[i] for i in rows])})[0]
            for i, line in zip(rows, greedy_decode(probs, self.table), strict=True):
                found[i] = line
        return found


def reading_order(boxes: np.ndarray) -> list[int]:
    """Box indices top to bottom, and left to right within a line (a box whose centre lies
    within the vertical span of the line's first box belongs to that line)."""
    rows: list[list[int]] = []
    for i in np.argsort(boxes[:, 1], kind="stable"):
        centre = (boxes[i, 1] + boxes[i, 3]) / 2
        if rows and boxes[rows[-1][0], 1] <= centre <= boxes[rows[-1][0], 3]:
            rows[-1].append(int(i))
        else:
            rows.append([int(i)])
    return [i for row in rows for i in sorted(row, key=lambda k: boxes[k, 0])]

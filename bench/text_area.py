"""text_area bench: our numpy pre/post-processing around the PP-OCRv4 detector against rapidocr's
own detection-only call (`rapidocr_onnxruntime.ch_ppocr_det.TextDetector`), on the test's
pictures (real photos with rendered text of known extent, some 0.3-0.8 covered by text, and
textures without text). Columns: `area` is text_area (lines, area_unclip_ratio), `boxes` the
union of the stored boxes (rapidocr's unclip_ratio), compared box by box with rapidocr's.

rapidocr needs OpenCV, pyclipper and shapely, which the project does not install (its wheel
requires opencv-python, which would replace the headless OpenCV), so the reference runs in
another Python given by `--ref-python` (a venv with rapidocr-onnxruntime, opencv-python-headless,
pyclipper, shapely, onnxruntime); without it only our side runs. Both sides: one onnxruntime
thread, one picture per run, timed around the detector call alone (CPU seconds of the process).

    .venv/bin/python bench/text_area.py [--ref-python /tmp/ta_ref/bin/python] [--repeat 3]
    .venv/bin/python bench/text_area.py --recognize --ref-python /tmp/ta_ref/bin/python

`--recognize`: detection + recognition as `text_area` with `recognize: true` runs it (boxes
in reading order, crops, PP-OCRv4 recogniser, CTC greedy) against rapidocr's own full call
(`RapidOCR()(picture)`: detection, angle classifier, recognition), one thread each, on real
photos with rendered lines (tests/video/test_text_area.py: rendered_lines, text_cases). Same text:
the lines' texts of a picture (spaces removed) as multisets; CPU seconds of the whole call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mmcurate.stages.lib.text_detect import (  # noqa: E402
    DetectSettings,
    Found,
    TextDetector,
    union_area,
)
from test_text_area import dense_text, rendered_lines, text_cases, textures  # noqa: E402

REFERENCE = r"""
import json, sys, time
import numpy as np
from PIL import Image
from rapidocr_onnxruntime.ch_ppocr_det import TextDetector
import rapidocr_onnxruntime, os, yaml
root = os.path.dirname(rapidocr_onnxruntime.__file__)
config = yaml.safe_load(open(os.path.join(root, "config.yaml")))["Det"]
config.update(model_path=os.path.join(root, config["model_path"]), intra_op_num_threads=1,
              inter_op_num_threads=1)
det = TextDetector(config)
paths, repeat = json.loads(sys.argv[1]), int(sys.argv[2])
out, cpu = [], 0.0
for path in paths:
    bgr = np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[:, :, ::-1])
    h, w = bgr.shape[:2]
    for _ in range(repeat):
        start = time.process_time()
        boxes, _ = det(bgr)
        cpu += time.process_time() - start
    quads = [] if boxes is None or len(boxes) == 0 else np.asarray(boxes, float)
    out.append([[q[:, 0].min() / w, q[:, 1].min() / h, q[:, 0].max() / w, q[:, 1].max() / h]
                for q in quads])
print(json.dumps({"boxes": out, "cpu_s": cpu / repeat}))
"""


REFERENCE_OCR = r"""
import json, sys, time
import numpy as np
from PIL import Image
from rapidocr_onnxruntime import RapidOCR
engine = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
paths, repeat = json.loads(sys.argv[1]), int(sys.argv[2])
engine(np.zeros((64, 64, 3), np.uint8) + 255)  # warm-up, as ours
out, cpu = [], 0.0
for path in paths:
    bgr = np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB"))[:, :, ::-1])
    for _ in range(repeat):
        start = time.process_time()
        result, _ = engine(bgr)
        cpu += time.process_time() - start
    out.append([text for _, text, _ in result or []])
print(json.dumps({"texts": out, "cpu_s": cpu / repeat}))
"""


def ocr_pictures() -> list[Image.Image]:
    return [rendered_lines(seed)[0] for seed in range(6)] + [c[1] for c in text_cases()]


def ours_ocr(images: list[Image.Image], repeat: int) -> tuple[list[list[str]], float]:
    """As the stage reads: boxes in reading order, cropped, recognised, score >= 0.5 kept."""
    from mmcurate.stages.lib.text_recognize import TextRecognizer, crop, reading_order

    detector = TextDetector(DetectSettings(), threads=1, batch_size=1)
    recognizer = TextRecognizer(threads=1)

    def read(image: Image.Image) -> list[str]:
        boxes = detector.detect([image])[0].boxes
        boxes = boxes[reading_order(boxes)] if len(boxes) else boxes
        lines = recognizer.recognize([crop(image, box) for box in boxes])
        return [line.text for line in lines if line.text.strip() and line.score >= 0.5]

    read(Image.new("RGB", (64, 64), "white"))  # warm-up, as the reference's
    texts, cpu = [], 0.0
    for image in images:
        for _ in range(repeat):
            start = time.process_time()
            found = read(image)
            cpu += time.process_time() - start
        texts.append(found)
    return texts, cpu / repeat


def run_reference(python: str, script: str, images: list[Image.Image], repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i, image in enumerate(images):
            paths.append(f"{folder}/{i}.png")
            image.save(paths[-1])
        done = subprocess.run(
            [python, "-c", script, json.dumps(paths), str(repeat)],
            check=True,
            capture_output=True,
            text=True,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_ocr(python: str, repeat: int) -> None:
    images = ocr_pictures()
    ours, cpu = ours_ocr(images, repeat)
    ref = run_reference(python, REFERENCE_OCR, images, repeat)
    same_pictures, shared, counts = 0, 0, [0, 0]
    for mine, theirs in zip(ours, ref["texts"], strict=True):
        a = sorted(t.replace(" ", "") for t in mine)
        b = sorted(t.replace(" ", "") for t in theirs)
        same_pictures += a == b
        shared += sum(min(a.count(t), b.count(t)) for t in set(a))
        counts[0] += len(a)
        counts[1] += len(b)
        if a != b:
            print(f"differs: ours {mine} rapidocr {theirs}")
    print(f"pictures with the same text: {same_pictures} of {len(images)}")
    print(f"lines: ours {counts[0]}, rapidocr {counts[1]}, the same text {shared}")
    print(f"ours: {cpu:.2f} CPU s ({cpu / len(images) * 1000:.0f} ms a picture)")
    print(f"rapidocr: {ref['cpu_s']:.2f} CPU s ({ref['cpu_s'] / len(images) * 1000:.0f} ms)")
    print(f"speed-up {ref['cpu_s'] / cpu:.2f}x")


def pictures() -> list[tuple[str, Image.Image, float | None]]:
    cases = [(name, image, truth) for name, image, truth in text_cases()]
    cases += [(f"dense-{seed}", *dense_text(seed)) for seed in range(12)]
    cases += [(name, Image.fromarray(p).convert("RGB"), 0.0) for name, p in textures().items()]
    return cases


def ours(images: list[Image.Image], repeat: int) -> tuple[list[Found], float]:
    detector = TextDetector(DetectSettings(), threads=1, batch_size=1)
    detector.detect(images[:1])  # warm-up, as the reference's first call is not timed either
    found, cpu = [], 0.0
    for image in images:
        for _ in range(repeat):
            start = time.process_time()
            text = detector.detect([image])[0]
            cpu += time.process_time() - start
        found.append(text)
    return found, cpu / repeat


def reference(python: str, images: list[Image.Image], repeat: int) -> tuple[list, float]:
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i, image in enumerate(images):
            paths.append(f"{folder}/{i}.png")
            image.save(paths[-1])
        done = subprocess.run(
            [python, "-c", REFERENCE, json.dumps(paths), str(repeat)],
            check=True,
            capture_output=True,
            text=True,
        )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return [np.array(b, np.float32).reshape(-1, 4) for b in result["boxes"]], result["cpu_s"]


def matched(a: np.ndarray, b: np.ndarray, iou: float = 0.5) -> tuple[int, int, int]:
    """(pairs with IoU >= iou, boxes in a, boxes in b), greedy by IoU."""
    pairs, used = 0, set()
    for box in a:
        best, at = 0.0, -1
        for j, other in enumerate(b):
            if j in used:
                continue
            w = min(box[2], other[2]) - max(box[0], other[0])
            h = min(box[3], other[3]) - max(box[1], other[1])
            inter = max(w, 0) * max(h, 0)
            union = (box[2] - box[0]) * (box[3] - box[1]) + (other[2] - other[0]) * (
                other[3] - other[1]
            )
            value = inter / max(union - inter, 1e-9)
            if value > best:
                best, at = value, j
        if best >= iou:
            pairs += 1
            used.add(at)
    return pairs, len(a), len(b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref-python")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--recognize", action="store_true", help="against RapidOCR()(picture)")
    args = parser.parse_args()
    if args.recognize:
        if not args.ref_python:
            parser.error("--recognize needs --ref-python")
        compare_ocr(args.ref_python, args.repeat)
        return
    cases = pictures()
    images = [image for _, image, _ in cases]
    found, cpu = ours(images, args.repeat)
    theirs, ref_cpu = (
        reference(args.ref_python, images, args.repeat) if args.ref_python else ([], 0)
    )
    print(
        f"{'picture':32} {'truth':>6} {'area':>6} {'boxes':>6} {'rapidocr':>8}"
        " boxes matched (IoU>=0.5)"
    )
    totals, close = np.zeros(3, int), 0
    for k, (name, _, truth) in enumerate(cases):
        area, boxes = union_area(found[k].lines), found[k].boxes
        close += abs(area - truth) <= 0.05
        line = f"{name:32} {truth:6.3f} {area:6.3f} {union_area(boxes):6.3f}"
        if theirs:
            m = matched(boxes, theirs[k])
            totals += m
            line += f" {union_area(theirs[k]):8.3f} {m[0]}/{m[1]} ours, {m[2]} theirs"
        print(line)
    print(f"text_area within 0.05 of the truth: {close} of {len(cases)}")
    print(
        f"ours: {cpu:.2f} CPU s for {len(images)} pictures ({cpu / len(images) * 1000:.0f} ms each)"
    )
    if theirs:
        print(f"rapidocr: {ref_cpu:.2f} CPU s ({ref_cpu / len(images) * 1000:.0f} ms each)")
        print(
            f"speed-up {ref_cpu / cpu:.2f}x; boxes matched {totals[0]} of {totals[1]} / {totals[2]}"
        )


if __name__ == "__main__":
    main()

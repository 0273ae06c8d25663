"""text_area bench: our numpy pre/post-processing around the PP-OCRv4 detector against rapidocr's
own detection-only call (`rapidocr_onnxruntime.ch_ppocr_det.TextDetector`), on the test's
pictures (real photos with rendered text of known extent, and textures without text).

rapidocr needs OpenCV, pyclipper and shapely, which the project does not install (its wheel
requires opencv-python, which would replace the headless OpenCV), so the reference runs in
another Python given by `--ref-python` (a venv with rapidocr-onnxruntime, opencv-python-headless,
pyclipper, shapely, onnxruntime); without it only our side runs. Both sides: one onnxruntime
thread, one picture per run, timed around the detector call alone (CPU seconds of the process).

    .venv/bin/python bench/text_area.py [--ref-python /tmp/ta_ref/bin/python] [--repeat 3]
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
from mmcurate.stages.lib.text_detect import DetectSettings, TextDetector, union_area  # noqa: E402
from test_text_area import text_cases, textures  # noqa: E402

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


def pictures() -> list[tuple[str, Image.Image, float | None]]:
    cases = [(name, image, truth) for name, image, truth in text_cases()]
    cases += [(name, Image.fromarray(p).convert("RGB"), 0.0) for name, p in textures().items()]
    return cases


def ours(images: list[Image.Image], repeat: int) -> tuple[list[np.ndarray], float]:
    detector = TextDetector(DetectSettings(), threads=1, batch_size=1)
    detector.detect(images[:1])  # warm-up, as the reference's first call is not timed either
    found, cpu = [], 0.0
    for image in images:
        for _ in range(repeat):
            start = time.process_time()
            boxes = detector.detect([image])[0]
            cpu += time.process_time() - start
        found.append(boxes)
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
    args = parser.parse_args()
    cases = pictures()
    images = [image for _, image, _ in cases]
    found, cpu = ours(images, args.repeat)
    theirs, ref_cpu = (
        reference(args.ref_python, images, args.repeat) if args.ref_python else ([], 0)
    )
    print(f"{'picture':32} {'truth':>6} {'ours':>6} {'rapidocr':>8} boxes matched (IoU>=0.5)")
    totals = np.zeros(3, int)
    for k, (name, _, truth) in enumerate(cases):
        line = f"{name:32} {truth:6.3f} {union_area(found[k]):6.3f}"
        if theirs:
            m = matched(found[k], theirs[k])
            totals += m
            line += f" {union_area(theirs[k]):8.3f} {m[0]}/{m[1]} ours, {m[2]} theirs"
        print(line)
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

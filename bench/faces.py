"""face_blur's detector against a plain detector loop on the same composited real faces.

The set (tests/stages/test_face_blur.py): crops of scikit-image's faceless photos and textures, long
side 400-900 px, with 0-3 real faces each (the astronaut, mirrored, and 100 LFW faces) pasted
at several sizes, tilts up to 10 degrees and lighting 0.6-1.3x. Both sides see the same
decoded grey pictures, one OpenCV thread each:
- plain: `CascadeClassifier(frontalface_default).detectMultiScale(grey)` per picture, OpenCV's
  defaults (scale 1.1, 3 neighbours, the whole picture) — the loop the stage replaces;
- plain alt2: the same loop with `frontalface_alt2`;
- face_blur: stages/lib/faces.py with the stage's defaults.
Recall and false boxes against the composited truth (IoU >= 0.3), pictures without a true face
that got a box, seconds per picture and the stage's speed against the plain loop.

    .venv/bin/python bench/faces.py [--pictures 120] [--out /tmp/h/bench-h4.md]
"""

from __future__ import annotations

import argparse
import io
import platform
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmcurate.stages.lib.faces import (  # noqa: E402
    DETECTOR_NAME,
    DetectSettings,
    FaceDetector,
    cascade,
    detector_version,
)

from tests.kit_faces import face_set, score  # noqa: E402


def plain_loop(name: str):
    classifier = cascade(name)

    def detect(grey: np.ndarray) -> list:
        found = classifier.detectMultiScale(grey)
        return [(x, y, x + w, y + h) for x, y, w, h in (found if len(found) else [])]

    return detect


def ours():
    detector = FaceDetector(DetectSettings())
    return lambda grey: [tuple(box) for box in detector.detect(grey)]


def measure(detect, greys: list[np.ndarray], truths: list[list]) -> dict:
    started = time.perf_counter()
    found = [detect(grey) for grey in greys]
    seconds = time.perf_counter() - started
    recall, false, _ = score(truths, found)
    touched = sum(1 for faces, boxes in zip(truths, found, strict=True) if not faces and boxes)
    return {"recall": recall, "false": false, "touched": touched, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pictures", type=int, default=120)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="/tmp/h/bench-h4.md")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    pictures = face_set(args.pictures, seed=args.seed, long_side=(400, 900))
    greys, truths = [], []
    for rgb, faces in pictures:  # as stored: JPEG, decoded again
        out = io.BytesIO()
        Image.fromarray(rgb).save(out, "JPEG", quality=92)
        decoded = np.asarray(Image.open(io.BytesIO(out.getvalue())).convert("L"))
        greys.append(decoded)
        truths.append(faces)
    runs = {
        "plain loop, frontalface_default (OpenCV defaults)": plain_loop(
            "haarcascade_frontalface_default.xml"
        ),
        "plain loop, frontalface_alt2 (OpenCV defaults)": plain_loop(
            "haarcascade_frontalface_alt2.xml"
        ),
        f"face_blur detector ({DETECTOR_NAME})": ours(),
    }
    results = {name: measure(detect, greys, truths) for name, detect in runs.items()}
    write_report(args, results, truths)


def write_report(args: argparse.Namespace, results: dict, truths: list[list]) -> None:
    names = list(results)
    base, mine = results[names[0]], results[names[-1]]
    faces = sum(len(t) for t in truths)
    faceless = sum(1 for t in truths if not t)
    lines = [
        "## face_blur: detection against a plain cascade loop (issue 49, item 1)",
        "",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, OpenCV "
        f"{detector_version()} with 1 thread, shared 2-core host (other jobs running: "
        "absolute times are noisy, the ratio is measured in the same run).",
        f"Command: `.venv/bin/python bench/faces.py --pictures {args.pictures} --seed {args.seed}`",
        f"Set: {len(truths)} pictures (long side 400-900 px, JPEG q92), {faces} composited "
        f"real faces, {faceless} pictures without one.",
        "",
        "| detector | recall | false boxes / picture | faceless pictures given a box "
        "| ms / picture |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        ms = 1000 * r["seconds"] / len(truths)
        lines.append(
            f"| {name} | {r['recall']:.3f} | {r['false']:.3f} | {r['touched']} / {faceless} "
            f"| {ms:.1f} |"
        )
    ratio = base["seconds"] / max(mine["seconds"], 1e-9)
    lines += ["", f"Speed of face_blur's detector against the plain loop: {ratio:.2f}x.", ""]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

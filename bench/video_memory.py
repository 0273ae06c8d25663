"""Peak memory of a video-generation build over one big video (issue 47): a fresh
`python -m mmcurate build` running clip_split, motion_score, text_area and video_frames on an
H.264 file of about GIB gibibytes (high bitrate: pans over real photos with film grain, three
shots joined by hard cuts, lossless). Prints, as JSON, the peak PSS of the build's process tree
(driver, local pool or Ray workers, decoder children) and of its largest single process; compare
with docs/scale.md ("Videos"). Run it at two sizes: a bounded build peaks the same at both.

    .venv/bin/python bench/video_memory.py --gib 1.0 [--mode scenes|transnetv2] [--keep DIR]

`--keep DIR` keeps the video there (and reuses one of the same size), as encoding it takes a
minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.memwatch import pss_bytes, tree  # noqa: E402

MiB = 1 << 20
WIDTH, HEIGHT, FPS = 1280, 720, 25
PHOTOS = ("astronaut", "coffee", "chelsea")


def shot_frames(name: str, count: int, seed: int):
    """`count` frames panning right over an enlarged photo, with film grain (so the lossless
    encoding keeps ~0.8 MB a frame)."""
    import skimage.data
    from PIL import Image

    photo = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
    photo = np.asarray(photo.resize((HEIGHT * 2 * photo.width // photo.height, HEIGHT * 2)))
    rng = np.random.default_rng(seed)
    grain = [rng.integers(-10, 11, (HEIGHT, WIDTH, 3), dtype=np.int16) for _ in range(8)]
    span = photo.shape[1] - WIDTH
    for i in range(count):
        x = int(span * i / max(count - 1, 1))
        crop = photo[HEIGHT // 2 : HEIGHT // 2 + HEIGHT, x : x + WIDTH].astype(np.int16)
        yield np.clip(crop + grain[i % len(grain)], 0, 255).astype(np.uint8)


def make_video(path: Path, gib: float) -> None:
    import av

    frames = max(30, int(gib * (1 << 30) / 0.8e6))  # ~0.8 MB a lossless grainy 720p frame
    with av.open(str(path), "w") as box:
        stream = box.add_stream("libx264", rate=Fraction(FPS))
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"preset": "ultrafast", "qp": "0"}
        per_shot = frames // len(PHOTOS)
        for k, name in enumerate(PHOTOS):
            for pixels in shot_frames(name, per_shot, k):
                for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)


def duration_s(path: Path) -> float:
    import av

    with av.open(str(path)) as box:
        return float(box.duration or 0) / 1e6


def command(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode(errors="replace") for w in words[:4])[:100]


class PeakWatch:
    """Largest PSS of a process tree (rooted at `pid`), and of one process in it."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval, self.tree, self.one = pid, interval, 0, 0
        self.by_name: dict[str, int] = {}  # largest PSS of each kind of process
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while not self.stop.is_set():
            pids = tree(self.pid)
            sizes = [pss_bytes(p) for p in pids]
            self.tree, self.one = max(self.tree, sum(sizes)), max(self.one, max(sizes))
            for pid, size in zip(pids, sizes, strict=True):
                name = command(pid)
                self.by_name[name] = max(self.by_name.get(name, 0), size)
            self.stop.wait(self.interval)

    def done(self) -> None:
        self.stop.set()
        self.thread.join()


STAGES = ("clip_split", "motion_score", "text_area", "video_frames")


def config(folder: Path, out: Path, mode: str, num_cpus: int, names: list[str]) -> dict:
    stages = {
        "clip_split": {"mode": mode, "min_clip_s": 1.0, "timeout_s": 3600},
        "motion_score": {"timeout_s": 3600},
        "text_area": {"timeout_s": 600},
        "video_frames": {"num_frames": 8, "size": 256, "timeout_s": 3600},
    }
    return {
        "source": {"kind": "videos", "path": str(folder), "files_per_task": 1},
        "stages": [{"name": name, **stages[name]} for name in names],
        "output": {"path": str(out)},
        "ray": {"runtime": "local", "num_cpus": num_cpus},
    }


def main() -> None:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--mode", default="scenes", choices=["scenes", "transnetv2"])
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="folder to keep (and reuse) the video in")
    ap.add_argument("--stages", default=",".join(STAGES), help="a subset, in this order")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="video-memory-") as tmp:
        root = Path(tmp)
        videos = args.keep / f"gib-{args.gib:g}" if args.keep else root / "videos"
        videos.mkdir(parents=True, exist_ok=True)
        video = videos / "big.mp4"
        started = time.perf_counter()
        if not video.exists():
            make_video(video, args.gib)
        encode_s = time.perf_counter() - started
        (root / "build.yaml").write_text(
            yaml.safe_dump(
                config(videos, root / "out", args.mode, args.num_cpus, args.stages.split(","))
            )
        )
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        started = time.perf_counter()
        build = subprocess.Popen(
            [sys.executable, "-m", "mmcurate", "build", str(root / "build.yaml"), "--no-progress"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        peak = PeakWatch(build.pid)
        _, err = build.communicate()
        peak.done()
        if build.returncode != 0:
            raise SystemExit(err.decode()[-3000:])
        stats = json.loads((root / "out" / "stats.json").read_text())
        result = {
            "video_mib": round(video.stat().st_size / MiB),
            "video_s": round(duration_s(video), 1),
            "mode": args.mode,
            "encode_s": round(encode_s, 1),
            "build_s": round(time.perf_counter() - started, 1),
            "samples": json.loads((root / "out" / "manifest.json").read_text())["samples"],
            "tree_peak_mib": round(peak.tree / MiB),
            "largest_process_peak_mib": round(peak.one / MiB),
            "peak_mib_by_process": {k: round(v / MiB) for k, v in peak.by_name.items()},
            "stages": [
                {k: s[k] for k in ("name", "in", "out", "dropped")} for s in stats["stages"]
            ],
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Bench: `images` folder -> decode/resize/re-encode -> shards, against a plain process pool.

The reference is the simplest fast thing a user could write instead: a multiprocessing pool with
one process per core doing the same image work (draft decode, EXIF transpose, RGB, resize to 256
px shorter side, JPEG q95, through `decode_image`'s own functions, its SIMD resize included) and
writing tars. It is close to the per-image work's physical limit on
this machine, so the ratio says what Ray, planning, signatures and the two-phase write cost.

Both sides are timed as whole processes, start to exit: `python -c <pool script>` against the
`mmcurate build` command (interpreter, imports, runtime start and shutdown included), once per
`ray.runtime` asked for (`auto` is the local pool on one machine, `ray` a fresh local Ray).

    .venv/bin/python bench/build_images.py [--n 3000] [--out /tmp/mmcurate-bench]
        [--runtimes auto,ray]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from multiprocessing import Pool
from pathlib import Path

from bytecode import compile_all
from mmcurate.stages.decode_image import DecodeImageOptions, target_size, transform
from mmcurate.stages.lib.pixels import encode
from photos import make_photos
from PIL import Image

OPTS = DecodeImageOptions.model_validate({"resize": {"size": 256, "mode": "keep_ratio"}})


def reference_chunk(args: tuple[list[str], str]) -> int:
    """One pool task: the same decode/resize/encode, written as one tar."""
    paths, tar_path = args
    with tarfile.open(tar_path, "w") as tar:
        for path in paths:
            image = Image.open(path)
            image.draft("RGB", target_size(image.width, image.height, OPTS.resize))
            data = encode(transform(image, OPTS.resize), "jpg", OPTS.quality)
            caption = Path(path).with_suffix(".txt").read_bytes()
            for ext, blob in (("jpg", data), ("txt", caption)):
                info = tarfile.TarInfo(f"{Path(path).stem}.{ext}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    return len(paths)


def run_reference(folder: Path, out: Path, processes: int, chunk: int = 256) -> float:
    out.mkdir(parents=True, exist_ok=True)
    paths = sorted(str(p) for p in folder.glob("*.jpg"))
    jobs = [(paths[i : i + chunk], str(out / f"{i:08d}.tar")) for i in range(0, len(paths), chunk)]
    started = time.perf_counter()
    with Pool(processes) as pool:
        done = sum(pool.imap_unordered(reference_chunk, jobs))
    elapsed = time.perf_counter() - started
    assert done == len(paths)
    return elapsed


REFERENCE = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from build_images import run_reference
run_reference(Path(sys.argv[1]), Path(sys.argv[2]), os.cpu_count() or 1)
"""


def whole(cmd: list[str], env: dict | None = None) -> float:
    """Wall seconds of a command from start to exit (its imports, start-up and shutdown)."""
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {done.stderr[-2000:]}")
    return elapsed


def reference_command(folder: Path, out: Path) -> float:
    """The bare pool as a whole process: `python -c <pool script>`."""
    shutil.rmtree(out, ignore_errors=True)
    script = REFERENCE.format(bench=str(Path(__file__).resolve().parent))
    return whole([sys.executable, "-c", script, str(folder), str(out)])


def mmcurate_command(folder: Path, out: Path, runtime: str) -> tuple[float, dict]:
    """`mmcurate build` as a user types it, start to exit; returns its stats.json too."""
    from mmcurate.pipeline.runtime.loopback import loopback_only_env

    config = out.parent / f"build-{runtime}.yaml"
    config.write_text(
        json.dumps(
            {
                "source": {"kind": "images", "path": str(folder), "files_per_task": 256},
                "stages": [{"name": "decode_image", "resize": {"size": 256, "mode": "keep_ratio"}}],
                "output": {"path": str(out), "overwrite": True},
                "ray": {"runtime": runtime},
            }
        )
    )
    env = {**os.environ, **loopback_only_env()}  # Ray (if used) on 127.0.0.1 only
    mmcurate = str(Path(sys.executable).parent / "mmcurate")
    elapsed = whole([mmcurate, "build", str(config), "--no-progress"], env)
    return elapsed, json.loads((out / "stats.json").read_text())


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--out", default="/tmp/mmcurate-bench")
    parser.add_argument(
        "--runtimes", default="auto,ray", help="ray.runtime values to time, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=1, help="reference then each runtime, again")
    args = parser.parse_args()
    compile_all()
    root = Path(args.out)
    folder = root / "in"
    if len(list(folder.glob("*.jpg"))) != args.n:  # the photos are reused when they match
        shutil.rmtree(root, ignore_errors=True)
        make_photos(folder, args.n)
    input_bytes = sum(p.stat().st_size for p in folder.glob("*.jpg"))
    rounds = [one_round(folder, root, args) for _ in range(args.rounds)]
    print(
        json.dumps(
            {
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                "images": args.n,
                "input_mb": round(input_bytes / 1e6, 1),
                "rounds": rounds,
            },
            indent=2,
        )
    )


def one_round(folder: Path, root: Path, args: argparse.Namespace) -> dict:
    """The reference, then `mmcurate build` once per runtime; ratios within the round."""
    load_before = loadavg()
    ref_s = reference_command(folder, root / "ref")
    runs = {}
    for runtime in args.runtimes.split(","):
        seconds, stats = mmcurate_command(folder, root / f"mm-{runtime}", runtime)
        assert stats["samples_out"] == args.n, stats
        runs[runtime] = {
            "whole_command_s": round(seconds, 2),
            "img_s": round(args.n / seconds, 1),
            "ratio_over_reference": round(ref_s / seconds, 3),
            "phases_s": stats["phases"],
        }
    result = {
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "reference_pool_whole_process_s": round(ref_s, 2),
        "reference_pool_img_s": round(args.n / ref_s, 1),
        "mmcurate": runs,
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()

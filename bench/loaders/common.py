"""Shared contract for the competitor loader runners (bench/loaders/run_*.py).

Stdlib + torch + open_clip only, so both bench/.venv-openclip and bench/.venv-loaders import it.
Each runner: same CLI, same open_clip transform + tokenizer, same timing, one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE.parent / ".venv-loaders"
OPENCLIP_VENV = HERE.parent / ".venv-openclip"

# torch is capped on these machines; the competitors' own requirements are left to pip.
LOADER_PACKAGES = [
    "torch==2.14.1",
    "torchvision==0.29.1",
    "open_clip_torch",
    "webdataset>=1,<2",
    "mosaicml-streaming==0.13.0",
    "litdata==0.2.76",
    "pillow",
    "braceexpand",
    "s3fs",
    "boto3",
]


def ensure_venv() -> Path:
    """bench/.venv-loaders (webdataset 1.x, MosaicML Streaming, LitData); made on first use."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, *LOADER_PACKAGES], check=True)
    return python


def parse_args(name: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"loader benchmark runner: {name}")
    parser.add_argument("--shards", required=True, help="folder of WebDataset .tar shards")
    parser.add_argument("--work", required=True, help="scratch folder for converted formats")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40, help="measured batches")
    parser.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="batches before measuring: enough for the batches each loader prefetched while "
        "it started (up to 4 per worker) to be drawn, so the top rate is the steady one",
    )
    parser.add_argument("--model", default="ViT-B-32", help="open_clip model (transform only)")
    parser.add_argument("--step-ms", type=float, default=None, help="simulated GPU step per batch")
    parser.add_argument(
        "--demand", type=float, default=None, help="then consume at this share of the top rate"
    )
    parser.add_argument(
        "--demand-warmup", type=int, default=0, help="batches at that pace before measuring"
    )
    parser.add_argument(
        "--demand-attempts",
        type=int,
        default=1,
        help="redo the demand phase when the top rate measured after it fell (see DRIFT)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--remote", default=None, help="s3://bucket/prefix (cold-cache mode)")
    parser.add_argument("--endpoint", default=None, help="S3 endpoint, e.g. http://127.0.0.1:8333")
    args = parser.parse_args(argv)
    args.loader = name
    return args


def shard_paths(folder: str) -> list[str]:
    paths = sorted(str(p) for p in Path(folder).glob("*.tar"))
    if not paths:
        raise SystemExit(f"no .tar shards in {folder}")
    return paths


def iter_tar_samples(path: str):
    """(key, {ext: bytes}) per sample of one WebDataset tar, in file order (for conversions)."""
    import tarfile

    key, sample = None, {}
    with tarfile.open(path, "r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            base = member.name.rsplit("/", 1)[-1]
            k, _, ext = base.partition(".")
            if k != key and sample:
                yield key, sample
                sample = {}
            key = k
            sample[ext] = tar.extractfile(member).read()
    if sample:
        yield key, sample


def transform(model: str):
    """open_clip's training transform and tokenizer for `model` (no weights downloaded)."""
    import open_clip

    _, preprocess_train, _ = open_clip.create_model_and_transforms(model, pretrained=None)
    return preprocess_train, open_clip.get_tokenizer(model)


class Sample:
    """Picklable per-sample work shared by the map-style runners: JPEG bytes + caption -> pair."""

    def __init__(self, preprocess, tokenizer):
        self.preprocess = preprocess
        self.tokenizer = tokenizer

    def __call__(self, jpg: bytes, txt: str):
        import io

        from PIL import Image

        image = Image.open(io.BytesIO(jpg))
        image = image.convert("RGB")
        return self.preprocess(image), self.tokenizer(txt)[0]


def timed_conversion(marker: Path, convert) -> float:
    """Run `convert()` once per work folder; returns (and caches in `marker`) its seconds."""
    if marker.exists():
        return json.loads(marker.read_text())["convert_s"]
    started = time.perf_counter()
    convert()
    seconds = time.perf_counter() - started
    marker.write_text(json.dumps({"convert_s": seconds}))
    return seconds


def versions(*packages: str) -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "torchvision", "open_clip_torch", "pillow", *packages):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def check_batch(batch, batch_size: int) -> None:
    import torch

    images, tokens = batch[0], batch[1]
    assert isinstance(images, torch.Tensor) and images.dtype == torch.float32, type(images)
    assert tuple(images.shape) == (batch_size, 3, 224, 224), tuple(images.shape)
    assert tuple(tokens.shape) == (batch_size, 77), tuple(tokens.shape)


QS = (0.5, 0.9, 0.99)


def measure(args, make_loader, set_epoch=None, convert_s=None, packages=()) -> dict:
    """Time `make_loader()` to first batch, then `args.batches` batches after warm-up.

    Loops over further epochs when one runs out (calling `set_epoch(n)` first when given).
    With --step-ms, sleeps that long after each batch and reports the share of measured wall
    time spent waiting for the next batch.
    """
    started = time.perf_counter()
    loader = make_loader()
    epoch = 0
    iterator = iter(loader)

    def next_batch():
        nonlocal epoch, iterator
        while True:
            try:
                return next(iterator)
            except StopIteration:
                epoch += 1
                if epoch > 1000:
                    raise RuntimeError("loader yields no batches") from None
                if set_epoch is not None:
                    set_epoch(epoch)
                iterator = iter(loader)

    step = (args.step_ms or 0) / 1000
    first_batch_s = None
    for _ in range(args.warmup):
        batch = next_batch()
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - started
        check_batch(batch, args.batch_size)
        if step:
            time.sleep(step)
    measured_from, cpu = time.perf_counter(), cpu_seconds()
    wait = 0.0
    for _ in range(args.batches):
        t = time.perf_counter()
        batch = next_batch()
        wait += time.perf_counter() - t
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - started
        check_batch(batch, args.batch_size)
        if step:
            time.sleep(step)
    total = time.perf_counter() - measured_from
    top, top_cpu = args.batches * args.batch_size / total, cpu_per_batch(cpu, args.batches)
    demand = at_demand(args, next_batch, top, top_cpu) if args.demand else None
    del batch
    return {
        "loader": args.loader,
        "samples_per_s": round(top, 1),
        "cpu_ms_per_batch": top_cpu,
        "first_batch_s": round(first_batch_s, 3),
        "batches": args.batches,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "data_wait_frac": round(wait / total, 4) if args.step_ms else None,
        "convert_s": round(convert_s, 2) if convert_s is not None else None,
        "at_demand": demand,
        "epochs_started": epoch + 1,
        "versions": versions(*packages),
    }


# How much the machine's speed may move across a demand phase before the phase is redone.
# On a shared 2-vCPU machine the same loader's CPU time per batch moves 93-176 ms between
# 25-batch windows with nothing else running (docs/benchmarks/loader.md, "The wait at 90%
# demand and the machine's speed"), so a demand set from a fast moment can be more than 90%
# of what the machine gives while the phase is timed (or, set from a slow one, less). Speed
# is read two ways: the top rate measured again right after the phase, and the CPU time per
# batch (this process and its workers) during it.
DRIFT = 0.05


def cpu_seconds() -> float:
    """CPU time of this process, its finished children and its live ones (the workers)."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            pids += (task / "children").read_text().split()
    for pid in pids:
        with contextlib.suppress(OSError):  # one reaped since the listing is skipped
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = sum(int(f) for f in fields[11:15])  # utime, stime, and its own children's
            total += ticks / os.sysconf("SC_CLK_TCK")
    return total


def top_rate(args, next_batch) -> tuple[float, float]:
    """(samples/s, CPU ms a batch) over `args.batches` batches drawn as fast as they come."""
    started, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(args.batches):
        check_batch(next_batch(), args.batch_size)
    elapsed = time.perf_counter() - started
    return args.batches * args.batch_size / elapsed, cpu_per_batch(cpu, args.batches)


def cpu_per_batch(since: float, batches: int) -> float:
    return round(1000 * (cpu_seconds() - since) / batches, 1)


def demand_phase(args, next_batch, top: float) -> dict:
    """A simulated step at `args.demand` x `top`: the share of wall time spent waiting."""
    step = args.batch_size / (args.demand * top)
    for _ in range(args.demand_warmup):  # let the queue refill at the new pace first
        next_batch()
        time.sleep(step)
    demand_from, cpu, waits = time.perf_counter(), cpu_seconds(), []
    for _ in range(args.batches):
        t = time.perf_counter()
        next_batch()
        waits.append(time.perf_counter() - t)
        time.sleep(step)
    demand_total = time.perf_counter() - demand_from
    waits.sort()
    return {
        "demand": args.demand,
        "warmup_batches": args.demand_warmup,
        "top_before": round(top, 1),
        "step_ms": round(step * 1000, 1),
        "wait_frac": round(sum(waits) / demand_total, 4),
        # where the wait is: a fixed cost per batch (median) or late batches (the tail)
        "wait_ms_p50_p90_p99": [round(1000 * waits[int(q * len(waits))], 2) for q in QS],
        "samples_per_s": round(args.batches * args.batch_size / demand_total, 1),
        "cpu_ms_per_batch": cpu_per_batch(cpu, args.batches),
    }


def at_demand(args, next_batch, top: float, top_cpu: float) -> dict:
    """The demand phase, bracketed: the top rate is measured again right after it. When the
    machine's speed moved more than DRIFT under the phase (the rate after it, or the CPU time
    per batch during it), the phase is redone at `demand` x the rate after it, up to
    `--demand-attempts` times; every attempt is reported in `attempts`."""
    attempts = []
    for _ in range(args.demand_attempts):
        result = demand_phase(args, next_batch, top)
        after, after_cpu = top_rate(args, next_batch)
        result |= {"top_after": round(after, 1), "top_cpu_ms_per_batch": top_cpu}
        slower = result["cpu_ms_per_batch"] > top_cpu * (1 + DRIFT)
        result["drifted"] = slower or abs(after / top - 1) > DRIFT  # a rise makes it easy
        attempts.append(result)
        if not result["drifted"]:
            break
        top, top_cpu = after, after_cpu
    return attempts[-1] | {"attempts": attempts}


def emit(result: dict) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()

"""`bench/video_loader.py recipe`: the data wait of docs/recipes.md's video training loop when
each step takes as long as 90% of the loader's measured top rate allows.

One `mmcurate.video_loader` over the speed build (bench/video_loader.py), the recipe's loop
(`set_epoch`, iterate, a step per batch, `state_dict()` every 100 steps). First `--epochs`
epochs with no step at all: the top rate, batches per second once each epoch's workers are
up (from each epoch's first batch on). Then the same epochs with a step of
1 / (`--demand` x top rate) seconds: a sleep (a device step: the CPU waits for the GPU), or
`--step busy`, a CPU spin (a CPU-bound step, which competes with the loader workers for the
cores). data_wait: the time the loop waits in `next(batches)` over the loop's time, from each
epoch's first batch on (the workers' start, once per epoch, is reported apart: it is the
DataLoader forking its workers, which a real epoch of thousands of batches pays once).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import mmcurate

EARLY = 4  # an epoch's batches after its first whose wait is also reported apart


def spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def recipe_loop(loader: Any, epochs: int, step_s: float, busy: bool) -> dict[str, float]:
    """The recipe's loop with its model step replaced by `step_s` of sleep (or spin)."""
    first_waits, waits, steps, batches, early = [], 0.0, 0.0, 0, 0.0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        items = iter(loader)
        began = time.perf_counter()
        for n, batch in enumerate(items):
            got = time.perf_counter()
            if n == 0:
                first_waits.append(got - began)
            else:
                waits += got - began
                batches += 1
                early += (got - began) if n <= EARLY else 0.0
            assert batch["video"].ndim == 5
            if step_s:
                (spin if busy else time.sleep)(step_s)
            if loader.step % 100 == 0:
                loader.state_dict()  # what the recipe's checkpoint keeps
            began = time.perf_counter()
            steps += began - got
    return {
        "batches": batches,
        "wait_s": waits,
        "step_s": steps,
        "data_wait_frac": waits / max(waits + steps, 1e-9),
        "wait_in_first_batches_s": early,  # batches 1..EARLY of each epoch (workers ramping)
        "first_batch_s": first_waits,
    }


def recipe(args: Any, manifest: Path) -> None:
    size = None if args.size == "none" else args.size
    schedule = [{"step": 0, "size": size}] if size else None
    loader = mmcurate.video_loader(
        str(manifest), args.batch, args.window, seed=0, workers=args.workers, schedule=schedule
    )
    top = recipe_loop(loader, args.epochs, 0.0, False)
    rate = top["batches"] / top["wait_s"]  # batches per second with no step
    step_s = 1 / (args.demand * rate)
    loaded = recipe_loop(loader, args.epochs, step_s, args.step == "busy")
    report = {
        "top_batches_per_s": rate,
        "top_clips_per_s": rate * args.batch,
        "step_ms": step_s * 1000,
        "top": top,
        "loaded": loaded,
        "skipped": loader.skipped,
    }
    print(json.dumps({"args": vars(args), **report}, indent=1))
    print(
        f"top rate {rate * args.batch:.2f} clips/s; step {step_s * 1000:.1f} ms "
        f"({args.demand:.0%} demand, {args.step}): data_wait {loaded['data_wait_frac']:.2%}"
    )

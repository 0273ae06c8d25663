"""`bench/video_loader.py recipe`: the data wait of docs/recipes.md's video training loop when
each step takes as long as 90% of the loader's measured top rate allows.

One `mmcurate.video_loader` over the speed build (bench/video_loader.py), the recipe's loop
(`set_epoch`, iterate, a step per batch, `state_dict()` every 100 steps), in `--rounds`
alternating rounds of `--epochs` epochs each: first with no step at all (the top rate,
batches per second), then with a step of 1 / (`--demand` x that top rate) seconds: a sleep (a
device step: the CPU waits for the GPU), or `--step busy`, a CPU spin (a CPU-bound step, which
competes with the loader workers for the cores). Epochs are numbered on across rounds, so one
set of loader workers serves the whole run (trainer/data/video_epochs.py). data_wait: the time
the loop waits in `next(batches)` over the loop's time, every batch counted, each epoch's
first too, except the run's very first batch (the workers' start, once per run: reported
apart). Between the top-rate and the loaded epochs the loop pauses `SETTLE_S` (3 s): the
top-rate epochs leave the workers' queues empty, which a run at a steady step never does.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from statistics import median
from typing import Any

import mmcurate

SETTLE_S = 3.0  # a pause between the top-rate and the loaded epochs (recipe)
EARLY = 4  # batches 0..EARLY of an epoch: their wait is also reported apart


def spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def stamp_batches() -> None:
    """Each batch carries the time its worker finished it (in this bench only: the loader's
    workers fork from this process), so that a wait splits into the batch not yet decoded
    when the loop asked (the workers behind) and its hand-over (the loader's own cost)."""
    from mmcurate.trainer.data import video_loader as module

    decode = module.VideoDataset.clip_batch

    def stamped(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = decode(self, *args, **kwargs)
        if isinstance(batch, dict):
            batch["decoded_at"] = time.perf_counter()  # CLOCK_MONOTONIC: one clock for all
        return batch

    module.VideoDataset.clip_batch = stamped


def recipe_loop(loader: Any, epochs: range, step_s: float, busy: bool) -> dict[str, Any]:
    """The recipe's loop over `epochs` with its model step replaced by `step_s` of sleep (or
    spin)."""
    first_waits, waits, steps, batches, early, undecoded = [], 0.0, 0.0, 0, 0.0, 0.0
    for epoch in epochs:
        loader.set_epoch(epoch)
        began = time.perf_counter()
        for n, batch in enumerate(loader):
            got = time.perf_counter()
            if loader.step == 1:  # the run's first batch: the workers' start
                first_waits.append(got - began)
            else:
                waits += got - began
                batches += 1
                undecoded += min(max(batch.get("decoded_at", 0.0) - began, 0.0), got - began)
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
        "wait_in_first_batches_s": early,  # batches 0..EARLY of each epoch
        "wait_undecoded_s": undecoded,  # the batch's worker had not finished it yet
        "wait_handover_s": waits - undecoded,  # it had: queue, unpickling, mapping
        "workers_start_s": first_waits,
    }


def recipe(args: Any, manifest: Path) -> None:
    size = None if args.size == "none" else args.size
    schedule = [{"step": 0, "size": size}] if size else None
    stamp_batches()
    loader = mmcurate.video_loader(
        str(manifest), args.batch, args.window, seed=0, workers=args.workers, schedule=schedule
    )
    rounds, epoch = [], 0
    for _ in range(args.rounds):
        top = recipe_loop(loader, range(epoch, epoch + args.epochs), 0.0, False)
        rate = top["batches"] / top["wait_s"]  # batches per second with no step
        step_s = 1 / (args.demand * rate)
        epoch += args.epochs
        # Why: the top-rate epochs drained the workers' queues, which a run at a steady step
        # keeps full; the loaded epochs start as such a run's would (SETTLE_S, reported).
        time.sleep(SETTLE_S)
        loaded = recipe_loop(loader, range(epoch, epoch + args.epochs), step_s, args.step == "busy")
        epoch += args.epochs
        rounds.append({"top_batches_per_s": rate, "step_ms": step_s * 1000, "loaded": loaded})
        print(
            f"round {len(rounds)}: top rate {rate * args.batch:.2f} clips/s; step "
            f"{step_s * 1000:.1f} ms ({args.demand:.0%} demand, {args.step}): data_wait "
            f"{loaded['data_wait_frac']:.2%} ({loaded['wait_s']:.2f} s in "
            f"{loaded['batches']} batches; {loaded['wait_in_first_batches_s']:.2f} s of it in "
            f"batches 0-{EARLY} of an epoch; {loaded['wait_undecoded_s']:.2f} s for batches "
            f"not yet decoded, {loaded['wait_handover_s'] * 1000 / loaded['batches']:.1f} ms "
            f"a batch handing over decoded ones); load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    loader.close()
    fracs = sorted(r["loaded"]["data_wait_frac"] for r in rounds)
    report = {"rounds": rounds, "skipped": loader.skipped, "data_wait_median": median(fracs)}
    print(json.dumps({"args": vars(args), **report}, indent=1))
    print(
        f"data_wait per round: {', '.join(f'{f:.2%}' for f in fracs)}; median {median(fracs):.2%}"
    )

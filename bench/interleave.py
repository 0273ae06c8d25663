"""Fair timings of two loops on a CPU that other work shares: both run chunk by chunk, taking
turns (the order swapped every chunk), so each sees the same moments of the machine; wall and
CPU time (time.process_time: this process's threads only, so less moved by other processes)
are summed per loop. Used by bench/aesthetic.py and bench/recaption.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def interleaved(
    rounds: int, chunks: Sequence[Any], loops: dict[str, Callable[[Any], Any]]
) -> tuple[dict[str, float], dict[str, float], dict[str, list]]:
    """(wall seconds, CPU seconds, the last round's outputs per chunk) for each loop."""
    names = list(loops)
    wall = dict.fromkeys(names, 0.0)
    cpu = dict.fromkeys(names, 0.0)
    outputs: dict[str, list] = {}
    turn = 0
    for _ in range(rounds):
        outputs = {name: [] for name in names}
        for chunk in chunks:
            order = names if turn % 2 == 0 else names[::-1]
            turn += 1
            for name in order:
                started, used = time.perf_counter(), time.process_time()
                outputs[name].append(loops[name](chunk))
                wall[name] += time.perf_counter() - started
                cpu[name] += time.process_time() - used
    return wall, cpu, outputs


def summary(items: int, wall: dict[str, float], cpu: dict[str, float], unit: str) -> dict:
    """Rates per loop (`items` done by each), and the ratio of the second loop to the first."""
    first, second = list(wall)
    found = {}
    for name in wall:
        found[f"{name}_{unit}_per_s"] = round(items / wall[name], 2)
        found[f"{name}_{unit}_per_cpu_s"] = round(items / cpu[name], 2)
    found["ratio_wall"] = round(wall[first] / wall[second], 3)
    found["ratio_cpu"] = round(cpu[first] / cpu[second], 3)
    return found

"""Injectable GPU samplers for tests (`telemetry.sampler: tests.telemetry_samplers:<name>`):
no GPU here, so the readings are scripted. The script is JSON in MMCURATE_TEST_GPU_READINGS:
a list of samples, each a list of GpuReading fields; past its end the last sample repeats."""

from __future__ import annotations

import json
import os
import threading

from mmcurate.trainer.health.telemetry import GpuReading

READINGS_ENV = "MMCURATE_TEST_GPU_READINGS"


class ScriptedSampler:
    """Returns the scripted samples in order; records the thread of each read."""

    def __init__(self, samples: list[list[GpuReading]]) -> None:
        self.samples = samples
        self.reads = 0
        self.threads: list[str] = []
        self.read_enough = threading.Event()
        self.wanted = 0

    def read(self) -> list[GpuReading]:
        self.threads.append(threading.current_thread().name)
        sample = self.samples[min(self.reads, len(self.samples) - 1)]
        self.reads += 1
        if self.wanted and self.reads >= self.wanted:
            self.read_enough.set()
        return sample


def scripted() -> ScriptedSampler:
    """The sampler the environment's script describes."""
    plan = json.loads(os.environ[READINGS_ENV])
    samples = [
        [
            GpuReading(**{**r, "throttle_reasons": tuple(r.get("throttle_reasons", ()))})
            for r in sample
        ]
        for sample in plan
    ]
    return ScriptedSampler(samples)


class BrokenSampler:
    def read(self) -> list[GpuReading]:
        raise OSError("the driver went away")


def broken() -> BrokenSampler:
    return BrokenSampler()

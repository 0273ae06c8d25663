"""GPU health telemetry (`telemetry:` in the train config): temperature, power, memory, ECC
errors and throttle reasons of every GPU on the node, sampled by a daemon thread (never the
training thread) every `telemetry.every_s` seconds.

Each node's local rank 0 samples all of its node's GPUs (NVML sees them all, whatever
CUDA_VISIBLE_DEVICES says). Rank 0 adds the newest reading to every metrics.jsonl row and to
TensorBoard as `gpu/<index>/<name>`; each sampling process sends its own alerts through the
webhook (trainer/health/alerts.py): `gpu_temperature` (above `max_temperature_c` for
`temperature_samples` samples in a row, once per streak), `gpu_ecc` (the uncorrected ECC count
rose since the previous sample; the run's first sample is the baseline) and `gpu_throttle` (a
reason in `alert_throttle` became active).

The sampler is injectable: `telemetry.sampler: "module:callable"` names a function returning
an object with `read() -> list[GpuReading]`; by default NVML through nvidia-ml-py (`pynvml`),
and without it (or without a GPU driver) telemetry says "unavailable" once and samples nothing.
"""

from __future__ import annotations

import importlib
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from mmcurate.core.config_io import ConfigError
from mmcurate.trainer.config import THROTTLE_REASONS, TelemetryConfig, TrainConfig
from mmcurate.trainer.health.alerts import Alerts

log = logging.getLogger(__name__)
GIB = 2**30


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment; None: the device does not report it (NVML NotSupported)."""

    index: int
    temperature_c: float | None = None
    power_w: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc_errors: int | None = None  # uncorrected, since the driver loaded (volatile)
    throttle_reasons: tuple[str, ...] = ()  # names as in config.THROTTLE_REASONS


class Sampler(Protocol):
    def read(self) -> list[GpuReading]: ...


class SamplerUnavailable(RuntimeError):
    """No readings can be had here (no NVML library, no driver, no GPU)."""


class NvmlSampler:
    """Readings through NVML (nvidia-ml-py's `pynvml`)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise SamplerUnavailable("nvidia-ml-py is not installed") from None
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise SamplerUnavailable(f"NVML: {err}") from None
        if count == 0:
            raise SamplerUnavailable("NVML sees no GPU")
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def read(self) -> list[GpuReading]:
        return [self.read_one(i, handle) for i, handle in enumerate(self.handles)]

    def read_one(self, index: int, handle: Any) -> GpuReading:
        nv = self.nvml
        memory = self.ask(nv.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self.ask(nv.nvmlDeviceGetPowerUsage, handle)
        mask = self.ask(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle) or 0
        ecc = self.ask(
            nv.nvmlDeviceGetTotalEccErrors,
            handle,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        return GpuReading(
            index=index,
            temperature_c=self.ask(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000,
            memory_used_bytes=None if memory is None else memory.used,
            memory_total_bytes=None if memory is None else memory.total,
            ecc_errors=ecc,
            throttle_reasons=tuple(name for name, bit in THROTTLE_REASONS.items() if mask & bit),
        )

    def ask(self, call: Any, *args: Any) -> Any:
        """One NVML query; None where the device does not support it."""
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported:
            return None


def load_sampler(spec: str | None) -> Sampler:
    """The sampler `telemetry.sampler` names ("module:callable"), or NVML's. A name that does
    not import is a ConfigError (one line); SamplerUnavailable when NVML is not usable."""
    if spec is None:
        return NvmlSampler()
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"telemetry.sampler: cannot load {spec!r} ({err})") from None
    return factory()


class GpuRules:
    """The alert rules over successive samples (pure: no thread, no I/O)."""

    def __init__(self, cfg: TelemetryConfig) -> None:
        self.cfg = cfg
        self.hot: dict[int, int] = {}  # GPU -> samples in a row above max_temperature_c
        self.ecc: dict[int, int] = {}  # GPU -> uncorrected ECC errors at the previous sample
        self.throttled: dict[int, set[str]] = {}  # GPU -> alerting reasons active last sample

    def check(self, readings: list[GpuReading]) -> list[tuple[str, str]]:
        """(event, message) for each alert this sample raises."""
        events: list[tuple[str, str]] = []
        for r in readings:
            events += self.temperature(r) + self.ecc_errors(r) + self.throttle(r)
        return events

    def temperature(self, r: GpuReading) -> list[tuple[str, str]]:
        limit, need = self.cfg.max_temperature_c, self.cfg.temperature_samples
        hot = r.temperature_c is not None and r.temperature_c > limit
        self.hot[r.index] = self.hot.get(r.index, 0) + 1 if hot else 0
        if self.hot[r.index] != need:  # once per streak, when it reaches `need`
            return []
        message = f"GPU {r.index}: {r.temperature_c:.0f} C, above {limit:g} C for {need} samples"
        return [("gpu_temperature", message)]

    def ecc_errors(self, r: GpuReading) -> list[tuple[str, str]]:
        if r.ecc_errors is None:
            return []
        before = self.ecc.get(r.index)
        self.ecc[r.index] = r.ecc_errors
        if not self.cfg.alert_ecc or before is None or r.ecc_errors <= before:
            return []
        message = f"GPU {r.index}: {r.ecc_errors - before} new uncorrected ECC errors"
        return [("gpu_ecc", f"{message} ({r.ecc_errors} since the driver loaded)")]

    def throttle(self, r: GpuReading) -> list[tuple[str, str]]:
        active = set(r.throttle_reasons) & set(self.cfg.alert_throttle)
        new = active - self.throttled.get(r.index, set())
        self.throttled[r.index] = active
        if not new:
            return []
        return [("gpu_throttle", f"GPU {r.index}: clocks throttled ({', '.join(sorted(new))})")]


def reading_fields(readings: list[GpuReading], alerting: list[str]) -> dict[str, float]:
    """metrics.jsonl fields of one sample: `gpu/<index>/<name>`, numbers only."""
    row: dict[str, float] = {}
    for r in readings:
        values = {
            "temperature_c": r.temperature_c,
            "power_w": r.power_w,
            "memory_used_gib": None if r.memory_used_bytes is None else r.memory_used_bytes / GIB,
            "memory_total_gib": None
            if r.memory_total_bytes is None
            else r.memory_total_bytes / GIB,
            "ecc_errors": r.ecc_errors,
            "throttled": float(bool(set(r.throttle_reasons) & set(alerting))),
        }
        row |= {f"gpu/{r.index}/{k}": float(v) for k, v in values.items() if v is not None}
    return row


class Telemetry:
    """Samples on a daemon thread; `fields()` gives the newest reading to the logging thread.
    `step` is the training loop's newest step (for the alerts)."""

    def __init__(
        self, cfg: TelemetryConfig, sampler: Sampler, alerts: Alerts, owns_alerts: bool = False
    ) -> None:
        self.cfg, self.sampler, self.alerts, self.owns_alerts = cfg, sampler, alerts, owns_alerts
        self.rules = GpuRules(cfg)
        self.step = 0
        self.samples = 0  # samples taken
        self.errors = 0  # samples that failed (a sampler error never stops training)
        self.host = socket.gethostname()
        self.lock = threading.Lock()
        self.latest: dict[str, float] = {}
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def sample(self) -> list[tuple[str, str]]:
        """Take one sample: newest fields, alert rules; returns the events it sent."""
        try:
            readings = self.sampler.read()
        except Exception as err:  # noqa: BLE001 (any sampler failure: counted, logged once)
            self.errors += 1
            if self.errors == 1:
                log.warning("telemetry: a sample failed (%s: %s)", type(err).__name__, err)
            return []
        fields = reading_fields(readings, self.cfg.alert_throttle)
        with self.lock:
            self.latest = fields
            self.samples += 1
        events = self.rules.check(readings)
        for event, message in events:
            log.warning("telemetry: %s", message)
            self.alerts.send(event, self.step, f"{self.host}: {message}", fields)
        return events

    def fields(self) -> dict[str, float]:
        with self.lock:
            return dict(self.latest)

    def start(self) -> Telemetry:
        """The first sample now (so the first log row has readings), then the thread's."""
        self.sample()
        self.thread = threading.Thread(target=self.loop, name="telemetry", daemon=True)
        self.thread.start()
        return self

    def loop(self) -> None:
        while not self.stopping.wait(self.cfg.every_s):
            self.sample()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(self.cfg.every_s + 10)
            self.thread = None
        if self.owns_alerts:
            self.alerts.close()


def open_telemetry(
    cfg: TrainConfig, local_rank: int, rank: int, alerts: Alerts
) -> Telemetry | None:
    """A started Telemetry on each node's local rank 0 (None elsewhere, when off, or when no
    sampler can read here: said once). `alerts`: rank 0's sender; a local rank 0 on another
    node opens its own (and closes it in `stop`)."""
    if not cfg.telemetry.enabled or local_rank != 0:
        return None
    try:
        sampler = load_sampler(cfg.telemetry.sampler)
    except SamplerUnavailable as err:
        log.warning("telemetry: unavailable (%s); no GPU readings in this run", err)
        return None
    own = None
    if rank != 0:
        section = cfg.alerts
        own = Alerts(section.webhook, alerts.run, section.timeout_s, section.retries)
    return Telemetry(cfg.telemetry, sampler, own or alerts, owns_alerts=own is not None).start()

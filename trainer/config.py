"""Typed training config: `mmcurate train CONFIG.yaml [--set key.path=value ...]`.

Every section forbids unknown keys, so a typo fails fast with `section.key: unknown key`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from mmcurate.core.config_io import (
    ConfigError,
    Strict,
    describe_validation_error,
    load_yaml,
    validate,
)
from mmcurate.core.redaction import redact
from mmcurate.core.storage import absolute
from mmcurate.trainer.units import parse_size
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator


def _checked_size(value: str | None) -> str | None:
    if value is not None:
        parse_size(value)
    return value


Size = Annotated[str | None, AfterValidator(_checked_size)]  # "10GB", "512MiB", or None


class MixEntry(Strict):
    manifest: str  # another build's manifest.json
    weight: float = Field(1.0, gt=0)  # samples per epoch = weight x its samples


class DataConfig(Strict):
    manifest: str  # a build's manifest.json: local path or any fsspec URL (s3://...)
    weight: float = Field(1.0, gt=0)  # its samples per epoch = weight x its samples
    mix: list[MixEntry] = []  # further manifests trained on together with this one
    cache_dir: str | None = None  # local (NVMe) shard cache folder, shared on the node
    cache_limit: Size = None  # cache size cap such as "10GB" (default 100GB)
    batch_size: int = Field(32, gt=0)  # per rank and per micro-batch
    workers: int = Field(2, ge=0)  # DataLoader worker processes per rank
    # Threads each worker decodes its batch's images with: a worker whose turn it is can
    # then use a core another worker leaves idle (batches come from workers in turn).
    decode_threads: int = Field(2, gt=0)
    seed: int = 0
    shuffle_buffer: int = Field(1000, ge=0)  # samples each worker shuffles among (0: off)
    # In-memory bytes of the raw samples a worker holds for its shuffle buffer (and, apart,
    # for a streamed shard being checked); past it their media wait on local disk (TMPDIR),
    # so the order, and a resume, stay the same whatever the sample sizes.
    shuffle_buffer_bytes: Size = "64MiB"  # null: no cap
    gpu_decode: bool = False  # decode JPEGs (nvJPEG) and crop on the training device
    # Streamed shards (no cache_dir): check each shard's size and sha256 before using it (hashed
    # as it streams, its samples held until it matched); a mismatch skips it, as the cache does.
    verify_shards: bool = True
    # square: today's loader (images cropped to the model's input; mmcurate train); bucketed:
    # batches of one aspect_buckets bucket each, for SD-style scripts (trainer/data/buckets.py)
    batching: Literal["square", "bucketed"] = "square"

    @property
    def cache_limit_bytes(self) -> int | None:
        return None if self.cache_limit is None else parse_size(self.cache_limit)

    @property
    def shuffle_buffer_limit(self) -> int:
        size = self.shuffle_buffer_bytes
        return (1 << 62) if size is None else parse_size(size)  # null: no byte cap


class ModelConfig(Strict):
    name: str = "mmcurate-tiny"  # an open_clip architecture name
    pretrained: str | None = None  # open_clip pretrained tag or a local checkpoint path
    loss: Literal["clip", "siglip"] = "clip"  # softmax contrastive, or SigLIP's sigmoid loss
    gradient_checkpointing: bool = False  # recompute activations in backward (open_clip's)


class OptimConfig(Strict):
    lr: float = Field(5e-4, gt=0)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    accum_freq: int = Field(1, gt=0)  # batches per optimizer step (open_clip's feature cache)
    zero: bool = False  # strategy ddp: ZeroRedundancyOptimizer shards AdamW's state over ranks


class RunConfig(Strict):
    output: str  # run folder, local or a URL (s3://...): metrics.jsonl, checkpoints/
    max_steps: int | None = Field(None, gt=0)  # when set, wins over epochs (data repeats)
    epochs: int = Field(1, gt=0)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast on CUDA only
    log_every: int = Field(10, gt=0)
    checkpoint_every: int | None = Field(None, gt=0)
    checkpoint_minutes: float | None = Field(None, gt=0)  # also after this long (rank 0's clock)
    # strategy fsdp: the DCP shards written by a background thread (dcp.async_save)
    async_checkpoint: bool = False
    resume: bool = False  # continue from the newest checkpoint in output, if any
    overwrite: bool = False  # replace a run already in output (its checkpoints and logs)
    sample_log: bool = False  # write samples/rank-<r>.jsonl: the keys of every step's batch
    tensorboard: bool = False  # also log the metrics rows to <output>/tensorboard (rank 0)

    @model_validator(mode="after")
    def _one_of_resume_overwrite(self) -> RunConfig:
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: choose one")
        return self

    @field_validator("output")
    @classmethod
    def _output(cls, value: str) -> str:
        # Local paths resolved (~, relative) where the config loads, as for builds: every
        # rank, and a Ray Train worker with another working folder, writes to the same place.
        return absolute(value.removeprefix("file://"))


class LaunchConfig(Strict):
    mode: Literal["local", "ray"] = "local"  # local: this process (or torchrun's); ray: Ray Train
    workers: int = Field(1, gt=0)  # ray: training processes (ranks) across the cluster
    gpus_per_worker: int | None = Field(None, ge=0)  # ray: null = 1 when the cluster has GPUs
    cpus_per_worker: float = Field(1, gt=0)  # ray: CPUs reserved per rank
    # ray: restarts from the newest checkpoint after a lost worker (FailureConfig; -1: always)
    max_failures: int = Field(0, ge=-1)


def eval_section(name: str, tree: dict[str, Any], where: str) -> Any:
    """`tree` validated as `mmcurate eval`'s section model `name` (trainer/eval/config.py);
    imported only when a run evaluates (it loads torch). A problem is a ConfigError at `where`."""
    from mmcurate.trainer.eval import config as eval_config

    try:
        return getattr(eval_config, name).model_validate(tree)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err, where)) from None


class TrainEval(Strict):
    """Evaluation during training (trainer/eval/in_training.py): `mmcurate eval`'s retrieval and
    zero-shot tasks on the model being trained, logged as `eval/<metric>`. Off unless
    `manifest` or `zeroshot` is set."""

    manifest: str | None = None  # retrieval set: a build's manifest.json (local or a URL)
    every: int | None = Field(None, gt=0)  # steps between evaluations; the last step always
    batch_size: int = Field(64, gt=0)  # images (and texts) per forward pass
    workers: int = Field(2, ge=0)  # loader processes reading the eval sets (rank 0)
    captions_field: str = "captions"  # as mmcurate eval's retrieval section
    image_id_field: str = "image_id"
    recall_at: list[int] = [1, 5, 10]
    # mmcurate eval's zeroshot section: {path, classnames, templates, label_field}
    zeroshot: dict[str, Any] | None = None

    @property
    def enabled(self) -> bool:
        return self.manifest is not None or self.zeroshot is not None

    @field_validator("zeroshot")
    @classmethod
    def _zeroshot(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # Kept as plain data (class names and templates read from their files) so the
        # config round-trips (Ray Train workers, checkpoints).
        if value is None:
            return None
        return eval_section("ZeroshotTask", value, "eval.zeroshot").model_dump()

    @model_validator(mode="after")
    def _tasks(self) -> TrainEval:
        if not self.enabled:
            if self.every is not None:
                raise ConfigError("eval.every: nothing to evaluate: set eval.manifest or zeroshot")
            return self
        self.retrieval_task()  # checked by mmcurate eval's own model
        return self

    def retrieval_task(self) -> Any:
        """The retrieval section of `mmcurate eval` (trainer.eval.config.RetrievalTask), or None."""
        if self.manifest is None:
            return None
        fields = ("manifest", "captions_field", "image_id_field", "recall_at")
        return eval_section("RetrievalTask", {k: getattr(self, k) for k in fields}, "eval")

    def zeroshot_task(self) -> Any:
        """The zeroshot section of `mmcurate eval` (trainer.eval.config.ZeroshotTask), or None."""
        return None if self.zeroshot is None else eval_section("ZeroshotTask", self.zeroshot, "")


class HealthConfig(Strict):
    """Guards of the training loop (trainer/health/checks.py)."""

    enabled: bool = True  # check every step's loss and gradient norm (one host sync a step)
    max_skipped: int = Field(3, gt=0)  # non-finite steps in a row before `action`
    spike_sigmas: float | None = Field(6.0, gt=0)  # K: loss above median + K robust sigmas
    spike_steps: int = Field(3, gt=0)  # M: that many spiking steps in a row trigger `action`
    spike_window: int = Field(200, gt=1)  # healthy losses the median and spread are taken over
    spike_warmup: int = Field(50, gt=1)  # healthy losses needed before spikes are judged
    action: Literal["restore", "stop"] = "restore"  # restore: last good checkpoint, next data
    max_restores: int = Field(3, ge=0)  # restores in one run before it stops instead

    @model_validator(mode="after")
    def _warmup_within_window(self) -> HealthConfig:
        # The window never holds more than spike_window losses: a larger warmup never ends.
        if self.spike_warmup > self.spike_window:
            raise ValueError(
                f"spike_warmup ({self.spike_warmup}) exceeds spike_window "
                f"({self.spike_window}): spikes would never be judged"
            )
        return self


def is_http_url(value: str) -> bool:
    """An http(s) URL with a host and no whitespace or control characters."""
    if any(c.isspace() or not c.isprintable() for c in value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a bad port or IPv6 host
        return False


class AlertsConfig(Strict):
    """JSON POSTs about the run's health (trainer/health/alerts.py); rank 0 sends them."""

    webhook: str | None = None  # http(s) URL; each event is one JSON POST
    run_name: str | None = None  # `run` in each event (default: run.output's folder name)
    timeout_s: float = Field(5.0, gt=0)  # per attempt
    retries: int = Field(3, ge=0)  # further attempts after a failed one (backoff 0.5 s, x2)
    stall_frac: float | None = Field(0.5, gt=0, le=1)  # data_wait_frac of a log window to alert on

    @field_validator("webhook")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        # The message never repeats the URL: its path is a credential (Slack's, ...).
        if value is not None and not is_http_url(value):
            raise ValueError("not an http(s) URL")
        return value


# NVML's clock throttle reasons (nvmlClocksThrottleReason*), by the names the config uses.
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class TelemetryConfig(Strict):
    """GPU health telemetry (trainer/health/telemetry.py), sampled off the training thread."""

    enabled: bool = False  # sample every GPU of the node (local rank 0 of each node)
    every_s: float = Field(10.0, gt=0)  # seconds between samples
    sampler: str | None = None  # "module:callable" making the sampler; null: NVML (nvidia-ml-py)
    max_temperature_c: float = 85.0  # gpu_temperature alert above this ...
    temperature_samples: int = Field(3, gt=0)  # ... for this many samples in a row
    alert_ecc: bool = True  # gpu_ecc alert when the uncorrected ECC count rises
    # gpu_throttle alert when one of these becomes active (power capping at full load is normal)
    alert_throttle: list[str] = [
        *("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"),
        "hw_power_brake_slowdown",
    ]

    @field_validator("alert_throttle")
    @classmethod
    def _reasons(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(THROTTLE_REASONS))
        if unknown:
            names = ", ".join(THROTTLE_REASONS)
            raise ValueError(f"unknown throttle reason {unknown[0]!r} (one of {names})")
        return value

    @field_validator("sampler")
    @classmethod
    def _sampler(cls, value: str | None) -> str | None:
        if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
            raise ValueError("expected 'module:callable'")
        return value


MAX_PROBE_BATCH = 2**24  # a rung past this is no batch size but a typo (and overflows torch)


class ProbeConfig(Strict):
    """`mmcurate probe` (trainer/probe/run.py): the batch-size ladder and the sizing targets."""

    batch_sizes: list[Annotated[int, Field(gt=0, le=MAX_PROBE_BATCH)]] = Field(  # the ladder
        [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], min_length=1
    )
    steps: int = Field(3, gt=0)  # timed steps per rung (after one warm-up step)
    max_memory: Size = None  # cap per rung such as "4GiB"; CPU: enforced (RLIMIT_AS)
    headroom: float = Field(0.1, ge=0, lt=1)  # share of memory the recommended batch leaves free
    loader_batches: int = Field(10, gt=0)  # batches timed per loader measurement
    loop_steps: int = Field(10, gt=0)  # real training steps timed for the data-wait share
    target_global_batch: int | None = Field(None, gt=0)  # e.g. 4096
    target_samples_per_s: float | None = Field(None, gt=0)  # training throughput to reach
    loader_margin: float = Field(0.2, ge=0)  # loader capacity above the GPUs' rate

    @property
    def max_memory_bytes(self) -> int | None:
        return None if self.max_memory is None else parse_size(self.max_memory)


class TrainConfig(Strict):
    data: DataConfig
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    run: RunConfig
    launch: LaunchConfig = LaunchConfig()
    # ddp: a full replica per rank; fsdp: model, gradients and optimizer state sharded (FSDP2)
    strategy: Literal["ddp", "fsdp"] = "ddp"
    eval: TrainEval = TrainEval()  # evaluation during training (off by default)
    health: HealthConfig = HealthConfig()  # non-finite and loss-spike guards
    alerts: AlertsConfig = AlertsConfig()  # webhook events
    telemetry: TelemetryConfig = TelemetryConfig()  # GPU health readings and alerts
    probe: ProbeConfig = ProbeConfig()  # mmcurate probe only
    storage_options: dict[str, Any] = {}  # fsspec options: manifest, shards, a URL run.output

    @field_validator("data")
    @classmethod
    def _square_batches(cls, value: DataConfig) -> DataConfig:
        if value.batching == "bucketed":  # the CLIP loop needs one square input size
            raise ValueError(
                "batching: bucketed is for SD-style training scripts "
                "(trainer.data.buckets.loader_from_config), not mmcurate train (square images)"
            )
        return value

    def redacted(self) -> dict[str, Any]:
        """The resolved config as plain data with every credential replaced by '***': in
        storage_options and anywhere else (a URL's password in data.manifest or run.output)."""
        tree = redact(self.model_dump(mode="json"))
        if self.alerts.webhook:  # a webhook URL is a credential (Slack's, ...): host only
            parts = urlsplit(self.alerts.webhook)
            tree["alerts"]["webhook"] = f"{parts.scheme}://{parts.hostname}/***"
        return tree


def load_train_config(path: str | Path | dict, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML, apply `--set` overrides, validate; raises ConfigError with one line."""
    return validate(TrainConfig, load_yaml(path, overrides))

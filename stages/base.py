"""The stage interface: a frozen options model, lazy setup, `__call__(batch) -> batch`.

A batch is `Columns`: a dict of equal-length column lists (WebDataset naming: `__key__`, `jpg`,
`txt`, ...); the trainer's `Batch` (tensors) is another thing.
Samples are never removed from a batch: a dropped sample keeps its row with `__drop__` set to a
reason and `__drop_stage__` to the stage's label (its name, or `<position>:<name>` when the name
is listed twice), and its media cleared. That way every sample
reaches the driver as a signature row, so drop counts are exact and a rerun can be checked.
"""

from __future__ import annotations

import copy
import time
from typing import Annotated, Any, ClassVar, Literal

import pyarrow as pa
from mmcurate.core.config_io import Strict, checked_resources
from mmcurate.core.formats import (
    IMAGE_COLUMNS,
    is_media_column,
)
from mmcurate.core.mapreduce import Runner
from mmcurate.stages.lib.decisions import KeyedDecision, TopFraction
from pydantic import AfterValidator, Field

Columns = dict[str, list[Any]]

DROP = "__drop__"
DROP_STAGE = "__drop_stage__"


class StageOptions(Strict):
    """Base for stage options: unknown keys are errors; values are frozen."""


class Stage:
    """A per-sample stage. Subclasses set `name`, `Options`, and implement `process`.

    `process(batch)` sees only live samples and returns `(batch, reasons)`, where `reasons[i]` is
    None to keep sample i or a short drop reason. Stages that also take a global decision over
    the whole dataset (dedupe, percentiles) set `is_global` and implement `decide`.
    """

    name: ClassVar[str]
    Options: ClassVar[type[StageOptions]] = StageOptions
    is_global: ClassVar[bool] = False
    io_bound: ClassVar[bool] = False  # waits on the network: runs a chunk ahead of the rest
    after_io = False  # an io_bound stage runs before it (set by registry.build_stages)
    expands: ClassVar[bool] = False  # turns one sample into several (clip_split)
    uses_model_pool: ClassVar[bool] = False  # a ModelStage: its model may run in actors
    produces: ClassVar[frozenset[str]] = frozenset()  # columns later stages may reuse
    consumes: frozenset[str] = frozenset()  # columns it reads that another stage may write
    decide_columns: ClassVar[tuple[str, ...] | None] = None  # what decide() reads (None: all)

    def __init__(self, options: StageOptions | None = None, index: int = 0) -> None:
        self.options = options if options is not None else self.Options()
        self.index = index  # position in the config's stage list, used for timing columns
        self.label = self.name  # its identity in drop_stage and stats: see label_stages
        self._ready = False

    def check(self) -> None:
        """Fail fast, before any data is read (e.g. a model that cannot load): ConfigError."""

    def provides(self, column: str) -> bool:
        """Whether this stage writes `column` for the stages after it."""
        return column in self.produces

    def models(self) -> list[dict[str, str]]:
        """The models and detectors this stage runs, each `{"stage", "name", "package",
        "version"}` (and `"weights"` where they are a file or a tag): the manifest's `models`,
        so a build says which versions made its scores. None here."""
        return []

    def model_record(self, name: str, package: str, weights: str | None = None) -> dict[str, str]:
        """One `models()` entry: `package`'s installed version ("unknown" if not installed)."""
        from mmcurate.core.formats import package_version

        record = {"stage": self.label, "name": name, "package": package}
        record["version"] = package_version(package)
        return record | ({"weights": weights} if weights is not None else {})

    def setup(self) -> None:
        """Load heavy state (models) once per worker; called lazily before the first batch."""

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        raise NotImplementedError

    def decide(
        self, signatures: pa.Table, runner: Runner | None = None
    ) -> dict[str, tuple[str, str | None]]:
        """Global stages: map key -> (drop reason, kept key) over live signature rows. Heavy
        work goes through `runner` (Ray tasks in a build, in-process when None)."""
        return {}

    def decides(self) -> bool:
        """Whether this stage takes a global decision in this configuration."""
        return self.is_global

    def decide_plan(self) -> KeyedDecision | TopFraction | None:
        """How a build runs the decision over partitioned signatures (stages/lib/decisions.py);
        None: `decide()` on the live rows' `decide_columns`, gathered into one task."""
        return None

    @property
    def timing_column(self) -> str:
        return f"__seconds_{self.index}__"

    def __call__(self, batch: Columns) -> Columns:
        if not self._ready:
            self.setup()
            self._ready = True
        started = time.perf_counter()
        live = [i for i, reason in enumerate(batch[DROP]) if reason is None]
        if live:
            sub = {col: [values[i] for i in live] for col, values in batch.items()}
            sub, reasons = self.process(sub)
            merge_live_rows(batch, sub, live, reasons, self.label)
        per_sample = (time.perf_counter() - started) / max(len(batch[DROP]), 1)
        batch[self.timing_column] = [per_sample] * len(batch[DROP])
        return batch


class PoolOptions(StageOptions):
    """Options of a stage whose model may run in an actor pool (pipeline/runtime/actors.py)."""

    num_gpus: float | None = Field(None, ge=0, description="per actor; None: 1 if GPUs, else 0")
    concurrency: int | None = Field(None, ge=1, description="actors; None: GPUs / num_gpus")
    resources: Annotated[dict[str, float], AfterValidator(checked_resources)] = Field(
        default_factory=dict, description="custom Ray resources per actor, e.g. {scoring: 1}"
    )


class TorchPoolOptions(PoolOptions):
    """A pool stage whose model runs in torch: its precision and device."""

    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"


class ModelOptions(TorchPoolOptions):
    """A pool stage whose model is an open_clip model and its pretrained weights."""

    model: str = "ViT-B-32"
    pretrained: str | None = "laion2b_s34b_b79k"


class ModelStage(Stage):
    """A stage that encodes with a model: in the task (its own local model) or through an
    encoder the build passes in (`served_by`) when an actor pool holds the model."""

    Options: ClassVar[type[StageOptions]] = ModelOptions
    uses_model_pool: ClassVar[bool] = True

    def __init__(
        self, options: StageOptions | None = None, index: int = 0, encoder: Any = None
    ) -> None:
        super().__init__(options, index)
        self.encoder = encoder

    def served_by(self, encoder: Any) -> ModelStage:
        """This stage for one task, encoding through `encoder`; the worker's cached stage
        (and its set-up state) is shared, never changed."""
        served = copy.copy(self)
        served.encoder = encoder
        return served


def merge_live_rows(
    batch: Columns, sub: Columns, live: list[int], reasons: list[str | None], stage: str
) -> None:
    """Write processed live rows back into `batch`; mark and strip newly dropped ones."""
    size = len(batch[DROP])
    for col, values in sub.items():
        if col not in batch:
            batch[col] = [None] * size
        for j, i in enumerate(live):
            batch[col][i] = values[j]
    for j, i in enumerate(live):
        if reasons[j] is not None:
            batch[DROP][i] = reasons[j]
            batch[DROP_STAGE][i] = stage
            for col in batch:
                if is_media_column(col):
                    batch[col][i] = None


def media_column(batch: Columns, row: int, columns: tuple[str, ...] = IMAGE_COLUMNS) -> str | None:
    """The column of `columns` (images by default) that holds bytes for `row`, or None."""
    for col in columns:
        values = batch.get(col)
        if values is not None and values[row] is not None:
            return col
    return None


def label_stages(stages: list[Stage]) -> list[Stage]:
    """A stage is known by its name; a name listed twice (two caption_filters with different
    limits) makes each of its stages known by position too, as `2:caption_filter`."""
    counts: dict[str, int] = {}
    for stage in stages:
        counts[stage.name] = counts.get(stage.name, 0) + 1
    for stage in stages:
        stage.label = stage.name if counts[stage.name] == 1 else f"{stage.index}:{stage.name}"
    return stages


_REGISTRY: dict[str, type[Stage]] = {}


def register(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make a stage available by its `name` in configs."""
    if cls.name in _REGISTRY:
        raise ValueError(f"stage {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls

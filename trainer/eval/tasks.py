"""The two eval tasks of `mmcurate eval`: embed an eval set's images as the loader workers
deliver them (only features are kept), embed the captions or class prompts, and score."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from mmcurate.trainer.eval.data import (
    ClassNames,
    EvalDataError,
    EvalSource,
    Fields,
    Record,
    count_drops,
    make_loader,
)
from mmcurate.trainer.eval.metrics import retrieval_from_features, zeroshot_from_features
from mmcurate.trainer.precision import autocast
from tqdm import tqdm

if TYPE_CHECKING:
    from mmcurate.trainer.eval.config import EvalConfig, Inputs


class Encoder:
    """The model's normalized float32 features, under the run's autocast on CUDA."""

    def __init__(self, model: torch.nn.Module, device: torch.device, precision: str) -> None:
        self.model, self.device, self.precision = model, device, precision

    def images(self, images: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), autocast(self.precision, self.device):
            out = self.model.encode_image(images.to(self.device, non_blocking=True))
        return F.normalize(out.float(), dim=-1)

    def texts(self, tokenizer: Callable, texts: list[str], batch: int) -> torch.Tensor:
        chunks = []
        for start in range(0, len(texts), batch):
            tokens = tokenizer(texts[start : start + batch]).to(self.device)
            with torch.inference_mode(), autocast(self.precision, self.device):
                out = self.model.encode_text(tokens)
            chunks.append(F.normalize(out.float(), dim=-1))
        return torch.cat(chunks)


def read_set(
    cfg: EvalConfig,
    found: tuple[list, Any, list[int]],
    preprocess: Callable,
    task: str,
    encoder: Encoder,
    progress: bool,
) -> tuple[list[Record], dict[int, torch.Tensor]]:
    """Every record of the set in position order, and the image feature of each record
    that carries an image (by position)."""
    units, read, starts = found
    fields = fields_of(cfg, task)
    source = EvalSource(units, read, starts, preprocess, fields, task, cfg.data.batch_size)
    records, features = [], {}
    total = sum(getattr(u, "stop", 1) - getattr(u, "start", 0) for u in units)
    with tqdm(total=total, desc=task, unit="sample", file=sys.stderr, disable=not progress) as bar:
        for part in make_loader(source, cfg.data.workers):
            records += part.records
            if part.images is not None:
                carriers = [r.position for r in part.records if r.has_image]
                features.update(zip(carriers, encoder.images(part.images), strict=True))
            bar.update(len(part.records))
    records.sort(key=lambda r: r.position)
    return records, features


def pair_up(records: list[Record]) -> tuple[list[int], list[str], list[int]]:
    """(carrier position of each image, every caption, each caption's image index) from the
    usable records in position order: an image is the first carrier of its group."""
    image_of: dict[str, int] = {}
    carriers, texts, text_image = [], [], []
    for record in (r for r in records if r.drop is None):
        if record.has_image and record.group not in image_of:
            image_of[record.group] = len(carriers)
            carriers.append(record.position)
        texts += record.captions
        text_image += [image_of[record.group]] * len(record.captions)
    return carriers, texts, text_image


def fields_of(cfg: EvalConfig, task: str) -> Fields:
    if task == "retrieval":
        return Fields(captions=cfg.retrieval.captions_field, image_id=cfg.retrieval.image_id_field)
    return Fields(image_id="", label=cfg.zeroshot.label_field)


@dataclass(frozen=True)
class ModelUnderTest:
    """The model under evaluation with its image transform and tokenizer."""

    model: torch.nn.Module
    preprocess: Callable
    tokenizer: Callable


def run_tasks(
    cfg: EvalConfig, inputs: Inputs, net: ModelUnderTest, progress: bool
) -> dict[str, Any]:
    """Each task the inputs name (retrieval, zero-shot) on `net`, by task name."""
    tasks = {}
    if inputs.retrieval:
        tasks["retrieval"] = run_retrieval(cfg, inputs, net, progress)
    if inputs.zeroshot:
        tasks["zeroshot"] = run_zeroshot(cfg, inputs, net, progress)
    return tasks


def run_retrieval(
    cfg: EvalConfig, inputs: Inputs, net: ModelUnderTest, progress: bool
) -> dict[str, Any]:
    """Text-to-image and image-to-text ranks over the manifest's images and captions."""
    encoder = Encoder(net.model, inputs.device, cfg.run.precision)
    preprocess, tokenizer = net.preprocess, net.tokenizer
    records, features = read_set(cfg, inputs.retrieval, preprocess, "retrieval", encoder, progress)
    carriers, texts, text_image = pair_up(records)
    images = [features[position] for position in carriers]
    if not images:
        raise EvalDataError(
            f"retrieval: no usable samples in {cfg.retrieval.manifest} {drops(records)}"
        )
    text_features = encoder.texts(tokenizer, texts, cfg.data.batch_size)
    metrics = retrieval_from_features(
        torch.stack(images), text_features, torch.tensor(text_image), cfg.retrieval.recall_at
    )
    return {
        "data": cfg.retrieval.manifest,
        "samples": len(records),
        "images": len(images),
        "texts": len(texts),
        "dropped": count_drops(records),
        "metrics": metrics,
    }


def run_zeroshot(
    cfg: EvalConfig, inputs: Inputs, net: ModelUnderTest, progress: bool
) -> dict[str, Any]:
    """Each image against one text embedding per class (its prompts' mean)."""
    encoder = Encoder(net.model, inputs.device, cfg.run.precision)
    preprocess, tokenizer = net.preprocess, net.tokenizer
    classes = ClassNames.parse(cfg.zeroshot.classnames)
    records, features = read_set(cfg, inputs.zeroshot, preprocess, "zeroshot", encoder, progress)
    rows, labels = [], []
    for record in (r for r in records if r.drop is None):
        label = classes.lookup.get(record.label)
        if label is None:
            record.drop = "unknown_label"
            continue
        rows.append(features[record.position])
        labels.append(label)
    if not rows:
        raise EvalDataError(f"zeroshot: no usable samples in {cfg.zeroshot.path} {drops(records)}")
    classifier = class_embeddings(encoder, tokenizer, classes.names, cfg.zeroshot.templates, cfg)
    metrics = zeroshot_from_features(torch.stack(rows), classifier, torch.tensor(labels))
    return {
        "data": cfg.zeroshot.path,
        "samples": len(records),
        "images": len(rows),
        "classes": len(classes.names),
        "templates": len(cfg.zeroshot.templates),
        "dropped": count_drops(records),
        "metrics": metrics,
    }


def class_embeddings(
    encoder: Encoder,
    tokenizer: Callable,
    names: tuple[str, ...],
    templates: list[str],
    cfg: EvalConfig,
) -> torch.Tensor:
    """[classes, dim]: each class's prompts embedded, averaged and normalized again (as
    clip_benchmark builds its zero-shot classifier). `{c}` is replaced, no other braces."""
    prompts = [t.replace("{c}", name) for name in names for t in templates]
    features = encoder.texts(tokenizer, prompts, cfg.data.batch_size)
    return F.normalize(features.view(len(names), len(templates), -1).mean(dim=1), dim=-1)


def drops(records: list[Record]) -> str:
    return f"(dropped: {count_drops(records) or 'nothing'})"

"""Eval sets for `mmcurate eval`: a build's shards (read by the training loader's shard reader
and cache) or a folder of class folders, decoded with the model's eval transform in loader
workers, and class names / prompt templates from YAML.

Sample fields (json member; names configurable):
- `captions`: a list of captions for the sample's image (Flickr30K/COCO have 5); without it
  the `txt` member is the one caption.
- `image_id`: samples sharing it show the same image; their captions are pooled. Within a shard
  the first decodable sample of an id carries the image, later ones reuse it (not decoded).
  Ids are compared with their JSON type (1 and "1" are two images). Without one a sample is
  its own image: keys are no identity (writers restart them per shard, a hand-written shard
  may repeat one). Zero-shot samples never share an image.
- `label` (zero-shot): a class name, a key of the classnames mapping, or a class index (an
  integral number: 1.0 is class 1); surrounding spaces are ignored; a `cls` member is used
  when the json has none. In a folder, the class folder's name (symlinked folders followed).
Unusable samples are skipped and counted by reason (see DROP_REASONS).
"""

from __future__ import annotations

import os
import posixpath
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from mmcurate.core.formats import IMAGE_COLUMNS, sample_meta
from mmcurate.core.manifest import Manifest
from mmcurate.core.storage import filesystem, is_local, release_sessions, with_protocol
from mmcurate.trainer.data.plan import Segment
from mmcurate.trainer.data.reader import ShardReader
from mmcurate.trainer.data.transform import DECODE_ERRORS, open_image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

DROP_REASONS = {
    "unreadable": "its shard or file could not be read",
    "no_image": "no image member (jpg, png, webp, ...)",
    "decode_error": "the image did not decode",
    "no_caption": "neither a captions list nor a txt member (retrieval)",
    "no_label": "no label field nor cls member (zero-shot)",
    "unknown_label": "a label that names no class (zero-shot)",
}
IMAGE_SUFFIXES = (*IMAGE_COLUMNS, "jpeg", "tif")


class EvalDataError(RuntimeError):
    """An eval set that cannot be used at all; reported as one line."""


@dataclass(frozen=True)
class Fields:
    captions: str = "captions"
    image_id: str = "image_id"  # "": every sample is its own image (zero-shot)
    label: str = "label"


@dataclass
class Record:
    """One sample as the workers hand it over (without its image tensor)."""

    position: int
    key: str
    has_image: bool = False  # its image is in the batch's tensor (else shared or dropped)
    captions: list[str] = field(default_factory=list)
    group: str = ""  # the image's identity: json image_id (with its type), else the position
    label: str | None = None
    drop: str | None = None


@dataclass
class Part:
    """A worker's batch: records in read order and the stacked images of those with one."""

    records: list[Record]
    images: torch.Tensor | None


def parse_sample(
    position: int,
    sample: dict[str, Any] | None,
    fields: Fields,
    task: str,
    carried: set[str],
) -> Record:
    """A Record (image not decoded yet) for a raw sample; `carried`: the image ids whose image
    an earlier sample of this shard carries."""
    if sample is None:
        return Record(position, "", drop="unreadable")
    meta = sample_meta(sample.get("json"))
    record = Record(position, str(sample.get("__key__", "")))
    record.group = image_group(position, meta.get(fields.image_id) if fields.image_id else None)
    if task == "retrieval":
        record.captions = captions_of(sample, meta, fields)
        record.drop = None if record.captions else "no_caption"
    else:
        record.label = label_of(sample, meta, fields)
        record.drop = None if record.label is not None else "no_label"
    if record.drop is None and record.group not in carried:
        if not any(c in sample for c in IMAGE_SUFFIXES):
            record.drop = "no_image"
    return record


def image_group(position: int, image_id: Any) -> str:
    """A json image_id with its type (1 and "1" differ); without one the sample's position in
    the set: unique, unlike keys, which writers restart per shard."""
    if isinstance(image_id, (str, int)) and not isinstance(image_id, bool):
        return f"id:{type(image_id).__name__}:{image_id}"
    return f"pos:{position}"


def captions_of(sample: dict[str, Any], meta: dict[str, Any], fields: Fields) -> list[str]:
    listed = meta.get(fields.captions)
    if isinstance(listed, list):
        return [c for c in listed if isinstance(c, str) and c.strip()]
    try:
        text = sample["txt"].decode("utf-8") if "txt" in sample else ""
    except UnicodeDecodeError:
        return []
    return [text] if text.strip() else []


def label_of(sample: dict[str, Any], meta: dict[str, Any], fields: Fields) -> str | None:
    value = meta.get(fields.label)
    if isinstance(value, float) and value.is_integer():  # 1.0: how pandas writes a gappy column
        value = int(value)
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value).strip() or None
    if "cls" in sample:
        try:
            return sample["cls"].decode("utf-8").strip() or None
        except UnicodeDecodeError:
            return None
    return None


def decode_image(sample: dict[str, Any], transform: Callable) -> torch.Tensor | None:
    column = next(c for c in IMAGE_SUFFIXES if c in sample)
    try:
        return transform(open_image(sample[column]))
    except DECODE_ERRORS:
        return None


class EvalSource(IterableDataset):
    """Yields Parts of at most `batch` records; worker w reads units w, w + W, ... (whole
    shards, or files of a folder), so every sample is read exactly once."""

    def __init__(
        self,
        units: list[Any],
        read: Callable[[list[Any]], Iterator[tuple[int, dict[str, Any] | None]]],
        starts: list[int],
        transform: Callable,
        fields: Fields,
        task: str,
        batch: int,
    ) -> None:
        self.units, self.read, self.starts = units, read, frozenset(starts)
        self.transform, self.fields, self.task, self.batch = transform, fields, task, batch

    def __iter__(self) -> Iterator[Part]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        records, images, carried = [], [], set()
        for position, sample in self.read(self.units[worker::workers]):
            if position in self.starts:  # a new shard: image ids start afresh
                carried = set()
            record = parse_sample(position, sample, self.fields, self.task, carried)
            if record.drop is None and record.group not in carried:
                image = decode_image(sample, self.transform)
                record.drop = "decode_error" if image is None else None
                if image is not None:
                    record.has_image = True
                    images.append(image)
                    carried.add(record.group)
            records.append(record)
            if len(records) == self.batch:
                yield Part(records, torch.stack(images) if images else None)
                records, images = [], []
        if records:
            yield Part(records, torch.stack(images) if images else None)


class ShardRead:
    """Reads whole-shard segments with the training loader's shard reader (trainer/data/reader.py):
    the same tar parsing, storage options, size and sha256 checks, and node-local shard cache
    with prefetch. A shard it cannot use gives None samples (counted as `unreadable`)."""

    def __init__(
        self,
        manifest: Manifest,
        storage_options: dict[str, Any] | None,
        cache: tuple[str, int] | None,
    ) -> None:
        self.shards, self.storage_options, self.cache = manifest.shards, storage_options, cache
        self._reader: tuple[int, ShardReader] | None = None

    def __call__(self, units: list[Segment]) -> Iterator[tuple[int, dict[str, Any] | None]]:
        # Why per process: a forked loader worker must not share its parent's cache threads.
        if self._reader is None or self._reader[0] != os.getpid():
            reader = EvalShardReader(self.shards, self.storage_options, self.cache)
            self._reader = (os.getpid(), reader)
        return self._reader[1].positions(units)


class EvalShardReader(ShardReader):
    SKIPPED = "its samples are counted as unreadable"


class FolderRead:
    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        self.storage_options = storage_options

    def __call__(self, files: list[FolderFile]) -> Iterator[tuple[int, dict[str, Any] | None]]:
        return read_folder_files(files, self.storage_options)


def shard_units(manifest: Manifest) -> list[Segment]:
    """One whole-shard segment per shard; positions count samples across the manifest."""
    units, position = [], 0
    for index, shard in enumerate(manifest.shards):
        units.append(Segment(index, 0, shard.samples, position))
        position += shard.samples
    return units


@dataclass(frozen=True)
class FolderFile:
    url: str
    label: str  # its class folder
    position: int


def folder_units(url: str, storage_options: dict[str, Any] | None) -> list[FolderFile]:
    """Image files under `url`/<class>/... (any depth), sorted; fails on none."""
    fs, root = filesystem(url, storage_options)
    if not fs.isdir(root):
        raise EvalDataError(f"zeroshot.path: {url} is not a folder or a manifest.json")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    found = []
    for path in sorted(local_files(root) if is_local(fs) else fs.find(root)):
        rel = posixpath.relpath(path, root)
        if "/" in rel and rel.rpartition(".")[2].lower() in IMAGE_SUFFIXES:
            found.append((with_protocol(protocol, path), rel.split("/", 1)[0]))
    if not found:
        raise EvalDataError(f"zeroshot.path: no image files in class folders under {url}")
    return [FolderFile(path, label, i) for i, (path, label) in enumerate(found)]


def local_files(root: str, above: frozenset[tuple[int, int]] = frozenset()) -> Iterator[str]:
    """Every non-folder under a local `root`, entering symlinked folders as torchvision's
    ImageFolder does (fsspec's local find does not); a link back to a folder above it (a
    loop) is not entered again. Unreadable folders are left out."""
    try:
        info = os.stat(root)
        entries = list(os.scandir(root))
    except OSError:
        return
    here = above | {(info.st_dev, info.st_ino)}
    for entry in entries:
        try:
            target = entry.stat() if entry.is_dir() else None  # both follow links
        except OSError:
            target = None
        if target is None:
            yield entry.path  # a dangling link too: counted as unreadable
        elif (target.st_dev, target.st_ino) not in here:
            yield from local_files(entry.path, here)


def read_folder_files(
    files: list[FolderFile], storage_options: dict[str, Any] | None
) -> Iterator[tuple[int, dict[str, Any] | None]]:
    for item in files:
        fs, path = filesystem(item.url, storage_options)
        try:
            data = fs.cat_file(path)
        except OSError:
            yield item.position, None
            continue
        ext = path.rpartition(".")[2].lower()
        yield item.position, {"__key__": path, ext: data, "cls": item.label.encode()}


def make_loader(source: EvalSource, workers: int) -> DataLoader:
    if workers:  # forked workers must not inherit this process's S3 sessions (storage.py)
        release_sessions()
    return DataLoader(source, batch_size=None, num_workers=workers, collate_fn=same)


def same(part: Part) -> Part:
    return part  # Why: the default collate would try to convert the records


def count_drops(records: list[Record]) -> dict[str, int]:
    return dict(sorted(Counter(r.drop for r in records if r.drop).items()))


# ---- class names and templates ---------------------------------------------------------


def load_listing(value: Any, key: str) -> Any:
    """`value` itself when inline; for a string, the YAML file it names: a list, a mapping,
    or a mapping with `key` (one file may hold both classnames and templates)."""
    if not isinstance(value, str):
        return value
    file = Path(value).expanduser()
    if not file.is_file():
        raise ValueError(f"file not found: {value}")
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{value}: not valid YAML ({type(err).__name__})") from None
    if isinstance(doc, dict) and key in doc:
        return doc[key]
    return doc


@dataclass(frozen=True)
class ClassNames:
    names: tuple[str, ...]  # the prompt name of class i
    lookup: dict[str, int]  # label (name, mapping key or index, as text) -> class

    @classmethod
    def parse(cls, value: Any) -> ClassNames:
        if isinstance(value, dict) and value:
            names = tuple(str(v) for v in value.values())
            return cls(names, {str(k): i for i, k in enumerate(value)})
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            lookup = {str(i): i for i in range(len(value))}
            # A name wins over an index; a name listed twice (ImageNet's "crane") names
            # neither class: such labels must be indices.
            twice = {name for name, n in Counter(value).items() if n > 1}
            lookup.update({name: i for i, name in enumerate(value) if name not in twice})
            return cls(tuple(value), lookup)
        raise ValueError("expected a non-empty list of class names or a mapping label: name")

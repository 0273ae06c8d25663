"""Typed partition records: what planning hands to the tasks that read (one class per kind).

A record is immutable (frozen dataclass: plain data that pickles to Ray tasks as it is, and
that staging or `mmcurate retry` change only by making a new one with `dataclasses.replace`).
Frozen dataclasses rather than pydantic models: records are made by the thousand on the driver
and by the task, their values come from planning code (never from users), and a dataclass costs
no validation pass. `to_dict()` is exactly the JSON-able dict a partition was before records
(the same keys, "part" for `number`, lists for tuples, optional keys absent when unset): the
build identity hashes it, so a resumed build plans again and finds the same identity, and
`from_dict` reads it back (an unfinished `mmcurate retry`/`append` keeps its partitions so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

# Field metadata: the key is left out of `to_dict` while the value is None (keys a plan
# entry had only for some files or after some step)
OPTIONAL = {"optional": True}


def as_json(value: Any) -> Any:
    """Tuples (records keep lists as tuples, so nothing changes them in place) as lists, and
    nested records as their dicts."""
    if isinstance(value, tuple):
        return [as_json(v) for v in value]
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


def as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True, kw_only=True)
class Partition:
    """One input partition: its kind (which source reads it) and its number (its place in the
    plan, which names its candidate tar and signatures: "part" in the dict). `only_keys`:
    `mmcurate retry` reads just these samples of it."""

    kind: str
    number: int
    only_keys: tuple[str, ...] | None = field(default=None, metadata=OPTIONAL)

    # The config's `source.kind` whose source object reads records of this class
    source_kind: ClassVar[str]
    KEYS: ClassVar[dict[str, str]] = {"number": "part"}  # attribute -> dict key, where they differ

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is None and spec.metadata.get("optional"):
                continue
            out[self.KEYS.get(spec.name, spec.name)] = as_json(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Partition:
        """A record of the class its "kind" names (a dict `to_dict` wrote)."""
        record = RECORDS[data["kind"]]
        names = {v: k for k, v in record.KEYS.items()}
        values = {names.get(key, key): as_tuple(value) for key, value in data.items()}
        return record.build(values)

    @classmethod
    def build(cls, values: dict[str, Any]) -> Partition:
        return cls(**values)


@dataclass(frozen=True)
class FileEntry:
    """One media file of a folder or glob partition: its path under the root, its key, and
    which sidecars (`<stem>.txt`, `<stem>.json`) it has. `listed`: planned from a folder
    listing, which also gave its size (None when the listing had none) and looked for both
    sidecars; a glob's entries know only that a caption may exist (read when it does)."""

    rel: str
    key: str
    txt: bool
    json: bool = False
    size: int | None = None
    listed: bool = True

    def has(self, sidecar: str) -> bool:
        return bool(getattr(self, sidecar))

    def to_dict(self) -> dict[str, Any]:
        if not self.listed:
            return {"rel": self.rel, "key": self.key, "txt": self.txt}
        return {
            "rel": self.rel,
            "key": self.key,
            "size": self.size,
            "txt": self.txt,
            "json": self.json,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileEntry:
        listed = "size" in data
        return cls(
            data["rel"], data["key"], data["txt"], data.get("json", False), data.get("size"), listed
        )


@dataclass(frozen=True, kw_only=True)
class FolderPartition(Partition):
    """Media files under `root` (kind "images", or "videos" from a folder or glob). `inputs`
    fixes their versions (a folder: one hash; a glob: each file's "size:tag")."""

    root: str
    protocol: str
    entries: tuple[FileEntry, ...]
    inputs: str | tuple[str, ...]

    @property
    def source_kind(self) -> str:  # type: ignore[override]
        return self.kind

    @classmethod
    def build(cls, values: dict[str, Any]) -> Partition:
        entries = tuple(FileEntry.from_dict(e) for e in values.pop("entries"))
        return cls(entries=entries, **values)


def folder_partitions(
    kind: str,
    where: tuple[str, str],
    files: list[FileEntry],
    versions: list[Any],
    size: int,
    inputs_of: Callable[[list[Any]], str | tuple[str, ...]],
) -> list[FolderPartition]:
    """`files` (sorted) in partitions of `size`; `where` is (root, protocol); each
    partition's `inputs` is `inputs_of` its files' `versions` (a folder hashes them, a glob
    keeps each: the forms earlier plans had, so identities stay)."""
    root, protocol = where
    return [
        FolderPartition(
            kind=kind,
            number=i,
            root=root,
            protocol=protocol,
            entries=tuple(files[start : start + size]),
            inputs=inputs_of(versions[start : start + size]),
        )
        for i, start in enumerate(range(0, len(files), size))
    ]


@dataclass(frozen=True, kw_only=True)
class TarPartition(Partition):
    """One tar shard of a `webdataset` source; `inputs` is its "size:tag" version."""

    tar: str
    protocol: str
    inputs: str
    source_kind: ClassVar[str] = "webdataset"


@dataclass(frozen=True)
class VideoRow:
    """One row of a video list file: its key (row number), the video's URL (None: the row has
    none) and caption, and the drop reason a malformed row already has."""

    key: str
    url: str | None
    caption: str | None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "url": self.url, "caption": self.caption, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class VideoListPartition(Partition):
    """Rows of a `videos` list file (kind "video_list")."""

    rows: tuple[VideoRow, ...]
    source_kind: ClassVar[str] = "videos"

    @classmethod
    def build(cls, values: dict[str, Any]) -> Partition:
        rows = tuple(VideoRow(**row) for row in values.pop("rows"))
        return cls(rows=rows, **values)


@dataclass(frozen=True, kw_only=True)
class UrlPartition(Partition):
    """`count` rows of one URL list `file` from row `start` (keys from `first_key` on), and
    how they are read (pipeline/sources/urls.py:plan_file): `read` "row_groups" (parquet:
    `groups`, `skip`, the file's `size` and `footer` bytes), "bytes" (plain text: `byte_range`,
    the `header` bytes, `schema`), else the whole file; `stage` (+ `stage_rows`, `stage_index`)
    when a parquet copy under `_work/` is planned, `staged_url` once staging wrote it."""

    file: str
    start: int
    count: int
    first_key: int
    protocol: str
    url_column: str
    caption_column: str
    columns: tuple[str, ...] | None = None  # None: all (always a key of a planned partition)
    file_size: int | None = field(default=None, metadata=OPTIONAL)
    file_version: str | None = field(default=None, metadata=OPTIONAL)
    format: str | None = field(default=None, metadata=OPTIONAL)
    read: str | None = field(default=None, metadata=OPTIONAL)
    groups: tuple[int, ...] | None = field(default=None, metadata=OPTIONAL)
    skip: int | None = field(default=None, metadata=OPTIONAL)
    size: int | None = field(default=None, metadata=OPTIONAL)
    footer: int | None = field(default=None, metadata=OPTIONAL)
    byte_range: tuple[int, int] | None = field(default=None, metadata=OPTIONAL)
    header: int | None = field(default=None, metadata=OPTIONAL)
    schema: str | None = field(default=None, metadata=OPTIONAL)
    stage: str | None = field(default=None, metadata=OPTIONAL)
    stage_rows: int | None = field(default=None, metadata=OPTIONAL)
    stage_index: int | None = field(default=None, metadata=OPTIONAL)
    staged_url: str | None = field(default=None, metadata=OPTIONAL)
    source_kind: ClassVar[str] = "urls"
    KEYS: ClassVar[dict[str, str]] = {"number": "part", "byte_range": "range"}


RECORDS: dict[str, type[Partition]] = {
    "images": FolderPartition,
    "videos": FolderPartition,
    "video_list": VideoListPartition,
    "webdataset": TarPartition,
    "urls": UrlPartition,
}


def partitions_from_dicts(parts: list[dict[str, Any]]) -> list[Partition]:
    return [Partition.from_dict(p) for p in parts]


def partitions_as_dicts(parts: list[Partition]) -> list[dict[str, Any]]:
    return [p.to_dict() for p in parts]

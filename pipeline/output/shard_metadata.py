"""One metadata schema for all shards of a build: each candidate metadata file records the kind
of every json field it holds (in its parquet footer), the kinds of all partitions are merged
before phase C (an int and a float make a float; anything mixed with text is JSON text), and
every shard's metadata parquet is written with the merged schema, so readers that concatenate
the shards' parquets (duckdb, HF datasets) see one table."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from mmcurate.core.formats import sample_meta
from mmcurate.core.mapreduce import Runner
from mmcurate.core.storage import (
    filesystem,
    join,
    with_retries,
)
from mmcurate.pipeline.output.json_fill import JSON_AT, json_keys
from mmcurate.pipeline.output.names import part_file
from mmcurate.pipeline.output.shard_format import ShardSpec

FIELDS_KEY = b"mmcurate.fields"  # in a candidate metadata file's footer: its field kinds
JSON_KEYS_KEY = b"mmcurate.json_keys"  # ... and the keys of its samples' json objects


def metadata_name(part: int) -> str:
    return part_file(part, "parquet")


def spec_records(
    candidates_url: str, spec: ShardSpec, storage_options: dict
) -> dict[int, dict[str, dict]]:
    """The candidate metadata records (key, caption, json, json offset) of the spec's
    partitions, by partition and key (only the spec's samples kept)."""
    records: dict[int, dict[str, dict]] = {}
    for part, spans in spec.parts:
        wanted = {key for key, _, _ in spans}
        found = read_candidate_metadata(candidates_url, part, storage_options)
        records[part] = {r["__key__"]: r for r in found if r["__key__"] in wanted}
    return records


def read_candidate_metadata(candidates_url: str, part: int, storage_options: dict) -> list[dict]:
    fs, path = filesystem(join(candidates_url, metadata_name(part)), storage_options)
    blob = with_retries(lambda: fs.cat_file(path))
    return pq.ParquetFile(io.BytesIO(blob)).read().to_pylist()  # read_table: +pyarrow.dataset


def metadata_row(record: dict[str, Any]) -> dict[str, Any]:
    """A shard metadata parquet's row: key, caption, then the json's fields."""
    row = {"key": record["__key__"], "caption": record.get("txt")}
    row.update({k: v for k, v in sample_meta(record.get("json")).items() if k not in row})
    return row


ARROW_TYPES = {
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "string": pa.string(),
    "json": pa.string(),  # values written as JSON text
    "null": pa.string(),
}


INT64 = (-(2**63), 2**63 - 1)


def value_kind(value: Any) -> str:
    """The field kind of one JSON value (ints beyond int64 only fit as JSON text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if INT64[0] <= value <= INT64[1] else "json"
    if isinstance(value, float):
        return "float"
    return "string" if isinstance(value, str) else "json"


def merge_kind(a: str, b: str) -> str:
    if a == b or b == "null":
        return a
    if a == "null":
        return b
    return "float" if {a, b} == {"int", "float"} else "json"


def merge_fields(fields: dict[str, str], more: dict[str, str]) -> dict[str, str]:
    merged = dict(fields)
    for name, kind in more.items():
        merged[name] = merge_kind(merged.get(name, "null"), kind)
    return merged


def row_fields(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Field kinds over metadata rows; `key` and `caption` are always text."""
    fields = {"key": "string", "caption": "string"}
    for row in rows:
        fields = merge_fields(fields, {name: value_kind(v) for name, v in row.items()})
    return fields


def record_fields(records: list[dict[str, Any]]) -> dict[str, str]:
    """Field kinds of candidate records, as their metadata rows will hold them."""
    return row_fields([metadata_row(r) for r in records])


def candidate_metadata(samples: list[dict[str, Any]]) -> pa.Table:
    """A partition's candidate metadata (phase A): key, caption and JSON text of its live
    samples, and where each json member starts in its record (`__json_at__`); the footer
    carries their field kinds and json keys, so the build's schema and key set are planned
    from footers alone (`part_schema`)."""
    columns = ("__key__", "txt", "json")
    table = pa.table({c: pa.array([s.get(c) for s in samples], pa.string()) for c in columns})
    table = table.append_column(JSON_AT, pa.array([s.get(JSON_AT) for s in samples], pa.int64()))
    rows = table.to_pylist()  # as the rows read back
    keys = sorted({key for row in rows for key in json_keys(row["json"])})
    footer = {FIELDS_KEY: json.dumps(record_fields(rows)), JSON_KEYS_KEY: json.dumps(keys)}
    return table.replace_schema_metadata(footer)


Schema = tuple[dict[str, str], list[str]]  # (metadata field kinds, json keys, sorted)


def part_schema(candidates_url: str, parts: list[int], storage_options: dict) -> Schema:
    """Field kinds and json keys of some partitions' candidate metadata (a task body)."""
    fields: dict[str, str] = {}
    keys: set[str] = set()
    for part in parts:
        fs, path = filesystem(join(candidates_url, metadata_name(part)), storage_options)
        found, found_keys = with_retries(lambda: footer_schema(fs, path))  # noqa: B023
        if found is None or found_keys is None:  # by an older mmcurate: from the rows
            rows = read_candidate_metadata(candidates_url, part, storage_options)
            found = record_fields(rows) if found is None else found
            if found_keys is None:
                found_keys = [key for row in rows for key in json_keys(row.get("json"))]
        fields = merge_fields(fields, found)
        keys.update(found_keys)
    return fields, sorted(keys)


def footer_schema(fs: Any, path: str) -> tuple[dict[str, str] | None, list[str] | None]:
    """The field kinds and json keys in a candidate metadata file's footer (None: absent)."""
    with fs.open(path, "rb") as f:
        footer = pq.ParquetFile(f).schema_arrow.metadata or {}
    fields = json.loads(footer[FIELDS_KEY]) if FIELDS_KEY in footer else None
    keys = json.loads(footer[JSON_KEYS_KEY]) if JSON_KEYS_KEY in footer else None
    return fields, keys


def plan_shard_schema(
    candidates_url: str, parts: list[int], storage_options: dict, runner: Runner
) -> Schema:
    """The build's metadata fields and json keys, from every listed partition's candidates,
    in tasks of a few partitions each; pass them as each shard spec's `fields` and
    `json_keys`. The driver holds one footer's worth per task, never the rows."""
    per_task = max(1, -(-len(parts) // (4 * runner.parallelism)))
    calls = [
        (candidates_url, parts[i : i + per_task], storage_options)
        for i in range(0, len(parts), per_task)
    ]
    fields, keys = row_fields([]), set()
    for found, found_keys in runner.run(part_schema, calls):
        fields = merge_fields(fields, found)
        keys.update(found_keys)
    return fields, sorted(keys)


def plan_metadata_fields(
    candidates_url: str, parts: list[int], storage_options: dict, runner: Runner
) -> dict[str, str]:
    """The build's metadata fields alone (plan_shard_schema)."""
    return plan_shard_schema(candidates_url, parts, storage_options, runner)[0]


def metadata_table(
    rows: list[dict[str, Any]], fields: dict[str, str] | None = None, keys: list[str] | None = None
) -> pa.Table:
    """Rows as a table with the given field kinds (else the rows' own): `key` first, the rest
    sorted by name. JSON-kind columns hold JSON text; a row missing a field holds null. The
    footer keeps the kinds and the build's json keys (pipeline/output/hf_features.py)."""
    fields = row_fields(rows) if fields is None else fields
    names = sorted(fields, key=lambda n: (n != "key", n))
    table = pa.table(
        {name: metadata_column([row.get(name) for row in rows], fields[name]) for name in names},
        schema=pa.schema([(name, ARROW_TYPES[fields[name]]) for name in names]),
    )
    footer = {FIELDS_KEY: json.dumps(fields)}
    if keys is not None:
        footer[JSON_KEYS_KEY] = json.dumps(keys)
    return table.replace_schema_metadata(footer)


def metadata_column(values: list[Any], kind: str) -> pa.Array:
    if kind == "json":
        values = [None if v is None else json.dumps(v, ensure_ascii=False) for v in values]
    return pa.array(values, ARROW_TYPES[kind])

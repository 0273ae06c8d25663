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

from core.formats import sample_meta
from core.mapreduce import Runner
from core.storage import (
    filesystem,
    join,
    with_retries,
)

FIELDS_KEY = b"mmcurate.fields"  # in a candidate metadata file's footer: its field kinds


def metadata_name(part: int) -> str:
    return f"part-{part:06d}.parquet"


def spec_metadata(candidates_url: str, spec: dict, storage_options: dict) -> list[dict]:
    """Per-sample metadata rows of the spec's samples, from the candidates' metadata tables."""
    rows: list[dict[str, Any]] = []
    for part, spans in spec["parts"]:
        by_key = {
            r["__key__"]: r for r in read_candidate_metadata(candidates_url, part, storage_options)
        }
        rows.extend(metadata_row(by_key[key]) for key, _, _ in spans)
    return rows


def read_candidate_metadata(candidates_url: str, part: int, storage_options: dict) -> list[dict]:
    fs, path = filesystem(join(candidates_url, metadata_name(part)), storage_options)
    blob = with_retries(lambda: fs.cat_file(path))
    return pq.ParquetFile(io.BytesIO(blob)).read().to_pylist()  # read_table: +pyarrow.dataset


def metadata_row(record: dict[str, Any]) -> dict[str, Any]:
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
    samples; the footer carries their field kinds, so the build's schema is planned from
    footers alone (`part_fields`)."""
    columns = ("__key__", "txt", "json")
    table = pa.table({c: pa.array([s.get(c) for s in samples], pa.string()) for c in columns})
    fields = record_fields(table.to_pylist())  # as the rows read back
    return table.replace_schema_metadata({FIELDS_KEY: json.dumps(fields)})


def part_fields(candidates_url: str, parts: list[int], storage_options: dict) -> dict[str, str]:
    """Field kinds of some partitions' candidate metadata (a task body)."""
    fields: dict[str, str] = {}
    for part in parts:
        fs, path = filesystem(join(candidates_url, metadata_name(part)), storage_options)
        found = with_retries(lambda: footer_fields(fs, path))  # noqa: B023
        if found is None:  # written without them (by an older mmcurate): from the rows
            rows = read_candidate_metadata(candidates_url, part, storage_options)
            found = record_fields(rows)
        fields = merge_fields(fields, found)
    return fields


def footer_fields(fs: Any, path: str) -> dict[str, str] | None:
    """The field kinds in a candidate metadata file's footer; None if it has none."""
    with fs.open(path, "rb") as f:
        footer = pq.ParquetFile(f).schema_arrow.metadata or {}
    return json.loads(footer[FIELDS_KEY]) if FIELDS_KEY in footer else None


def plan_metadata_fields(
    candidates_url: str, parts: list[int], storage_options: dict, runner: Runner
) -> dict[str, str]:
    """The build's metadata fields, from every listed partition's candidates, in tasks of a
    few partitions each; pass the result as each shard spec's `fields`."""
    per_task = max(1, -(-len(parts) // (4 * runner.parallelism)))
    calls = [
        (candidates_url, parts[i : i + per_task], storage_options)
        for i in range(0, len(parts), per_task)
    ]
    fields = row_fields([])
    for found in runner.run(part_fields, calls):
        fields = merge_fields(fields, found)
    return fields


def metadata_table(rows: list[dict[str, Any]], fields: dict[str, str] | None = None) -> pa.Table:
    """Rows as a table with the given field kinds (else the rows' own): `key` first, the rest
    sorted by name. JSON-kind columns hold JSON text; a row missing a field holds null."""
    fields = row_fields(rows) if fields is None else fields
    names = sorted(fields, key=lambda n: (n != "key", n))
    return pa.table(
        {name: metadata_column([row.get(name) for row in rows], fields[name]) for name in names},
        schema=pa.schema([(name, ARROW_TYPES[fields[name]]) for name in names]),
    )


def metadata_column(values: list[Any], kind: str) -> pa.Array:
    if kind == "json":
        values = [None if v is None else json.dumps(v, ensure_ascii=False) for v in values]
    return pa.array(values, ARROW_TYPES[kind])

"""One metadata schema for every shard of a build (pure: local files, no Ray)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from mmcurate.core.mapreduce import LocalRunner
from mmcurate.pipeline.output.shard_metadata import (
    FIELDS_KEY,
    candidate_metadata,
    merge_kind,
    metadata_name,
    metadata_row,
    metadata_table,
    plan_metadata_fields,
    row_fields,
    value_kind,
)
from mmcurate.pipeline.output.shards import HashingWriter

# Two shards' worth of rows that disagree in every way a per-shard inference gets wrong.
FIRST = [
    {"key": "a", "caption": "x", "width": 4, "gone": None, "mixed": 1, "num": 1, "tags": ["t"]},
    {"key": "b", "caption": None, "width": 5, "gone": None, "mixed": 2, "num": 2, "tags": None},
]
SECOND = [
    {"key": "c", "caption": "y", "width": 6, "gone": "now", "mixed": "s", "num": 2.5, "late": True},
    {"key": "d", "caption": "z", "width": None, "mixed": {"o": 1}, "num": 2**70, "late": False},
]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "null"),
        (True, "bool"),
        (3, "int"),
        (2**63, "json"),
        (-(2**63), "int"),
        (1.5, "float"),
        (float("nan"), "float"),
        ("s", "string"),
        ([1], "json"),
        ({}, "json"),
    ],
)
def test_value_kinds(value, kind):
    assert value_kind(value) == kind


def test_kinds_merge_to_the_narrowest_type_holding_both():
    assert merge_kind("null", "int") == merge_kind("int", "null") == "int"
    assert merge_kind("int", "float") == "float"
    assert merge_kind("bool", "int") == merge_kind("string", "int") == "json"
    assert merge_kind("json", "null") == "json"


def test_shards_share_one_schema_and_read_as_one_table(tmp_path):
    fields = row_fields(FIRST + SECOND)
    assert fields == {
        "key": "string",
        "caption": "string",
        "width": "int",
        "gone": "string",
        "mixed": "json",
        "num": "json",  # 2**70 only fits as JSON text
        "tags": "json",
        "late": "bool",
    }
    for i, rows in enumerate((FIRST, SECOND)):
        pq.write_table(metadata_table(rows, fields), tmp_path / f"shard-{i:06d}.parquet")
    files = sorted(str(p) for p in tmp_path.glob("shard-*.parquet"))
    table = ds.dataset(files, format="parquet").to_table()
    assert table.num_rows == 4 and table.column_names[0] == "key"
    assert table.schema.field("width").type == pa.int64()
    assert table.schema.field("late").type == pa.bool_()
    assert table["mixed"].to_pylist() == ["1", "2", '"s"', '{"o": 1}']
    assert table["late"].to_pylist() == [None, None, True, False]
    got = duckdb.sql(f"SELECT key, gone, tags FROM read_parquet({files!r}) ORDER BY key")
    assert got.fetchall() == [
        ("a", None, '["t"]'),
        ("b", None, None),
        ("c", "now", None),
        ("d", None, None),
    ]


def test_without_planned_fields_a_shard_still_writes_its_own_rows():
    table = metadata_table(SECOND)
    assert table.num_rows == 2 and table.schema.field("num").type == pa.string()


def candidate_records(part: int, rows: list[dict]) -> list[dict]:
    """Phase A's candidate metadata records for `rows`, plus one whose JSON is broken."""
    records = [
        {
            "__key__": r["key"],
            "txt": r["caption"],
            "json": json.dumps({k: v for k, v in r.items() if k not in ("key", "caption")}),
        }
        for r in rows
    ]
    return [*records, {"__key__": f"bad{part}", "txt": None, "json": "[not an object"}]


@pytest.mark.parametrize("footers", ["none", "all", "some"])
def test_fields_are_planned_from_every_partitions_candidates(tmp_path, footers):
    """From the field kinds phase A put in each file's footer, or from the rows of a file
    written without them (an older mmcurate's unfinished build): the same schema."""
    for part, rows in enumerate((FIRST, SECOND, [])):
        records = candidate_records(part, rows)
        if footers == "all" or (footers == "some" and part == 1):
            table = candidate_metadata(records)
            assert json.loads(table.schema.metadata[FIELDS_KEY]) == row_fields(
                [metadata_row(r) for r in records]
            )
        else:
            columns = ("__key__", "txt", "json")
            table = pa.table({c: pa.array([r[c] for r in records], pa.string()) for c in columns})
        pq.write_table(table, tmp_path / metadata_name(part))
    planned = plan_metadata_fields(str(tmp_path), [0, 1, 2], {}, LocalRunner())
    assert planned == row_fields(FIRST + SECOND)
    assert metadata_row({"__key__": "k", "txt": "c", "json": '"str"'}) == {
        "key": "k",
        "caption": "c",
    }


def test_planned_fields_come_from_the_footer_when_it_has_them(tmp_path):
    """The footer is what is read: rows are not parsed again in the driver."""
    table = candidate_metadata(candidate_records(0, FIRST))
    footer = {FIELDS_KEY: json.dumps({"key": "string", "caption": "string", "only": "bool"})}
    pq.write_table(table.replace_schema_metadata(footer), tmp_path / metadata_name(0))
    planned = plan_metadata_fields(str(tmp_path), [0], {}, LocalRunner())
    assert planned == {"key": "string", "caption": "string", "only": "bool"}


def test_hashing_writer_hashes_exactly_the_bytes_written_in_order(tmp_path):
    blocks = [os.urandom(n) for n in (0, 1, 5000, 3 << 20, 17, 1 << 20)]
    with open(tmp_path / "f", "wb") as target, HashingWriter(target) as out:
        for block in blocks:
            out.write(block)
    written = (tmp_path / "f").read_bytes()
    assert written == b"".join(blocks) and out.size == len(written)
    assert out.sha256 == hashlib.sha256(written).hexdigest()


@pytest.mark.parametrize("mode", ["wb", "ab"])  # "ab": the kernel refuses, the plain way runs
def test_hashing_writer_copies_runs_of_a_local_file_between_writes(tmp_path, mode):
    source = tmp_path / "candidate.tar"
    source.write_bytes(os.urandom(5 << 20))
    data = source.read_bytes()
    runs = [(0, 10), (10, 512), (4096, 3 << 20), ((3 << 20) + 7, 5 << 20)]
    with open(tmp_path / "f", mode) as target, HashingWriter(target) as out:
        out.write(b"head")
        out.copy_runs(str(source), runs[:2])
        out.copy_runs(str(source), [])
        out.write(b"middle")
        out.copy_runs(str(source), runs[2:])
        out.write(b"\0" * 1024)
    expected = b"head" + data[:512] + b"middle" + data[4096 : 3 << 20] + data[(3 << 20) + 7 :]
    written = (tmp_path / "f").read_bytes()
    assert written == expected + b"\0" * 1024 and out.size == len(written)
    assert out.sha256 == hashlib.sha256(written).hexdigest()


def test_a_candidate_shorter_than_its_spans_fails_the_shard(tmp_path):
    source = tmp_path / "candidate.tar"
    source.write_bytes(b"x" * 1000)
    with pytest.raises(OSError, match="ended at byte 1000"):
        with open(tmp_path / "f", "wb") as target, HashingWriter(target) as out:
            out.copy_runs(str(source), [(0, 1500)])


SHRINKS_WHILE_COPIED = """
import os, sys
from mmcurate.pipeline.output.shards import HashingWriter

source, target = sys.argv[1], sys.argv[2]


class ShrinksTheSource:
    # A target whose second flush (the end of the first copied run) truncates the candidate,
    # as another process could while a shard is being written.
    def __init__(self, file):
        self.file, self.flushes = file, 0

    def write(self, data):
        return self.file.write(data)

    def fileno(self):
        return self.file.fileno()

    def flush(self):
        self.file.flush()
        self.flushes += 1
        if self.flushes == 2:
            os.truncate(source, 4096)


with open(target, "wb") as file:
    try:
        with HashingWriter(ShrinksTheSource(file)) as out:
            out.copy_runs(source, [(0, 1 << 20), (1 << 20, 8 << 20)])
    except OSError as err:
        print("OSError", err)
"""


def test_a_candidate_that_shrinks_while_copied_fails_the_shard_not_the_process(tmp_path):
    """The runs used to be hashed from a map of the candidate: a file shrinking under it
    killed the shard worker with SIGBUS. Now it is an OSError the task's retry handles."""
    source = tmp_path / "candidate.tar"
    source.write_bytes(os.urandom(8 << 20))
    done = subprocess.run(
        [sys.executable, "-c", SHRINKS_WHILE_COPIED, str(source), str(tmp_path / "f")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("OSError candidate ended at byte")

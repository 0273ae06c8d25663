"""Planning a URL list streams it (pipeline/sources/infer.py) and finds what a whole-file read
finds: the same rows, column names and schema per partition. The expected values come from
pyarrow reading each whole file at once (pipeline/source_tables.read_table, which partitions
and staging still use); the streaming side reads in blocks of a few dozen bytes here, so
every file is many blocks and types change between blocks."""

from __future__ import annotations

import gzip
import io
import json

import fsspec
import pytest
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources import infer as source_infer
from mmcurate.pipeline.sources import infer_json
from mmcurate.pipeline.sources import ranges as source_ranges
from mmcurate.pipeline.sources.csv_lists import BAD_ROW
from mmcurate.pipeline.sources.ranges import json_rows, unpack_schema
from mmcurate.pipeline.sources.urls import list_shape, needed_columns, plan_urls, read_table

FS = fsspec.filesystem("file")
ROWS = 40


@pytest.fixture(autouse=True)
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(source_infer, "BLOCK", 64)
    monkeypatch.setattr(infer_json, "TEXT_BLOCK", 16)
    monkeypatch.setattr(source_infer, "GROUP_ROWS", 3)
    monkeypatch.setattr(infer_json, "GROUP_ROWS", 3)
    monkeypatch.setattr(source_ranges, "BLOCK", 32)


def csv_text(values: list[str], sep: str = ",") -> bytes:
    lines = [sep.join(["url", "caption", "x"])]
    lines += [sep.join([f"http://h/{i}.jpg", f"cap {i}", v]) for i, v in enumerate(values)]
    return ("\n".join(lines) + "\n").encode()


def half(first: str, second: str) -> list[str]:
    return [first] * (ROWS // 2) + [second] * (ROWS // 2)


CSV_CASES = {
    "int_then_text": half("7", "abc"),
    "int_then_bool": half("1", "true"),
    "ints_then_bool": [str(i % 3) for i in range(ROWS // 2)] + ["true"] * (ROWS // 2),
    "zero_one_then_bool": half("0", "false"),
    "int_then_float": half("3", "2.5"),
    "int_then_20_digits": half("5", "18446744073709551617"),
    "date_then_timestamp": half("2021-01-02", "2021-01-02 03:04:05"),
    "timestamp_then_zoned": half("2021-01-02 03:04:05", "2021-01-02T03:04:05Z"),
    "seconds_then_nanoseconds": half("2021-01-02 03:04:05", "2021-01-02 03:04:05.123456789"),
    "time_then_text": half("12:00:00", "noon"),
    "empty_then_int": half("", "4"),
    "all_empty": half("", ""),
    "float_then_date": half("1.5", "2021-01-02"),
}


def expected_plan(path: str, cfg: SourceConfig) -> tuple[int, list[str] | None, object]:
    table = read_table(FS, path, (cfg.url_column, cfg.caption_column))
    return table.num_rows, needed_columns(table.column_names, path, cfg), table.schema


def check_plan(path: str, read: str) -> None:
    cfg = SourceConfig(kind="urls", path=path, files_per_task=7)
    rows, columns, schema = expected_plan(path, cfg)
    parts = plan_urls(cfg, {})
    assert sum(p.count for p in parts) == rows
    assert {p.read for p in parts} == {read}
    for part in parts:
        assert part.to_dict()["columns"] == columns
        if read == "bytes":
            assert unpack_schema(part.schema) == schema


@pytest.mark.parametrize("case", sorted(CSV_CASES))
def test_csv_columns_unify_across_blocks_as_a_whole_file_read_infers(tmp_path, case):
    path = tmp_path / "list.csv"
    path.write_bytes(csv_text(CSV_CASES[case]))
    check_plan(str(path), "bytes")


def test_csv_bad_rows_tsv_quoted_newlines_and_gzip_plan_as_a_whole_file_read(tmp_path):
    values = half("1", "x")
    values[25] = "2,extra"  # a row with a field too many: a BAD_ROW row
    bad = tmp_path / "bad.csv"
    bad.write_bytes(csv_text(values))
    check_plan(str(bad), "bytes")
    assert BAD_ROW in list_shape(FS, str(bad)).names
    tsv = tmp_path / "list.tsv"
    tsv.write_bytes(csv_text(half("1", "2.5"), "\t"))
    check_plan(str(tsv), "bytes")
    quoted = tmp_path / "quoted.csv"
    quoted.write_bytes(csv_text(half("1", '"two\nlines"')))
    check_plan(str(quoted), "whole")  # staged: rows are not one line each
    packed = tmp_path / "list.csv.gz"
    packed.write_bytes(gzip.compress(csv_text(values)))
    check_plan(str(packed), "whole")


def jsonl(rows: list[dict | str]) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def with_x(first: object, second: object) -> list[dict]:
    return [
        {"url": f"http://h/{i}.jpg", "caption": f"c{i}", "x": first if i < ROWS // 2 else second}
        for i in range(ROWS)
    ]


JSON_CASES = {
    "int_then_text": with_x(1, "a"),  # pyarrow fails: Python's json types it as text
    "int_then_float": with_x(1, 2.5),  # pyarrow promotes
    "timestamp_then_text": with_x("2021-01-02 03:04:05", "later"),
    "null_then_int": with_x(None, 3),
    "struct_fields_grow": with_x({"a": 1}, {"b": "s"}),
    "struct_int_then_float": with_x({"a": 1}, {"a": 1.5}),
    "list_int_then_float": with_x([1], [2.5]),
    "list_then_text": with_x([1], "no"),
    "huge_int": with_x(1, 2**64),  # pyarrow widens it to a double: read by Python, as text
    "big_then_float": with_x(2**63 + 1, 1.5),
    "bool_then_int": with_x(True, 1),
    "nested_mixed": with_x({"a": [1]}, {"a": ["s"]}),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_jsonl_columns_unify_across_blocks_as_json_table_reads_them(tmp_path, case):
    path = tmp_path / "list.jsonl"
    path.write_bytes(jsonl(JSON_CASES[case]))
    check_plan(str(path), "bytes")


def test_jsonl_bad_lines_bytes_blank_lines_and_gzip_plan_as_a_whole_file_read(tmp_path):
    rows: list[dict | str] = list(with_x(1, 2))
    rows[7] = "{not json}"  # a BAD_ROW row (shaped as an object: still one a line)
    rows.insert(12, "   ")  # a blank line
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl(rows))
    check_plan(str(bad), "bytes")
    assert BAD_ROW in list_shape(FS, str(bad)).names
    raw = tmp_path / "raw.jsonl"  # bytes that are not UTF-8, and an escaped lone surrogate
    text = jsonl(with_x("a", "b")).replace(b'"c3"', b'"\xff\xfe"').replace(b'"c30"', b'"\\ud800"')
    raw.write_bytes(text)
    check_plan(str(raw), "bytes")
    multi = tmp_path / "multi.jsonl"  # an object over two lines: staged
    multi.write_bytes(jsonl(with_x(1, "a")).replace(b', "x"', b',\n"x"', 1))
    check_plan(str(multi), "whole")
    packed = tmp_path / "list.jsonl.gz"
    packed.write_bytes(gzip.compress(jsonl(with_x(1, "a"))))
    check_plan(str(packed), "whole")


TEXTS = [
    b'{"a": 1}\n{"a": "x\xc3\xa9y"}\n',
    b'{"a": 1} {"b": 2}\n{"c"\n: 3}\n',
    b'{"a": [1,\n2]}\nnot json\n{"b": 1}, {"c": 2}\n5\n"str"\n',
    b'{"a": "unterminated\n{"b": 1}\n',
    b'{"a": 1}\n{"b": nul\n{"c": true}',
    b"\n\n  \n",
    b"[[[[[[[[[[[[[[[[[[[[[[[[\n" + b'{"d": 1e5}\n{"e": -Infinity}\n{"f": NaN}',
    b'{"g": "\\ud800"}\n{"h": "\xff"}\n{"i": 1',
]


@pytest.mark.parametrize("block", [1, 2, 5, 64])
def test_json_objects_streams_the_rows_json_rows_reads_whole(block):
    for text in TEXTS:
        assert list(infer_json.json_objects(io.BytesIO(text), block)) == list(json_rows(text))

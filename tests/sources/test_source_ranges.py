"""Partition reads of URL lists (issue 19): each partition reads only its rows, and every
sample (key, url, caption, json, drop reason) equals what the whole-file reader gave before.

`reference_rows` is that earlier reader, kept here verbatim in what it did: every partition
read the whole file and sliced its rows.
"""

import gzip
import json

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.ranges import LineScan, groups_for, scan_rows
from mmcurate.pipeline.sources.records import UrlPartition
from mmcurate.pipeline.sources.staging import stage_sources
from mmcurate.pipeline.sources.synth import laion_like_table, write_csv_list, write_parquet_list
from mmcurate.pipeline.sources.urls import plan_urls, read_urls, url_sample
from mmcurate.stages.base import DROP

from tests.kit_sources import read_all

COLUMNS = {"url_column": "URL", "caption_column": "TEXT"}


def reference_table(path: str, fmt: str, text_columns=("URL", "TEXT")) -> pa.Table:
    """The pre-issue-19 whole-file read (pipeline/source_urls.read_table as it was)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as src:
        if fmt == "parquet":
            return pq.read_table(src)
        if fmt == "jsonl":
            return pajson.read_json(src)
        parse = pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", newlines_in_values=True)
        names = pacsv.open_csv(src, parse_options=parse).schema.names
    with opener(path, "rb") as src:
        types = {c: pa.binary() for c in text_columns if c in names}
        return pacsv.read_csv(
            src, parse_options=parse, convert_options=pacsv.ConvertOptions(column_types=types)
        )


def reference_rows(path: str, fmt: str, per_task: int) -> list[tuple]:
    table = reference_table(path, fmt)
    rows = []
    for start in range(0, table.num_rows, per_task):
        part = hand_made_part()
        for index, row in enumerate(table.slice(start, per_task).to_pylist()):
            rows.append(sample_tuple(url_sample(row, part, start + index)))
    return rows


def hand_made_part() -> UrlPartition:
    """A partition of a URL list with columns URL and TEXT (what `url_sample` reads of it)."""
    return UrlPartition(
        kind="urls",
        number=0,
        file="",
        start=0,
        count=0,
        first_key=0,
        protocol="file",
        url_column="URL",
        caption_column="TEXT",
    )


def sample_tuple(sample: dict) -> tuple:
    return (sample["__key__"], sample["url"], sample["txt"], sample["json"], sample.get(DROP))


def new_rows(cfg: SourceConfig, work=None) -> tuple[list[tuple], list[UrlPartition]]:
    rows, parts = read_all(cfg, work)
    return [sample_tuple(row) for row in rows], parts


def test_groups_for_covers_exactly_the_rows():
    starts = [0, 300, 600, 600, 900, 1000]  # an empty row group in the middle
    for first in range(0, 1000, 7):
        for count in (1, 37, 256, 400):
            count = min(count, 1000 - first)
            groups, skip = groups_for(starts, first, count)
            assert starts[groups[0]] + skip == first
            assert starts[groups[-1] + 1] >= first + count
            assert all(starts[g + 1] > starts[g] for g in groups)


@pytest.fixture(scope="module")
def laion(tmp_path_factory):
    """2,000 LAION-like rows (nulls, nine columns), with a bool and a timestamp column."""
    table = laion_like_table(2000)
    flags = pa.array([i % 3 == 0 if i % 11 else None for i in range(2000)])
    when = pa.array([1_600_000_000 + 3600 * i for i in range(2000)], pa.timestamp("s"))
    table = table.append_column("flag", flags).append_column("when", when)
    return table, tmp_path_factory.mktemp("lists")


def test_parquet_reads_only_its_row_groups_and_matches_the_whole_file_reader(laion):
    table, folder = laion
    path = folder / "rg300.parquet"
    write_parquet_list(table, path, 300)  # 300 does not divide the partition size
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=256, **COLUMNS)
    rows, parts = new_rows(cfg)
    assert rows == reference_rows(str(path), "parquet", 256)
    assert {p.read for p in parts} == {"row_groups"}
    assert all(len(p.groups) <= 2 for p in parts)  # never the whole file
    assert parts[1].groups == (0, 1) and parts[1].skip == 256


def test_carry_columns_reads_and_carries_only_those(laion, tmp_path):
    table, folder = laion
    path = folder / "rg300.parquet"
    write_parquet_list(table, path, 300)
    cfg = SourceConfig(
        kind="urls", path=str(path), files_per_task=100, carry_columns=["NSFW"], **COLUMNS
    )
    rows, parts = new_rows(cfg)
    assert parts[0].columns == ("URL", "TEXT", "NSFW")
    meta = json.loads(rows[5][3])
    assert set(meta) == {"key", "url", "caption", "NSFW"}
    assert meta["NSFW"] == table.column("NSFW")[5].as_py()
    with pytest.raises(ConfigError, match="source.carry_columns: no column 'nope'"):
        plan_urls(cfg.model_copy(update={"carry_columns": ["nope"]}), {})


def test_huge_row_groups_are_staged_one_file_per_partition(laion, tmp_path):
    table, folder = laion
    path = folder / "rg2000.parquet"
    write_parquet_list(table, path, 2000)  # one row group of 20 partitions
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=100, **COLUMNS)
    before, parts = new_rows(cfg)  # not staged yet: each reads the row group, same rows
    assert all(p.stage is not None and p.staged_url is None for p in parts)
    rows, parts = new_rows(cfg, work=tmp_path / "_work")
    assert rows == before == reference_rows(str(path), "parquet", 100)
    assert len(list((tmp_path / "_work" / parts[0].stage).glob("*.parquet"))) == 20
    mark = tmp_path / "_work" / parts[0].stage / "done.json"
    written = mark.stat().st_mtime_ns
    stage_sources(parts, str(tmp_path / "_work"), {})  # a resumed build reuses the copy
    assert mark.stat().st_mtime_ns == written


@pytest.mark.parametrize("name", ["a.csv", "a.tsv", "a.jsonl"])
def test_plain_text_reads_byte_ranges_and_matches(laion, tmp_path, name):
    table, _ = laion
    path = tmp_path / name
    text_list(table, path)
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=256, **COLUMNS)
    rows, parts = new_rows(cfg)
    assert rows == reference_rows(str(path), name.rpartition(".")[2], 256)
    assert {p.read for p in parts} == {"bytes"}
    size = path.stat().st_size
    header = parts[0].header  # csv/tsv: the header line, read by every partition
    assert sum(p.byte_range[1] - p.byte_range[0] for p in parts) == size - header  # each byte once


def text_list(table: pa.Table, path) -> None:
    name = str(path).removesuffix(".gz")
    if name.endswith(".jsonl"):
        rows = table.drop_columns(["when"]).to_pylist()
        data = "".join(json.dumps(r) + ("\n\n" if i == 7 else "\n") for i, r in enumerate(rows))
        path.write_bytes(
            gzip.compress(data.encode()) if str(path).endswith(".gz") else data.encode()
        )
    elif name.endswith(".tsv"):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink, pacsv.WriteOptions(delimiter="\t"))
        path.write_bytes(sink.getvalue().to_pybytes().replace(b"\n", b"\r\n"))
    else:
        write_csv_list(table, path)


@pytest.mark.parametrize("name", ["a.csv.gz", "a.jsonl.gz"])
def test_gzip_is_staged_once_and_matches(laion, tmp_path, name):
    table, _ = laion
    path = tmp_path / name
    text_list(table, path)
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=256, **COLUMNS)
    rows, parts = new_rows(cfg, work=tmp_path / "out" / "_work")
    fmt = name.removesuffix(".gz").rpartition(".")[2]
    assert rows == reference_rows(str(path), fmt, 256)
    assert all(p.staged_url.startswith(str(tmp_path / "out" / "_work" / "source")) for p in parts)


def test_quoted_newlines_fall_back_to_staging(tmp_path, caplog):
    lines = ["URL,TEXT,n", 'http://127.0.0.1:9/0.jpg,"two\nlines",1', ""]
    lines += [f"http://127.0.0.1:9/{i}.jpg,caption {i},{i}" for i in range(1, 30)]
    path = tmp_path / "q.csv"
    path.write_text("\n".join(lines) + "\n")
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=8, **COLUMNS)
    rows, parts = new_rows(cfg, work=tmp_path / "_work")
    assert "quoted newlines" in caplog.text
    assert {p.read for p in parts} == {"whole"} and all(p.staged_url is not None for p in parts)
    assert rows == reference_rows(str(path), "csv", 8)
    assert rows[0][2] == "two\nlines"


def test_line_scan_blank_lines_crlf_and_no_final_newline(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"a,b\r\n\r\n1,x\r\n2,y\n\n3,z\r\n\n4,w")
    import fsspec

    scan = scan_rows(fsspec.filesystem("file"), str(path), 2, header=True)
    assert scan.data_rows == 4 and not scan.lone_cr
    assert scan.starts == [7, 17]  # rows 1,x and 3,z
    assert scan.data_start == 7


def test_on_s3_partitions_read_their_rows_and_staging_writes_there(laion, s3, s3_bucket, tmp_path):
    """The same reads through s3fs on SeaweedFS: parquet row groups (uncached ranged GETs),
    csv byte ranges, and a gzipped list staged under an S3 `_work/`."""
    table, folder = laion
    fs, options = s3.filesystem(), s3.storage_options
    write_parquet_list(table, tmp_path / "a.parquet", 300)
    text_list(table, tmp_path / "a.csv")
    text_list(table, tmp_path / "b.csv.gz")
    for name in ("a.parquet", "a.csv", "b.csv.gz"):
        fs.put_file(str(tmp_path / name), f"{s3_bucket}/lists/{name}")
        cfg = SourceConfig(
            kind="urls", path=f"s3://{s3_bucket}/lists/{name}", files_per_task=256, **COLUMNS
        )
        parts = plan_urls(cfg, options)
        assert parts[0].file_version == fs.info(f"{s3_bucket}/lists/{name}")["ETag"]
        parts = stage_sources(parts, f"s3://{s3_bucket}/out/_work", options)
        rows = []
        for part in parts:
            batch = read_urls(part, options)
            columns = zip(*batch.values(), strict=True)
            rows += [sample_tuple(dict(zip(batch, v, strict=True))) for v in columns]
        fmt = "parquet" if name.endswith(".parquet") else "csv"
        assert rows == reference_rows(str(tmp_path / name), fmt, 256), name
    assert fs.glob(f"{s3_bucket}/out/_work/source/*/done.json")  # the gzipped list, staged


def small_list(path, captions: list[str]) -> None:
    """A URL list of these captions in the format its name says (gzipped if `.gz`)."""
    rows = [{"URL": f"http://127.0.0.1:9/{i}.jpg", "TEXT": c} for i, c in enumerate(captions)]
    name = str(path).removesuffix(".gz")
    if name.endswith(".parquet"):
        write_parquet_list(pa.Table.from_pylist(rows), path, 1000)
        return
    if name.endswith(".jsonl"):
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    else:
        data = ("URL,TEXT\n" + "".join(f"{r['URL']},{r['TEXT']}\n" for r in rows)).encode()
    path.write_bytes(gzip.compress(data) if str(path).endswith(".gz") else data)


@pytest.mark.parametrize("name", ["a.csv.gz", "a.csv", "a.jsonl", "a.parquet"])
def test_a_changed_list_changes_the_plan_and_is_never_read_from_a_stale_copy(tmp_path, name):
    """Size and ETag/mtime are in every plan entry (so the build identity changes: the build
    refuses without --overwrite) and in the staged folder's name (gz: restaged, new rows)."""
    path, work = tmp_path / name, tmp_path / "_work"
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=2, **COLUMNS)
    small_list(path, ["old1", "old2", "old3"])
    before, old_parts = new_rows(cfg, work=work)
    assert all({"file_size", "file_version"} <= set(p.to_dict()) for p in old_parts)
    small_list(path, ["NEW1", "NEW2", "NEW3-longer"])
    after, parts = new_rows(cfg, work=work)
    assert [p.file_size for p in parts] != [p.file_size for p in old_parts]
    assert [r[2] for r in before] == ["old1", "old2", "old3"]
    assert [r[2] for r in after] == ["NEW1", "NEW2", "NEW3-longer"]
    if name.endswith(".gz"):
        assert parts[0].stage != old_parts[0].stage
        assert all(p.staged_url.startswith(str(work / parts[0].stage)) for p in parts)


def test_jsonl_objects_sharing_a_line_are_staged_not_byte_planned(tmp_path):
    """Two objects on one line, a whitespace-only line (blank, as pyarrow reads it) and an
    object over two lines: line and object counts can agree, rows are not one per line."""
    u = "http://127.0.0.1:9/x.jpg"
    one = '{"URL":"%s","TEXT":"%s"}'
    cases = {
        "two.jsonl": f"{one % (u, 'a')} {one % (u, 'a2')}\n\n{one % (u, 'b')}\n  \n"
        f"{one % (u, 'c')}\n",
        "split.jsonl": f'{one % (u, "a")} {one % (u, "a2")}\n{{"URL":"{u}",\n"TEXT":"b"}}\n \t\n',
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        for every in (1, 2, 3):
            cfg = SourceConfig(kind="urls", path=str(path), files_per_task=every, **COLUMNS)
            for work in (None, tmp_path / f"_work{every}"):
                rows, parts = new_rows(cfg, work=work)
                assert rows == reference_rows(str(path), "jsonl", every), (name, every)
                assert {p.read for p in parts} == {"whole"}
    ws = tmp_path / "ws.jsonl"  # whitespace-only lines alone: still byte ranges
    ws.write_text(f"{one % (u, 'a')}\n \t \n{one % (u, 'b')}\r\n\n{one % (u, 'c')}")
    cfg = SourceConfig(kind="urls", path=str(ws), files_per_task=2, **COLUMNS)
    rows, parts = new_rows(cfg)
    assert {p.read for p in parts} == {"bytes"}
    assert rows == reference_rows(str(ws), "jsonl", 2)


def test_line_scan_gives_the_same_answer_whatever_the_blocks():
    data = b'{"a":1}\n  \n\t{"a":2} \r\n\n{"a":3}{"a":4}\n {"a":\n5}\n \n{"a":6}'
    for json_mode in (False, True):
        whole = LineScan(2, header=False, json=json_mode)
        whole.feed(data, 0)
        whole.finish(len(data))
        for size in (1, 2, 3, 5, 8):
            scan = LineScan(2, header=False, json=json_mode)
            for offset in range(0, len(data), size):
                scan.feed(data[offset : offset + size], offset)
            scan.finish(len(data))
            assert (scan.rows, scan.starts, scan.one_per_line) == (
                whole.rows,
                whole.starts,
                whole.one_per_line,
            )
    assert whole.rows == 6 and not whole.one_per_line  # jsonl: 6 non-blank lines, 2 odd
    good = LineScan(1, header=False, json=True)
    text = b'{"a":1}\n \n {"a":2} \n'
    good.feed(text, 0)
    good.finish(len(text))
    assert (good.rows, good.starts, good.one_per_line) == (2, [0, 10], True)


def truncated_parquet(path) -> None:
    small_list(path, ["a", "b"])
    path.write_bytes(path.read_bytes()[:-20])


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [
        ("empty.parquet", lambda p: p.write_bytes(b""), "size is 0 bytes"),
        ("cut.parquet", truncated_parquet, "magic bytes not found"),
        # a 0-byte csv is an empty list, 0 rows (tests/sources/test_url_lists.py);
        # blank lines are not
        ("blank.csv", lambda p: p.write_bytes(b"\n\n"), "Empty CSV file"),
        ("quote.csv", lambda p: p.write_text('URL,TEXT\nu,"x"y,z\n'), "no row has the header's"),
        ("bad.jsonl", lambda p: p.write_text("URL,TEXT\nu,a\n"), "no line is a JSON object"),
        ("bad.csv.gz", lambda p: p.write_bytes(b"not gzip at all"), "gzip"),
    ],
)
def test_unreadable_lists_are_one_line_config_errors(tmp_path, name, make, reason):
    path = tmp_path / name
    make(path)
    fmt = name.removesuffix(".gz").rpartition(".")[2]
    cfg = SourceConfig(kind="urls", path=str(path), files_per_task=2, **COLUMNS)
    with pytest.raises(ConfigError) as err:
        plan_urls(cfg, {})
    message = str(err.value)
    assert message.startswith(f"source.path: {path}: not a readable {fmt} list (")
    assert reason in message and "\n" not in message

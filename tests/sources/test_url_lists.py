"""URL lists that are valid but awkward: a jsonl value whose JSON type differs from the rest of
its column, empty list files, and a list column named like the sample's own `key`, `url` or
`caption`. Real files in tmp_path, read as a build's partitions read them."""

import gzip
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig, SourceConfig
from mmcurate.pipeline.sources.urls import plan_urls
from mmcurate.stages.base import DROP

from tests.kit_sources import read_all

U = "http://127.0.0.1:9/x.jpg"


def jsonl(path, rows: list[dict]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


MIXED = [
    {"url": U, "caption": "a cat", "year": 2019, "tags": {"n": 1}, "score": 0.5},
    {"url": 12345, "caption": 2019, "year": "unknown", "tags": {"n": "x"}, "score": 1},
    {"url": U, "caption": ["a", 1], "year": None, "tags": None, "score": None},
    {"url": U, "caption": "a dog", "year": 2020, "tags": {"n": 2}, "score": 0.25},
]


# every partition size (one row a partition: row 0 reads with pyarrow, row 1 falls back), plain
# (byte ranges), gzipped unstaged (whole-file reads) and gzipped staged
@pytest.mark.parametrize("every", [1, 2, 3, 256])
@pytest.mark.parametrize(
    ("name", "staged"), [("a.jsonl", False), ("a.jsonl.gz", False), ("a.jsonl.gz", True)]
)
def test_jsonl_values_of_another_type_are_read_not_a_failed_build(tmp_path, every, name, staged):
    """Bug: pyarrow infers one type per column and aborted the plan on `"caption": 2019`."""
    jsonl(tmp_path / name, MIXED)
    cfg = SourceConfig(kind="urls", path=str(tmp_path / name), files_per_task=every)
    rows, parts = read_all(cfg, work=tmp_path / "_work" if staged else None)
    assert {p.read for p in parts} == ({"bytes"} if name == "a.jsonl" else {"whole"})
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(4)]
    assert [r["url"] for r in rows] == [U, "12345", U, U]  # download: not http -> dropped there
    assert [r["txt"] for r in rows] == ["a cat", "2019", '["a", 1]', "a dog"]
    assert all(r[DROP] is None for r in rows)
    meta = [json.loads(r["json"]) for r in rows]
    assert [m["year"] for m in meta] == ["2019", "unknown", None, "2020"]  # carried as text
    assert [m["tags"] for m in meta] == ['{"n": 1}', '{"n": "x"}', None, '{"n": 2}']
    assert [m["score"] for m in meta] == [0.5, 1.0, None, 0.25]  # one JSON type: a number


@pytest.mark.parametrize("every", [1, 256])
def test_jsonl_columns_not_carried_are_never_converted(tmp_path, every):
    """`carry_columns: []` reads url and caption only: another column's types cannot fail."""
    rows = [
        {"url": U, "caption": f"c{i}", "year": [2019, "unknown", True][i % 3]} for i in range(7)
    ]
    jsonl(tmp_path / "a.jsonl", rows)
    cfg = SourceConfig(
        kind="urls", path=str(tmp_path / "a.jsonl"), files_per_task=every, carry_columns=[]
    )
    got, parts = read_all(cfg)
    assert all(p.columns == ("url", "caption") for p in parts)
    assert [r["txt"] for r in got] == [f"c{i}" for i in range(7)]
    assert all(set(json.loads(r["json"])) == {"key", "url", "caption"} for r in got)


NOT_UTF8 = [  # raw lines: bytes that are not UTF-8, and an escaped lone surrogate
    b'{"url": "%s", "caption": "a cat", "n": 1}' % U.encode(),
    b'{"url": "%s", "caption": "bad \xff bytes", "n": 2}' % U.encode(),
    b'{"url": "%s", "caption": "lone \\ud800 escape", "n": 3}' % U.encode(),
    b'{"url": "http://127.0.0.1:9/\xfe.jpg", "caption": "ok", "n": 4}',
    b'{"url": "%s", "caption": "kept", "n": 5, "note": "x\xffy"}' % U.encode(),
]


@pytest.mark.parametrize("every", [1, 2, 256])
@pytest.mark.parametrize("mixed", [False, True], ids=["pyarrow", "fallback"])
@pytest.mark.parametrize(
    ("name", "staged"), [("a.jsonl", False), ("a.jsonl.gz", False), ("a.jsonl.gz", True)]
)
def test_jsonl_text_that_is_not_utf8_drops_its_row_only(tmp_path, every, mixed, name, staged):
    """Bug: a caption with a byte that is not UTF-8 ended the task with UnicodeDecodeError
    (pyarrow's json reader does not check UTF-8; converting the column did), and an escaped
    lone surrogate failed the whole list. Now, as for csv: `caption_not_utf8` or
    `url_not_utf8` for that row; an uncarried-by-name column keeps its text, with U+FFFD."""
    lines = list(NOT_UTF8)
    if mixed:  # a number among strings: the Python json reader's path
        lines.append(b'{"url": "%s", "caption": 2019, "n": "six"}' % U.encode())
    data = b"\n".join(lines) + b"\n"
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    cfg = SourceConfig(kind="urls", path=str(tmp_path / name), files_per_task=every)
    rows, _ = read_all(cfg, work=tmp_path / "_work" if staged else None)
    reasons = [r[DROP] for r in rows]
    assert reasons[:5] == [None, "caption_not_utf8", "caption_not_utf8", "url_not_utf8", None]
    assert [r["txt"] for r in rows][:1] == ["a cat"] and rows[4]["txt"] == "kept"
    assert json.loads(rows[4]["json"])["note"] == "x\ufffdy"
    assert len(rows) == len(lines) and (not mixed or rows[5]["txt"] == "2019")


BROKEN = [  # lines that are not one JSON object, each among good ones
    b"{oops",
    b'{"url": "%s", "caption": "two commas",, "n": 1}' % U.encode(),
    b"[1, 2, 3]",
    b'"just a string"',
    b"[" * 100_000,  # deeper than Python's json can go
    b'{"url": "%s", "caption": "cut short' % U.encode(),
]


@pytest.mark.parametrize("every", [1, 2, 3, 256])
@pytest.mark.parametrize("mixed", [False, True], ids=["one-type", "type-change"])
@pytest.mark.parametrize(
    ("name", "staged"), [("a.jsonl", False), ("a.jsonl.gz", False), ("a.jsonl.gz", True)]
)
def test_a_broken_jsonl_line_is_a_dropped_row_not_a_failed_list(
    tmp_path, every, mixed, name, staged
):
    """Bug: one line that was not a JSON object stopped the whole build (a config error at
    planning). Now each such line is one row, dropped as `bad_json_row`; the keys of the rows
    after it are their line numbers, as if the line had been good."""
    lines = []
    for i, broken in enumerate(BROKEN):
        caption = 2019 if mixed and i == 2 else f"c{i}"
        lines += [json.dumps({"url": U, "caption": caption, "n": i}).encode(), broken]
    data = b"\n".join(lines) + b"\n"
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    cfg = SourceConfig(kind="urls", path=str(tmp_path / name), files_per_task=every)
    rows, _ = read_all(cfg, work=tmp_path / "_work" if staged else None)
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(len(lines))]
    assert [r[DROP] for r in rows] == [None, "bad_json_row"] * len(BROKEN)
    assert [r["txt"] for r in rows[::2]] == [
        "2019" if mixed and i == 2 else f"c{i}" for i in range(len(BROKEN))
    ]
    assert all("__mmcurate" not in r["json"] for r in rows)


def test_a_jsonl_list_with_no_object_at_all_is_a_one_line_config_error(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("url,caption\nhttp://127.0.0.1:9/x.jpg,a cat\n")
    with pytest.raises(ConfigError) as err:
        plan_urls(SourceConfig(kind="urls", path=str(path)), {})
    assert str(err.value) == (
        f"source.path: {path}: not a readable jsonl list (no line is a JSON object)"
    )


@pytest.mark.parametrize(
    ("empty", "data"),
    [
        ("b.jsonl", b""),
        ("b.jsonl", b" \n\n"),
        ("b.jsonl.gz", gzip.compress(b"", mtime=0)),
        ("b.csv", b""),
        ("b.csv", b"url,caption\n"),
        ("b.csv.gz", gzip.compress(b"url,caption\n", mtime=0)),
    ],
    ids=["jsonl-0-bytes", "jsonl-blank", "jsonl-gz-0-bytes", "csv-0-bytes", "csv-header", "csv-gz"],
)
def test_an_empty_list_among_others_counts_as_zero_rows(tmp_path, empty, data):
    """Bug: a 0-byte jsonl part aborted the build (`Empty JSON file`)."""
    fmt = empty.split(".")[1]
    first, last = tmp_path / f"a.{fmt}", tmp_path / f"c.{fmt}"
    for path, start in ((first, 0), (last, 2)):
        rows = [{"url": f"{U}?{i}", "caption": f"c{i}"} for i in range(start, start + 2)]
        if fmt == "jsonl":
            jsonl(path, rows)
        else:
            path.write_text("url,caption\n" + "".join(f"{r['url']},{r['caption']}\n" for r in rows))
    (tmp_path / empty).write_bytes(data)
    cfg = SourceConfig(kind="urls", path=str(tmp_path / f"*.{fmt}*"), files_per_task=1)
    rows, parts = read_all(cfg, work=tmp_path / "_work")
    assert [r["txt"] for r in rows] == ["c0", "c1", "c2", "c3"]
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(4)]
    assert {p.file for p in parts} == {str(first), str(last)}


@pytest.mark.parametrize(
    ("names", "data"),
    [
        (["a.csv"], b"url,caption\n"),
        (["a.jsonl"], b""),
        (["a.csv", "b.csv"], b"url,caption\n"),
        (["a.parquet"], None),
    ],
    ids=["csv-header", "jsonl-0-bytes", "two-csv-headers", "parquet-0-rows"],
)
def test_lists_with_no_row_at_all_are_a_one_line_config_error(tmp_path, names, data):
    """Bug: a header-only csv was refused as `no input files in ...` though it exists."""
    folder = tmp_path / "lists"
    folder.mkdir()
    for name in names:
        if data is None:
            pq.write_table(
                pa.table({"url": pa.array([], pa.string()), "caption": []}), folder / name
            )
        else:
            (folder / name).write_bytes(data)
    pattern = str(folder / (names[0] if len(names) == 1 else "*"))
    with pytest.raises(ConfigError) as err:
        plan_urls(SourceConfig(kind="urls", path=pattern), {})
    lists = "the URL list has" if len(names) == 1 else f"the {len(names)} URL lists it matches"
    assert str(err.value) == f"source.path: {pattern}: {lists} no rows"
    spec = {"source": {"kind": "urls", "path": pattern}, "output": {"path": str(tmp_path / "o")}}
    with pytest.raises(ConfigError, match="no rows$"):  # what a build says (before Ray starts)
        run_build(BuildConfig.model_validate(spec), progress=False)


def test_a_list_column_named_key_url_or_caption_never_replaces_the_samples_own(tmp_path):
    """Bug: img2dataset's parquet has a `key` column, and `{"key": key, **row}` let it win."""
    table = pa.table(
        {
            "URL": [f"{U}?0", f"{U}?1"],
            "TEXT": ["a cat", "a dog"],
            "key": ["same", "same"],
            "url": ["http://other/0", None],
            "caption": ["old caption", "old"],
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    cfg = SourceConfig(
        kind="urls", path=str(tmp_path / "a.parquet"), url_column="URL", caption_column="TEXT"
    )
    rows, _ = read_all(cfg)
    meta = [json.loads(r["json"]) for r in rows]
    assert [m["key"] for m in meta] == [r["__key__"] for r in rows] == ["000000000", "000000001"]
    assert [m["url"] for m in meta] == [f"{U}?0", f"{U}?1"]
    assert [m["caption"] for m in meta] == ["a cat", "a dog"]
    assert [m["source_key"] for m in meta] == ["same", "same"]
    assert [m["source_url"] for m in meta] == ["http://other/0", None]
    assert [m["source_caption"] for m in meta] == ["old caption", "old"]


def test_built_samples_keep_their_own_key_in_json_tar_and_parquet(tmp_path):
    """The key column bug through a build (local runtime, no Ray): tar member key, json key and
    the shard parquet's key agree, although the list's `key` column repeats one value."""
    path = tmp_path / "list.csv"
    path.write_text(f"url,caption,key\n{U}?a,a cat,same\n{U}?b,a dog,same\n")
    spec = {
        "source": {"kind": "urls", "path": str(path)},
        "output": {"path": str(tmp_path / "out")},
        "ray": {"runtime": "local", "num_cpus": 1},
    }
    run_build(BuildConfig.model_validate(spec), progress=False)
    members = {}
    for shard in sorted((tmp_path / "out").glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    members[member.name.removesuffix(".json")] = json.load(tar.extractfile(member))
    assert {k: m["key"] for k, m in members.items()} == {k: k for k in members}
    assert sorted(members) == ["000000000", "000000001"]
    assert {m["source_key"] for m in members.values()} == {"same"}
    keys = pq.read_table(tmp_path / "out" / "shard-000000.parquet").column("key").to_pylist()
    assert sorted(keys) == sorted(members)


BIG = [7, 18446744073709551615, 18446744073709551614, 2**65 + 1]


@pytest.mark.parametrize("every", [1, 256])
@pytest.mark.parametrize("name", ["a.jsonl", "a.csv", "a.jsonl.gz", "a.csv.gz"])
def test_integers_beyond_int64_in_a_list_keep_every_digit(tmp_path, every, name):
    """Bug: pyarrow's readers widen a column to double when an integer overflows int64, so
    two different 20-digit ids became the same 1.8446744073709552e+19, and 7 became 7.0."""
    if ".jsonl" in name:
        data = "".join(json.dumps({"url": U, "caption": "c", "id": i}) + "\n" for i in BIG)
    else:
        data = "url,caption,id\n" + "".join(f"{U},c,{i}\n" for i in BIG)
    path = tmp_path / name
    raw = data.encode()
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    rows, _ = read_all(SourceConfig(kind="urls", path=str(path), files_per_task=every))
    assert [str(json.loads(r["json"])["id"]) for r in rows] == [str(i) for i in BIG]


def csv_with_bad_rows(name: str) -> tuple[bytes, list]:
    """A csv/tsv list where every other row has a field too many or too few; rows 4 and 5
    hold a quoted newline (the file is then staged instead of read by byte ranges)."""
    sep = "\t" if ".tsv" in name else ","
    good = [f"{U}{sep}c{i}{sep}{i}" for i in range(4)]
    bad = [f"{U}{sep}two{sep}fields{sep}too many", f"{U}", f"{U}{sep}x{sep}1{sep}{sep}"]
    rows = [good[0], bad[0], good[1], bad[1], good[2], bad[2], good[3]]
    expected = [None, "bad_csv_row"] * 3 + [None]
    text = sep.join(["url", "caption", "n"]) + "\n" + "\n".join(rows) + "\n"
    return text.encode(), expected


@pytest.mark.parametrize("every", [1, 2, 3, 256])
@pytest.mark.parametrize(
    ("name", "staged"), [("a.csv", False), ("a.tsv", False), ("a.csv.gz", True), ("a.tsv", True)]
)
def test_a_csv_row_with_the_wrong_field_count_drops_that_row_only(tmp_path, every, name, staged):
    """Bug: one row with a field too many (an unquoted comma in a caption) or too few failed
    the whole list with pyarrow's 'Expected 3 columns, got 4'. Now that row is dropped as
    `bad_csv_row`; the rows after it keep their keys (their row numbers)."""
    data, expected = csv_with_bad_rows(name)
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    cfg = SourceConfig(kind="urls", path=str(tmp_path / name), files_per_task=every)
    rows, _ = read_all(cfg, work=tmp_path / "_work" if staged else None)
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(len(expected))]
    assert [r[DROP] for r in rows] == expected
    assert [r["txt"] for r in rows[::2]] == ["c0", "c1", "c2", "c3"]
    assert [json.loads(r["json"])["n"] for r in rows[::2]] == [0, 1, 2, 3]  # still numbers
    assert all("__mmcurate" not in r["json"] for r in rows)


def test_bad_csv_rows_are_counted_in_a_built_dataset(tmp_path):
    """Through the build command's path: the bad rows are a named, counted source drop, and
    a quoted newline elsewhere in the list (staged reading) changes nothing."""
    data, expected = csv_with_bad_rows("a.csv")
    data += f'{U},"two\nlines",9\n'.encode()
    (tmp_path / "a.csv").write_bytes(data)
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "urls", "path": str(tmp_path / "a.csv"), "files_per_task": 2},
            "stages": [{"name": "caption_filter", "min_words": 1}],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    run_build(cfg)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    source = stats["stages"][0]
    assert source["dropped"] == {"bad_csv_row": 3}
    assert source["in"] == len(expected) + 1 and source["out"] == 5
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        texts = sorted(
            tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith("txt")
        )
    assert texts == ["c0", "c1", "c2", "c3", "two\nlines"]


def test_a_bad_row_of_a_video_list_is_named_not_a_read_error(tmp_path):
    from mmcurate.pipeline.sources.videos import plan_video_list, read_video_list

    (tmp_path / "x.mp4").write_bytes(b"not decoded here")
    (tmp_path / "list.csv").write_text("path,caption\nx.mp4,one\nx.mp4,a, comma\nx.mp4,three\n")
    cfg = SourceConfig(kind="videos", path=str(tmp_path / "list.csv"))
    parts = plan_video_list(cfg, {})
    rows = [dict(zip(b, v, strict=True)) for p in parts for b in [read_video_list(p, {})]
            for v in zip(*b.values(), strict=True)]  # fmt: skip
    assert [r["__key__"] for r in rows] == ["000000000", "000000001", "000000002"]
    assert [r[DROP] for r in rows] == [None, "bad_csv_row", None]
    assert rows[2]["txt"] == "three"

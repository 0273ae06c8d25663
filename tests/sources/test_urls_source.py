"""The `urls` source: formats, compression, keys from position, carried columns; a build
over a loopback server equals the whole-file reader (issue 19)."""

import gzip
import json
import tarfile

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from http_corpus import Corpus, photo_bytes
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig, SourceConfig
from mmcurate.pipeline.sources.synth import laion_like_table, write_parquet_list
from mmcurate.pipeline.sources.urls import plan_urls, read_urls
from mmcurate.stages.base import DROP
from test_source_ranges import reference_rows


def table(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "URL": [f"http://127.0.0.1:9/{i}.jpg" for i in range(start, start + n)],
            "TEXT": [f"caption {i}" for i in range(start, start + n)],
            "similarity": [0.3 + i / 100 for i in range(start, start + n)],
        }
    )


def write(path, tab: pa.Table) -> None:
    name = str(path).removesuffix(".gz")
    if name.endswith(".parquet"):
        sink = pa.BufferOutputStream()
        pq.write_table(tab, sink)
        text = sink.getvalue().to_pybytes()
    elif name.endswith(".jsonl"):
        text = "".join(json.dumps(row) + "\n" for row in tab.to_pylist()).encode()
    else:
        sink = pa.BufferOutputStream()
        options = pacsv.WriteOptions(delimiter="\t" if name.endswith(".tsv") else ",")
        pacsv.write_csv(tab, sink, options)
        text = sink.getvalue().to_pybytes()
    path.write_bytes(gzip.compress(text) if str(path).endswith(".gz") else text)


def read_all(cfg: SourceConfig) -> list[dict]:
    rows = []
    for part in plan_urls(cfg, {}):
        batch = read_urls(part, {})
        rows += [
            dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)
        ]
    return rows


@pytest.mark.parametrize(
    "name", ["a.parquet", "a.csv", "a.tsv", "a.jsonl", "a.csv.gz", "a.jsonl.gz", "a.parquet.gz"]
)
def test_formats_keys_and_carried_columns(tmp_path, name):
    write(tmp_path / name, table(25))
    cfg = SourceConfig(
        kind="urls",
        path=str(tmp_path / name),
        url_column="URL",
        caption_column="TEXT",
        files_per_task=10,
    )
    assert [p.count for p in plan_urls(cfg, {})] == [10, 10, 5]
    rows = read_all(cfg)
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(25)]
    assert rows[7]["url"] == "http://127.0.0.1:9/7.jpg" and rows[7]["txt"] == "caption 7"
    meta = json.loads(rows[7]["json"])
    assert meta["similarity"] == pytest.approx(0.37) and meta["key"] == "000000007"
    assert all(r[DROP] is None for r in rows)


def test_keys_continue_across_sorted_files(tmp_path):
    write(tmp_path / "part-1.parquet", table(4, start=100))
    write(tmp_path / "part-0.parquet", table(3))
    cfg = SourceConfig(
        kind="urls", path=str(tmp_path / "*.parquet"), url_column="URL", caption_column="TEXT"
    )
    rows = read_all(cfg)
    assert [r["__key__"] for r in rows] == [f"{i:09d}" for i in range(7)]
    assert rows[3]["url"].endswith("/100.jpg")  # part-1 comes after part-0


def test_missing_column_is_a_config_error(tmp_path):
    write(tmp_path / "a.csv", table(2))
    cfg = SourceConfig(kind="urls", path=str(tmp_path / "a.csv"), caption_column="TEXT")
    with pytest.raises(ConfigError, match="source.url_column: no column 'url'"):
        plan_urls(cfg, {})


def test_bad_cells_become_drop_reasons(tmp_path):
    tab = pa.table(
        {
            "url": pa.array([None, b"http://127.0.0.1:9/\xff", b"http://x/1"], pa.binary()),
            "caption": pa.array([b"ok", b"ok", b"\xfe\xff"], pa.binary()),
        }
    )
    pq.write_table(tab, tmp_path / "a.parquet")
    rows = read_all(SourceConfig(kind="urls", path=str(tmp_path / "a.parquet")))
    assert [r[DROP] for r in rows] == ["missing_url", "url_not_utf8", "caption_not_utf8"]


@pytest.fixture
def corpus():
    server = Corpus().start()
    yield server
    server.stop()


def shard_samples(out) -> dict[str, dict[str, str]]:
    samples: dict[str, dict[str, str]] = {}
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                if ext in ("json", "txt"):
                    samples.setdefault(key, {})[ext] = tar.extractfile(member).read().decode()
    return samples


def test_build_over_loopback_gives_the_whole_file_readers_keys_and_json(
    ray_session, corpus, tmp_path
):
    """Issue 19: a LAION-layout list (row groups of 300, partitions of 256) read by row
    groups builds exactly the samples the whole-file reader gave: keys, json, captions."""
    table = laion_like_table(2000, corpus.base)
    jpg = photo_bytes(size=(24, 16))
    for index, url in enumerate(table.column("URL").to_pylist()):
        if index % 50 != 3:  # the rest answer 404
            corpus.serve(url.removeprefix(corpus.base), jpg)
    source = tmp_path / "laion.parquet"
    write_parquet_list(table, source, 300)
    spec = {
        "source": {
            "kind": "urls",
            "path": str(source),
            "url_column": "URL",
            "caption_column": "TEXT",
        },
        "stages": [
            {"name": "download", "timeout_s": 5, "retries": 0, "allow_private_addresses": True}
        ],
        "output": {"path": str(tmp_path / "out")},
    }
    run_build(BuildConfig.model_validate(spec), progress=False)
    expected = {
        key: (json.loads(meta), txt)
        for key, _, txt, meta, _ in reference_rows(str(source), "parquet", 256)
        if int(key) % 50 != 3
    }
    built = shard_samples(tmp_path / "out")
    assert built.keys() == expected.keys()
    for key, (meta, txt) in expected.items():
        got = json.loads(built[key]["json"])  # the source's fields, plus what download adds
        assert {name: got.get(name) for name in meta} == meta, key
        assert built[key].get("txt") == txt
    reasons = pq.read_table(tmp_path / "out" / "signatures").to_pydict()
    dropped = {k for k, r in zip(reasons["key"], reasons["drop_reason"], strict=True) if r}
    assert dropped == {f"{i:09d}" for i in range(2000) if i % 50 == 3}

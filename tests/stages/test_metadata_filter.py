"""metadata_filter on LAION-style columns (punsafe, pwatermark, similarity) read by the urls
source from a parquet file, its expression syntax (never eval) and its drop reasons."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.sources.urls import read_urls, url_partition
from mmcurate.stages.metadata_filter import parse_condition
from mmcurate.stages.registry import build_stage

LAION_ROWS = [
    # URL, TEXT, punsafe, pwatermark, similarity, expected drop reason
    ("http://127.0.0.1/a.jpg", "an orange cat", 0.01, 0.10, 0.33, None),
    ("http://127.0.0.1/b.jpg", "一只橘猫", 0.02, 0.05, 0.31, None),
    ("http://127.0.0.1/c.jpg", "a nude", 0.97, 0.02, 0.30, "metadata_punsafe"),
    ("http://127.0.0.1/d.jpg", "stock", 0.03, 0.95, 0.35, "metadata_pwatermark"),
    ("http://127.0.0.1/e.jpg", "unrelated", 0.05, 0.30, 0.12, "metadata_similarity"),
    ("http://127.0.0.1/f.jpg", "no score", None, 0.10, 0.40, "missing_punsafe"),
    ("http://127.0.0.1/g.jpg", "nan score", math.nan, 0.10, 0.40, "missing_punsafe"),
]
WHERE = ["punsafe < 0.1", "pwatermark<0.8", "similarity >= 0.28"]


def laion_batch(tmp_path) -> dict:
    columns = ["URL", "TEXT", "punsafe", "pwatermark", "similarity"]
    table = pa.table({c: [row[i] for row in LAION_ROWS] for i, c in enumerate(columns)})
    path = tmp_path / "laion.parquet"
    pq.write_table(table, path)
    part = {
        "kind": "urls",
        "part": 0,
        "file": str(path),
        "protocol": "file",
        "start": 0,
        "count": len(LAION_ROWS),
        "first_key": 0,
        "url_column": "URL",
        "caption_column": "TEXT",
    }
    return read_urls(url_partition(part), {})


def test_laion_columns_from_a_parquet_source(tmp_path):
    batch = laion_batch(tmp_path)
    out = build_stage({"name": "metadata_filter", "where": WHERE})(batch)
    assert out["__drop__"] == [row[-1] for row in LAION_ROWS]
    assert {s for s, r in zip(out["__drop_stage__"], out["__drop__"], strict=True) if r} == {
        "metadata_filter"
    }
    keep = build_stage({"name": "metadata_filter", "where": WHERE, "missing": "keep"})
    assert keep(laion_batch(tmp_path))["__drop__"][5:] == [None, None]


def test_columns_strings_and_non_numeric_values():
    metas = [{"p": "0.05"}, {"p": "high"}, {"p": True}, {"p": [1]}, {"p": ""}, {}, {"p": 7}]
    metas += [{"p": 10**400}, {"p": "-Infinity"}, {"p": "1e999"}]  # no float, or not finite
    n = len(metas)
    batch = {
        "__key__": [str(i) for i in range(n)],
        "json": [json.dumps(m) for m in metas],
        "__drop__": [None] * n,
        "__drop_stage__": [None] * n,
    }
    out = build_stage({"name": "metadata_filter", "where": ["p <= 1e0"]})(batch)
    assert out["__drop__"] == [
        None,
        "non_numeric_p",
        "non_numeric_p",
        "non_numeric_p",
        "missing_p",
        "missing_p",
        "metadata_p",
        *["non_numeric_p"] * 3,
    ]
    # a column of the batch (clip_score, concept_*) wins over the json
    scored = {
        "__key__": ["a", "b"],
        "json": ['{"clip_score": 0.9}', None],
        "clip_score": [0.1, 0.5],
        "__drop__": [None, None],
        "__drop_stage__": [None, None],
    }
    out = build_stage({"name": "metadata_filter", "where": ["clip_score > 0.3"]})(scored)
    assert out["__drop__"] == ["metadata_clip_score", None]


@pytest.mark.parametrize(
    "text,parsed",
    [
        ("punsafe < 0.1", ("punsafe", "<", 0.1)),
        ("similarity>=.28", ("similarity", ">=", 0.28)),
        ("width != -1e3", ("width", "!=", -1000.0)),
        ("a_1 == 2", ("a_1", "==", 2.0)),
    ],
)
def test_condition_syntax(text, parsed):
    assert tuple(parse_condition(text)) == parsed


@pytest.mark.parametrize(
    "where",
    [
        ["__import__('os').system('true') < 1"],
        ["punsafe < 0.1 or 1"],
        ["punsafe ~ 0.1"],
        ["punsafe < nan"],
        ["< 0.1"],
        [],
    ],
)
def test_anything_else_is_a_config_error(where):
    with pytest.raises(ConfigError, match="stages.0.where") as err:
        build_stage({"name": "metadata_filter", "where": where})
    assert "\n" not in str(err.value)

"""A sample's `.json` is JSON any reader accepts. Bug: Python's json.dumps writes NaN and
Infinity, which are not JSON (JavaScript's JSON.parse, jq and Go refuse them): a sidecar with
`1e400` (valid JSON, read as infinity), a `.json` member with Python's own NaN token, a NaN
cell of a parquet URL list, each came out as NaN or Infinity in the output."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mmcurate.core.formats import meta_json
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.partitions import plan_source, read_partition
from mmcurate.stages.registry import build_stage
from PIL import Image

from tests.kit_sources import rows


def strict(text: str) -> dict:
    """Parse as a strict reader does: NaN, Infinity and -Infinity are errors."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_at_any_depth():
    meta = {"a": math.inf, "b": [math.nan, 1.5], "c": {"d": -math.inf, "e": "x"}, "f": 2}
    assert strict(meta_json(meta, sort_keys=True)) == {
        "a": None,
        "b": [None, 1.5],
        "c": {"d": None, "e": "x"},
        "f": 2,
    }
    assert meta_json({"a": 1.0}) == json.dumps({"a": 1.0})  # finite: unchanged


def test_sidecars_and_tar_members_with_non_finite_numbers(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    Image.new("RGB", (32, 32), (9, 90, 200)).save(folder / "a.jpg")
    (folder / "a.json").write_text('{"punsafe": 1e400, "w": -1e999, "ok": 0.5}')
    Image.new("RGB", (32, 32), (200, 90, 9)).save(folder / "b.jpg")
    (folder / "b.json").write_text('{"punsafe": NaN, "ok": 0.25}')  # Python's own token
    parts = plan_source(SourceConfig(kind="images", path=str(folder)), {})
    got = {r["__key__"]: strict(r["json"]) for r in rows(read_partition(parts[0], {}))}
    assert got["a"]["punsafe"] is None and got["a"]["w"] is None and got["a"]["ok"] == 0.5
    assert got["b"]["punsafe"] is None and got["b"]["ok"] == 0.25


def test_a_nan_cell_of_a_parquet_url_list(tmp_path):
    table = pa.table({"url": ["http://127.0.0.1:9/a.jpg"], "caption": ["a"], "punsafe": [math.nan]})
    pq.write_table(table, tmp_path / "u.parquet")
    parts = plan_source(SourceConfig(kind="urls", path=str(tmp_path / "u.parquet")), {})
    (row,) = rows(read_partition(parts[0], {}))
    assert strict(row["json"])["punsafe"] is None


@pytest.mark.parametrize(
    "spec", [{"name": "decode_image", "resize": {"size": 16}}, {"name": "language_filter"}]
)
def test_stages_that_rewrite_the_json_keep_it_json(tmp_path, spec):
    Image.new("RGB", (32, 32), (9, 90, 200)).save(tmp_path / "a.jpg")
    stage = build_stage(spec)
    batch = {
        "__key__": ["a"],
        "jpg": [(tmp_path / "a.jpg").read_bytes()],
        "txt": ["a photo of a blue square"],
        "json": ['{"punsafe": 1e400}'],
        "__drop__": [None],
        "__drop_stage__": [None],
    }
    out = stage(batch)
    assert strict(out["json"][0])["punsafe"] is None

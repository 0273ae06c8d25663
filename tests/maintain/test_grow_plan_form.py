"""A grow operation's plan.json stores its new shards' specs, and a rerun reads them back: the
typed spec (`ShardSpec`) writes the JSON the spec dicts were written as, byte for byte, and
reads a plan written before it, so an operation interrupted by an older version still
finishes."""

from __future__ import annotations

import json
import pickle

from mmcurate.pipeline.maintain.grow_shards import new_shard_specs
from mmcurate.pipeline.output.layout import ShardLayout
from mmcurate.pipeline.output.shard_format import ShardSpec

ROWS = [
    ("a1", 4, 0, 1536),
    ("b2", 2, 1536, 2048),
    ("c3", 4, 1536, 1024),
    ("d4", 2, 3584, 3072),
    ("e5", 7, 0, 512),
]
FIELDS, KEYS = {"score": "float64", "tag": "string"}, ["score", "tag"]
# What the spec dicts made of ROWS were written as (the same call, before ShardSpec existed).
OLD_PLAN = (
    '{"new_shards": ['
    '{"name": "shard-000012.tar", "samples": 2, "parts": [[2, [["b2", 1536, 2048]]], '
    '[4, [["a1", 0, 1536]]]], "fields": {"score": "float64", "tag": "string"}, '
    '"json_keys": ["score", "tag"]}, '
    '{"name": "shard-000013.tar", "samples": 2, "parts": [[2, [["d4", 3584, 3072]]], '
    '[4, [["c3", 1536, 1024]]]], "fields": {"score": "float64", "tag": "string"}, '
    '"json_keys": ["score", "tag"]}, '
    '{"name": "shard-000014.tar", "samples": 1, "parts": [[7, [["e5", 0, 512]]]], '
    '"fields": {"score": "float64", "tag": "string"}, "json_keys": ["score", "tag"]}]}'
)


def test_new_shard_specs_are_stored_as_the_spec_dicts_were():
    specs = new_shard_specs(ROWS, 12, 2, 1 << 20)
    specs = [spec.replace(fields=FIELDS, json_keys=KEYS) for spec in specs]
    assert json.dumps({"new_shards": [spec.to_dict() for spec in specs]}) == OLD_PLAN


def test_a_plan_written_before_reads_back_and_writes_the_same_bytes():
    specs = [ShardSpec.from_dict(d) for d in json.loads(OLD_PLAN)["new_shards"]]
    assert [s.name for s in specs] == ["shard-000012.tar", "shard-000013.tar", "shard-000014.tar"]
    assert specs[0].parts == ((2, [("b2", 1536, 2048)]), (4, [("a1", 0, 1536)]))
    assert specs[2].samples == 1 and specs[2].fields == FIELDS and specs[2].json_keys == KEYS
    assert specs[0].start is None and specs[0].refs == {}
    assert json.dumps({"new_shards": [spec.to_dict() for spec in specs]}) == OLD_PLAN


def test_specs_and_the_layout_travel_to_tasks_whole():
    """Ray pickles a shard task's spec (with its references) and phase C's layout."""
    refs = {3: {"k": [{"key": "k", "ext": "jpg", "part": 1, "offset": 0, "size": 9, "at": 0}]}}
    spec = ShardSpec("shard-000000.tar", 1, start=0, stop=1, parts=((3, [("k", 0, 1536)]),))
    spec = spec.replace(refs=refs, fields=FIELDS, json_keys=KEYS)
    assert pickle.loads(pickle.dumps(spec)) == spec
    layout = ShardLayout([0, 5], [0, 3, 6], [{"rows": 5}, {"rows": 4}])
    assert pickle.loads(pickle.dumps(layout)) == layout
    assert "refs" not in spec.to_dict()  # made per task, never stored

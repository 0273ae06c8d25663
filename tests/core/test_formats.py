"""The shared formats in core/: what the build writes is what the trainer reads."""

from __future__ import annotations

import pytest
from mmcurate.core.formats import MANIFEST_FORMAT
from mmcurate.core.manifest import SHARD_FIELDS, ManifestError, manifest_document, parse_manifest

ENTRIES = [
    {"name": "shard-000000.tar", "samples": 3, "bytes": 3072, "sha256": "a" * 64},
    {"name": "shard-000001.tar", "samples": 2, "bytes": 2048, "sha256": "b" * 64},
]


def test_manifest_round_trip() -> None:
    doc = manifest_document(ENTRIES, {"output": {"path": "s3://b/out"}}, "0" * 64)
    assert doc["format"] == MANIFEST_FORMAT and doc["samples"] == 5
    assert [list(s) for s in doc["shards"]] == [list(SHARD_FIELDS)] * 2
    parsed = parse_manifest("s3://b/out/manifest.json", doc)
    assert parsed.samples == 5
    assert [s.url for s in parsed.shards] == [
        "s3://b/out/shard-000000.tar",
        "s3://b/out/shard-000001.tar",
    ]
    assert [(s.samples, s.bytes, s.sha256) for s in parsed.shards] == [
        (e["samples"], e["bytes"], e["sha256"]) for e in ENTRIES
    ]


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"format": "other/1", "samples": 1, "shards": ENTRIES},
        {"format": MANIFEST_FORMAT, "samples": 1, "shards": []},
        {"format": MANIFEST_FORMAT, "samples": "x", "shards": ENTRIES},
        {"format": MANIFEST_FORMAT, "samples": 1, "shards": [{"name": "../x.tar"}]},
        {"format": MANIFEST_FORMAT, "samples": 1, "shards": [{**ENTRIES[0], "name": "/etc/x"}]},
        {"format": MANIFEST_FORMAT, "samples": float("inf"), "shards": ENTRIES},  # Infinity
        {"format": MANIFEST_FORMAT, "samples": 1, "shards": [{**ENTRIES[0], "bytes": 1e400}]},
        {"format": MANIFEST_FORMAT, "samples": float("nan"), "shards": ENTRIES},
        {"format": MANIFEST_FORMAT, "samples": -5, "shards": ENTRIES},
        {"format": MANIFEST_FORMAT, "samples": 5, "shards": [{**ENTRIES[0], "samples": -3}]},
        {"format": MANIFEST_FORMAT, "samples": 5, "shards": [{**ENTRIES[0], "bytes": -1}]},
        {"format": MANIFEST_FORMAT, "samples": 1.5, "shards": ENTRIES},  # not a whole number
        {"format": MANIFEST_FORMAT, "samples": True, "shards": ENTRIES},
        {"format": MANIFEST_FORMAT, "samples": 5, "shards": [{**ENTRIES[0], "samples": "3"}]},
    ],
)
def test_bad_manifests_are_one_error(doc: object) -> None:
    """Each is a ManifestError (one line), never another exception (OverflowError: Infinity)."""
    with pytest.raises(ManifestError):
        parse_manifest("out/manifest.json", doc)

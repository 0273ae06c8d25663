"""Keys and member names every reader agrees on, and `.json` members the sources can trust
(pure: no Ray, no storage server)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from mmcurate.core.formats import MEMBER_COLUMNS
from mmcurate.core.tar_writer import write_tar
from mmcurate.core.tario import (
    CLEAN_KEY,
    CLIP_SUFFIX,
    KEY_MAX_BYTES,
    LONGEST_SUFFIX,
    iter_tar_samples,
    safe_key,
    split_member_name,
)
from mmcurate.pipeline.config import SourceConfig
from mmcurate.pipeline.sources.partitions import plan_source, read_partition
from mmcurate.stages.base import DROP
from mmcurate.stages.decode_image import merge_json
from mmcurate.stages.video_frames import merge_meta

from tests.kit_keys import jpeg, make_awkward_folder, raw_headers, write_input_tar

AWKWARD = [
    "plain",
    "dir.x/k",
    "../../a",
    "./a",
    ".hidden",
    "a..b",
    "a/b",
    "a_b",
    "a b",
    "",
    ".",
    "..",
    "/",
    "a\x00b",
    "tab\tnew\nline\x7f",
    "café",
    "cafe\u0301",  # the same word, decomposed
    "草",
    "花",
    "写真1",
    "😀",
    "Ω" * 120,
    "x" * 80,
    "x" * 81,
    "y" * 500,
    "-rf",
    "name.tar.gz",
    "caf\udce9",  # a local file name with an undecodable byte
    "\ud800",
]


def rows(batch: dict) -> list[dict]:
    return [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def test_safe_keys_are_clean_bounded_distinct_and_stable():
    keys = [safe_key(name) for name in AWKWARD]
    assert len(set(keys)) == len(AWKWARD)  # a b / a_b, café / café decomposed: all distinct
    assert keys == [safe_key(name) for name in AWKWARD]  # the same on every run
    for name, key in zip(AWKWARD, keys, strict=True):
        assert CLEAN_KEY.fullmatch(key), (name, key)
        assert len(key.encode("utf-8")) <= KEY_MAX_BYTES
        assert not key.startswith(".") and "." not in key and "/" not in key
    assert safe_key("plain") == "plain" and safe_key("x" * 80) == "x" * 80  # clean: unchanged
    assert safe_key("dir.x/k").startswith("dir_x_k_") and safe_key("café").startswith("cafe_")
    assert safe_key("../../a").startswith("a_")


def test_every_member_name_of_a_key_fits_the_plain_tar_name_field():
    longest = max([f".{c}" for c in MEMBER_COLUMNS] + [LONGEST_SUFFIX], key=len)
    assert longest == LONGEST_SUFFIX
    for name in AWKWARD:
        member = safe_key(name) + CLIP_SUFFIX + LONGEST_SUFFIX  # a clip's last frame
        assert member.isascii() and len(member.encode()) <= 100


def test_written_tars_carry_no_pax_headers_and_split_back_to_the_keys():
    samples = []
    for i, name in enumerate(AWKWARD):
        key = safe_key(name) + CLIP_SUFFIX
        samples.append({"__key__": key, "999.jpg": b"f", "json": "{}", "txt": f"t{i}"})
    out = io.BytesIO()
    write_tar(samples, out)
    headers = raw_headers(out.getvalue())
    assert {flag for _, flag in headers} == {b"0"}  # regular files only: no PAX, no GNU longname
    assert len(headers) == 3 * len(AWKWARD)
    out.seek(0)
    back = list(iter_tar_samples(out))
    assert [s["__key__"] for s in back] == [s["__key__"] for s in samples]
    assert all(split_member_name(name)[0] in {s["__key__"] for s in samples} for name, _ in headers)


def test_image_folder_keys_unique_clean_and_the_path_kept_in_json(tmp_path):
    names = make_awkward_folder(tmp_path)
    undecodable = os.path.join(os.fsencode(tmp_path), b"caf\xe9-latin1.jpg")
    with open(undecodable, "wb") as f:
        f.write(jpeg())
    parts = plan_source(SourceConfig(kind="images", path=str(tmp_path)), {})
    got = [row for part in parts for row in rows(read_partition(part, {}))]
    assert len(got) == len(names) + 1 and all(row[DROP] is None for row in got)
    keys = [row["__key__"] for row in got]
    assert len(set(keys)) == len(keys)
    assert all(CLEAN_KEY.fullmatch(k) and len(k) <= KEY_MAX_BYTES for k in keys)
    sources = {json.loads(row["json"])["source"]: row for row in got}
    for rel, caption in names.items():
        assert sources[rel]["txt"] == caption
    assert "caf\\udce9-latin1.jpg" in sources  # the odd byte shown, valid UTF-8
    again = plan_source(SourceConfig(kind="images", path=str(tmp_path)), {})
    assert [e.key for p in again for e in p.entries] == keys  # stable across reruns


def read_tar_source(path: Path) -> list[dict]:
    parts = plan_source(SourceConfig(kind="webdataset", path=str(path)), {})
    return rows(read_partition(parts[0], {}))


BAD_JSON = {
    "not_json": b"{not json",
    "array": b"[1, 2]",
    "string": b'"just text"',
    "number": b"42",
    "null": b"null",
    "not_utf8": b'{"a": "\xff"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "lone_surrogate": b'{"a": "\\ud800"}',
    "truncated": b'{"a": 1',
}
GOOD_JSON = {
    "object": b'{"a": 1}',
    "bom": b'\xef\xbb\xbf{"a": 2}',
    "nan": b'{"a": NaN}',  # img2dataset writes these
    "pair": b'{"a": "\\ud83d\\ude00"}',  # a surrogate pair is one character
    "empty": b"{}",
}


def test_bad_json_members_are_dropped_with_a_reason(tmp_path):
    members = []
    for name, data in {**BAD_JSON, **GOOD_JSON}.items():
        members += [(f"{name}.jpg", jpeg()), (f"{name}.json", data), (f"{name}.txt", b"cap")]
    write_input_tar(tmp_path / "in.tar", members)
    got = {row["__key__"]: row for row in read_tar_source(tmp_path / "in.tar")}
    assert {k: r[DROP] for k, r in got.items() if r[DROP]} == {k: "bad_json" for k in BAD_JSON}
    for name in GOOD_JSON:
        assert isinstance(json.loads(got[name]["json"]), dict)
    assert json.loads(got["bom"]["json"]) == {"a": 2}


def test_tar_keys_with_dots_slashes_and_long_names_become_clean_keys(tmp_path):
    raw_keys = ["dir.x/k", "dir_x/k", "../../a", "deep/er/x", "x" * 150, "写真/草", "ok"]
    members = []
    for key in raw_keys:
        members += [(f"{key}.jpg", jpeg()), (f"{key}.txt", key.encode())]
    members.append(("j.s.o.n/m.json", b'{"source_member": "theirs"}'))
    write_input_tar(tmp_path / "in.tar", members, format=tarfile.PAX_FORMAT)
    latin = [("caf\xe9.jpg", jpeg()), ("caf\xe9.txt", b"latin-1 name")]
    write_input_tar(tmp_path / "latin.tar", latin, format=tarfile.GNU_FORMAT, encoding="latin-1")
    got = read_tar_source(tmp_path / "in.tar") + read_tar_source(tmp_path / "latin.tar")
    assert all(row[DROP] is None for row in got)
    keys = [row["__key__"] for row in got]
    assert len(set(keys)) == len(keys) == len(raw_keys) + 2
    assert all(CLEAN_KEY.fullmatch(k) and len(k) <= KEY_MAX_BYTES for k in keys)
    by_caption = {row["txt"]: row for row in got}
    assert by_caption["ok"]["__key__"] == "ok" and by_caption["ok"]["json"] is None
    for key in raw_keys[:-1]:
        assert json.loads(by_caption[key]["json"]) == {"source_member": key}
    assert json.loads(by_caption["latin-1 name"]["json"]) == {"source_member": "caf\\udce9"}
    theirs = next(row for row in got if row["txt"] is None)
    assert json.loads(theirs["json"]) == {"source_member": "theirs"}  # never overwritten


@pytest.mark.parametrize("text", [None, "", "{bad", "[1]", '"s"', "3", b"\xff", "null"])
def test_stages_merge_into_bad_or_missing_json_without_crashing(text):
    assert json.loads(merge_json(text, {"width": 4})) == {"width": 4}
    result = {
        "fps": 24.0,
        "frame_count": 48,
        "indices": [0],
        "timestamps": [0.0],
        "width": 8,
        "height": 8,
        "decoder": "pyav",
    }
    meta = json.loads(merge_meta(text, result))
    assert meta["clip_start"] == 0.0 and meta["frame_count"] == 48

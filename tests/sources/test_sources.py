"""Source-level drop reasons, read without Ray: vanished files and damaged tars."""

import json
import os
import threading

from mmcurate.core.tario import safe_key
from mmcurate.pipeline.config import BuildConfig, SourceConfig
from mmcurate.pipeline.output.claim import build_identity
from mmcurate.pipeline.sources.partitions import plan_source, read_partition
from mmcurate.stages.base import DROP

from tests.kit_sources import rows


def test_file_gone_between_listing_and_reading_is_read_error(image_folder):
    folder = image_folder(n=4)
    parts = plan_source(SourceConfig(kind="images", path=str(folder)), {})
    victim = sorted(folder.glob("*.jpg"))[1]
    victim.unlink()
    got = {r["__key__"]: r[DROP] for r in rows(read_partition(parts[0], {}))}
    assert got[victim.stem] == "read_error"
    assert sum(reason is None for reason in got.values()) == 3


def test_truncated_tar_keeps_samples_before_the_damage(tar_shards, tmp_path):
    source = tar_shards(n_shards=1, per_shard=6)
    tar = next(source.glob("*.tar"))
    data = tar.read_bytes()
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(data[: len(data) // 2])
    parts = plan_source(SourceConfig(kind="webdataset", path=str(damaged)), {})
    got = rows(read_partition(parts[0], {}))
    assert 0 < sum(r[DROP] is None for r in got) < 6  # the samples before the cut survive
    assert got[-1]["__key__"] == "damaged_tar_damaged"
    assert got[-1][DROP].startswith("corrupt_tar:")


def folder_rows(folder) -> dict[str, dict]:
    parts = plan_source(SourceConfig(kind="images", path=str(folder)), {})
    return {r["__key__"]: r for part in parts for r in rows(read_partition(part, {}))}


def test_json_sidecars_are_the_samples_metadata_and_bad_ones_are_counted(image_folder):
    """`<stem>.json` beside an image is its metadata (as a tar's `.json` member): merged into
    the sample's JSON with `source` added; anything but a JSON object is bad_json."""
    folder = image_folder(n=5)
    stems = sorted(p.stem for p in folder.glob("*.jpg"))
    (folder / f"{stems[0]}.json").write_text('{"captions": ["a", "b"], "image_id": 7}')
    (folder / f"{stems[1]}.json").write_text('{"source": "flickr"}')  # its own source stays
    (folder / f"{stems[2]}.json").write_text("{not json")
    (folder / f"{stems[3]}.json").write_text("[1, 2]")
    got = folder_rows(folder)
    assert json.loads(got[stems[0]]["json"]) == {
        "captions": ["a", "b"],
        "image_id": 7,
        "source": f"{stems[0]}.jpg",
    }
    assert json.loads(got[stems[1]]["json"]) == {"source": "flickr"}
    assert [got[s][DROP] for s in stems] == [None, None, "bad_json", "bad_json", None]
    assert json.loads(got[stems[4]]["json"]) == {"source": f"{stems[4]}.jpg"}


def test_a_caption_that_exists_but_cannot_be_read_is_a_read_error(image_folder, tmp_path):
    """Not a sample without a caption: a `.txt` that is a link to a folder fails to read."""
    folder = image_folder(n=2)
    first, second = sorted(p.stem for p in folder.glob("*.jpg"))
    (folder / f"{first}.txt").unlink(missing_ok=True)
    (folder / f"{first}.txt").symlink_to(tmp_path, target_is_directory=True)
    (folder / f"{second}.txt").write_bytes(b"\xef\xbb\xbfa caption after a byte-order mark")
    got = folder_rows(folder)
    assert got[first][DROP] == "read_error"
    assert got[second][DROP] is None
    assert got[second]["txt"] == "a caption after a byte-order mark"


def test_a_file_named_like_a_disambiguated_key_gets_its_own_key(image_folder):
    """`a.jpg` and `a.png` take keys of their whole names; a third file already named like
    one of those keys must not collide with it (it was dropped as duplicate_key)."""
    folder = image_folder(n=1)
    photo = next(folder.glob("*.jpg")).read_bytes()
    (folder / "a.jpg").write_bytes(photo)
    (folder / "a.png").write_bytes(photo)
    (folder / f"{safe_key('a.jpg')}.jpg").write_bytes(photo)
    got = folder_rows(folder)
    assert len(got) == 4 and all(r[DROP] is None for r in got.values())
    assert {r["__source__"].rpartition("/")[2] for r in got.values()} >= {"a.jpg", "a.png"}


def test_a_file_changed_in_place_changes_the_build_identity(image_folder):
    """Same names, other bytes (or only a newer modification time): another input, so a
    rerun is refused instead of answering "already built" with the old pixels and captions."""
    folder = image_folder(n=3)
    cfg = BuildConfig.model_validate(
        {"source": {"kind": "images", "path": str(folder)}, "output": {"path": "/tmp/unused"}}
    )

    def identity() -> str:
        return build_identity(cfg, plan_source(cfg.source, {}))

    first = identity()
    assert identity() == first  # nothing changed: the same build
    caption = sorted(folder.glob("*.txt"))[0]
    caption.write_text("another caption")
    second = identity()
    assert second != first
    image = sorted(folder.glob("*.jpg"))[1]
    stat = image.stat()
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert identity() not in (first, second)


def test_cls_labels_are_carried_and_memberless_samples_are_counted(tmp_path):
    """An ImageNet-style shard's `.cls` labels reach the output (they were dropped without a
    count); a sample with no member a build carries (only `.npy`, or a key `a.b` whose
    extension reads as `b.jpg`) is no_members, not an empty sample the manifest counts."""
    import io
    import tarfile

    members = [("s0.jpg", b"img"), ("s0.cls", b"7"), ("s1.jpg", b"img"), ("s1.cls", b"3")]
    members += [("vec.npy", b"\x93NUMPY"), ("a.b.jpg", b"img"), ("s2.txt", b"only a caption")]
    shard = tmp_path / "labelled.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    parts = plan_source(SourceConfig(kind="webdataset", path=str(shard)), {})
    got = {r["__key__"]: r for r in rows(read_partition(parts[0], {}))}
    assert [got[k]["cls"] for k in ("s0", "s1")] == [b"7", b"3"]
    assert {k: r[DROP] for k, r in got.items()} == {
        "s0": None,
        "s1": None,
        "vec": "no_members",
        "a": "no_members",
        "s2": None,
    }


def test_fifos_and_devices_in_an_image_folder_are_not_read(image_folder):
    """Bug: the listing kept every name, so a FIFO caption (c.txt) hung the build and a link
    to /dev/zero read until memory ran out. Only regular files (or links to them) are inputs;
    dangling links stay listed, and are read errors."""
    folder = image_folder(n=3)
    first, second, third = sorted(p.stem for p in folder.glob("*.jpg"))
    for caption in (folder / f"{first}.txt", folder / f"{second}.txt"):
        caption.unlink()
    os.mkfifo(folder / f"{first}.txt")
    os.mkfifo(folder / "fifo.jpg")
    (folder / f"{second}.txt").symlink_to("/dev/zero")
    (folder / "null.jpg").symlink_to("/dev/null")
    (folder / "gone.jpg").symlink_to(folder / "missing.jpg")
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(folder_rows(folder)), daemon=True)
    reader.start()
    reader.join(120)  # a guard only: before the fix the read never ended
    assert not reader.is_alive(), "reading the folder hung"
    assert sorted(result) == sorted([first, second, third, "gone"])
    assert {k: r[DROP] for k, r in result.items()} == {
        first: None,
        second: None,
        third: None,
        "gone": "read_error",
    }
    assert result[first]["txt"] is None and result[second]["txt"] is None

"""Paths whose names hold glob characters (`[`, `?`, `*`): a folder `clips [2020]`, a file
`photo[1].jpg`. Bugs: the file sources took any such path for a pattern (`no tar files match`),
reading a partition went through `fs.cat`, which expands patterns (so an image folder with
such a name ended the task with FileNotFoundError), and the output/source overlap check cut
the path at the bracket (refusing an output beside the folder). A path that exists as written
is that path; only one that does not is a pattern."""

import json
import tarfile

import pytest
from mmcurate.pipeline.config import SourceConfig, overlaps
from mmcurate.pipeline.sources.partitions import plan_source, read_partition
from mmcurate.stages.base import DROP
from PIL import Image

from tests.kit_sources import rows

NAMES = ["plain", "q[1]", "a?b", "star*", "[x]"]


def photos(folder, names=NAMES) -> None:
    folder.mkdir(parents=True)
    for i, name in enumerate(names):
        Image.new("RGB", (40, 30), (40 * i, 90, 200)).save(folder / f"{name}.jpg")
        (folder / f"{name}.txt").write_text(f"caption {name}")


def captions(parts, storage_options=None) -> dict[str, str]:
    got = [r for part in parts for r in rows(read_partition(part, storage_options or {}))]
    assert all(r[DROP] is None for r in got)
    return {json.loads(r["json"])["source"].rpartition("/")[2]: r["txt"] for r in got}


def test_an_image_folder_and_files_named_with_glob_characters_are_read(tmp_path):
    folder = tmp_path / "clips [2020]"
    photos(folder)
    parts = plan_source(SourceConfig(kind="images", path=str(folder), files_per_task=2), {})
    assert captions(parts) == {f"{n}.jpg": f"caption {n}" for n in NAMES}


def test_the_same_names_on_an_object_store(s3, s3_bucket, tmp_path):
    photos(tmp_path / "local")
    fs = s3.filesystem()
    for path in sorted((tmp_path / "local").iterdir()):
        fs.pipe_file(f"{s3_bucket}/clips [2020]/{path.name}", path.read_bytes())
    cfg = SourceConfig(kind="images", path=f"s3://{s3_bucket}/clips [2020]")
    parts = plan_source(cfg, s3.storage_options)
    assert captions(parts, s3.storage_options) == {f"{n}.jpg": f"caption {n}" for n in NAMES}


def test_a_tar_and_a_url_list_named_with_glob_characters_are_found(tmp_path):
    folder = tmp_path / "shards [a]"
    folder.mkdir()
    photos(tmp_path / "src", ["one"])
    with tarfile.open(folder / "x[1].tar", "w") as tar:
        tar.add(tmp_path / "src" / "one.jpg", "one.jpg")
    parts = plan_source(SourceConfig(kind="webdataset", path=str(folder / "x[1].tar")), {})
    assert [r["__key__"] for r in rows(read_partition(parts[0], {}))] == ["one"]
    (folder / "u[1].csv").write_text("url,caption\nhttp://127.0.0.1:9/a.jpg,a\n")
    parts = plan_source(SourceConfig(kind="urls", path=str(folder / "u[1].csv")), {})
    assert [r["txt"] for r in rows(read_partition(parts[0], {}))] == ["a"]


def test_a_pattern_that_names_nothing_as_written_is_still_a_glob(tmp_path):
    photos(tmp_path / "src", ["one", "two"])
    for name in ("one", "two"):
        with tarfile.open(tmp_path / f"{name}.tar", "w") as tar:
            tar.add(tmp_path / "src" / f"{name}.jpg", f"{name}.jpg")
    parts = plan_source(SourceConfig(kind="webdataset", path=str(tmp_path / "[ot]*.tar")), {})
    assert [p.tar.rpartition("/")[2] for p in parts] == ["one.tar", "two.tar"]


@pytest.mark.parametrize("exists", [True, False])
def test_an_output_beside_a_bracketed_folder_does_not_overlap_it(tmp_path, exists):
    """A folder that exists is itself; otherwise a pattern, judged by its fixed prefix
    (`photos `), which `out` does not start with."""
    folder = tmp_path / "photos [1]"
    if exists:
        folder.mkdir()
    assert not overlaps(str(folder), str(tmp_path / "out"))
    assert overlaps(str(folder), str(folder / "out"))
    # a pattern `photos [1]` matches `photos 1`; the folder that exists is only itself
    assert overlaps(str(folder), str(tmp_path / "photos 1")) is not exists


def test_a_store_glob_is_judged_by_its_fixed_prefix_not_its_folder():
    """Bug: `s3://b/in [1]` was cut back to its folder, the bucket root, so every output in
    the bucket overlapped it. A glob covers what starts with its fixed prefix."""
    assert not overlaps("s3://b/in [1]", "s3://b/out2")
    assert not overlaps("s3://b/in [1]/*.tar", "s3://b/out")
    assert overlaps("s3://b/in [1]", "s3://b/in [1]/sub")
    assert overlaps("s3://b/in*", "s3://b/inbox")  # the glob may match the output itself
    assert overlaps("s3://b/*.tar", "s3://b")
    assert not overlaps("s3://b/x/in*", "s3://b/y")

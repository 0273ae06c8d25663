"""The names a build writes in `_work/` have one home (pipeline/output/names.py): every
name its functions spell is one a rerun recognises as scratch, and no other module spells one
itself (a scratch file that missed the pattern made a rerun refuse its own folder)."""

from __future__ import annotations

import re
from pathlib import Path

import fsspec
import pytest
from mmcurate.pipeline.output import names
from mmcurate.pipeline.output.existing import only_scratch
from mmcurate.pipeline.output.markers import part_marker, shard_marker
from mmcurate.pipeline.sources.staging import STAGED_DONE, stage_folder, staged_chunk, staged_folder

ROOT = Path(__file__).resolve().parents[2]
TMP = ".tmp-" + "0123456789abcdef" * 2


def spelled() -> list[str]:
    """One of every name the module's functions give, relative to `_work/`."""
    part, group = 12, 3
    found = [*names.FOLDERS, f"{names.BUILD_FILE}{TMP}"]
    found += [f"{names.CANDIDATES}/{names.part_file(part, e)}" for e in names.CANDIDATE_EXTENSIONS]
    found += [f"{names.SIGNATURES}/{names.part_file(part, 'parquet')}"]
    found += [f"{names.PARTS}/{names.part_file(part, 'json')}"]
    found += [f"{names.SHARDS}/{names.shard_marker_name('shard-000004.tar')}"]
    for kind in names.ROUND_KINDS:
        folder = f"{names.DECIDE}/{names.round_folder(kind, names.round_name(2))}"
        found += [folder, f"{folder}/{names.group_file(group)}"]
    found += [
        f"{names.DECIDE}/{folder}/{names.group_file(group)}" for folder in names.DECIDE_FOLDERS
    ]
    staged = staged_folder("0123456789abcdef", 5000)
    found += [staged, f"{staged}/{staged_chunk(7)}", f"{staged}/{STAGED_DONE}"]
    return found


@pytest.mark.parametrize("name", spelled())
def test_every_spelled_name_is_recognised_with_and_without_a_temp_suffix(name):
    assert names.WORK_NAMES.fullmatch(name)
    is_folder = name in names.FOLDERS or "." not in name.rpartition("/")[2]
    if not is_folder and not name.endswith(TMP):
        assert names.WORK_NAMES.fullmatch(name + TMP)


def test_files_at_the_pipelines_own_paths_are_scratch(tmp_path):
    """Files written where the build's helpers put them leave a `_work/` a rerun takes back;
    one more file of another name does not."""
    work = tmp_path / "_work"
    staged = stage_folder("s3://b/list.parquet", 100, None, {"file_size": 1, "file_version": "e"})
    made = [
        part_marker(str(work), 3),
        shard_marker(str(work), "shard-000001.tar"),
        str(work / staged / staged_chunk(0)),
        str(work / staged / STAGED_DONE),
    ]
    for path in made:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("{}")
    local = fsspec.filesystem("file")
    assert only_scratch(local, str(work))
    (work / "parts" / "notes.txt").write_text("mine")
    assert not only_scratch(local, str(work))


def test_an_unknown_name_is_not_scratch():
    for name in ("candidates/notes.txt", "decide/fate-1/g.parquet", "source/x", "build.json"):
        assert not names.WORK_NAMES.fullmatch(name)
    assert names.part_number("part-000012.media.parquet") == 12
    assert names.part_number("shard-000012.json") is None


SPELLING = re.compile(r"""["'](?:part|g|fate|shuffle)-\{|\.media\.parquet["']|["']done\.json""")


def test_no_other_module_spells_a_scratch_name():
    others = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("pipeline", "core")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name not in ("names.py", "staging.py")  # the two homes
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SPELLING.search(line)
    ]
    assert others == []

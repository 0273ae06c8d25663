"""A video loader batch none of whose clips decode is skipped and counted (with several
ranks, the rank's previous batch again, so that steps stay equal); loader workers leave no
spill folders behind."""

import json
import tarfile
import tempfile
from pathlib import Path

import mmcurate
from tests.kit_video import clip_build

T = 8
BROKEN = "48x64"  # every clip of this bucket is zeroed after the loader indexed it


def build(root: Path) -> tuple[str, dict[str, str]]:
    clips = [(12 + i, (64, 48) if i % 2 else (48, 64)) for i in range(8)]
    manifest = clip_build(root, clips, shard_max_samples=3)
    sizes = {f"clip{i}": "64x48" if i % 2 else "48x64" for i in range(8)}
    return manifest, sizes


def zero_clips(manifest: str, keys: set[str]) -> None:
    """Overwrite the clips of `keys` with zeros in place (the tars stay readable)."""
    out = Path(manifest).parent
    for shard in json.loads(Path(manifest).read_text())["shards"]:
        path = out / shard["name"]
        with tarfile.open(path) as tar:
            spans = [
                (m.offset_data, m.size) for m in tar.getmembers() if m.name.split(".")[0] in keys
            ]
        with open(path, "r+b") as f:
            for offset, size in spans:
                if size > 1000:  # the clip, not its caption
                    f.seek(offset)
                    f.write(bytes(size))


def test_a_batch_with_no_decodable_clip_is_skipped_and_counted_not_repeated(tmp_path):
    manifest, sizes = build(tmp_path)
    loader = mmcurate.video_loader(manifest, 2, T, workers=0, verify=False)
    planned = len(loader)
    zero_clips(manifest, {key for key, size in sizes.items() if size == BROKEN})
    batches = list(loader)
    keys = [key for batch in batches for key in batch["__key__"]]
    assert sorted(keys) == sorted(k for k, size in sizes.items() if size != BROKEN)
    assert {batch["bucket"] for batch in batches} == {"64x48"}
    assert loader.skipped == planned - len(batches) == 2  # the 4 broken clips' batches
    assert loader.consumed == planned  # the skipped ones count as planned (exact resume)


def test_loader_workers_leave_no_spill_folder_behind(tmp_path, monkeypatch):
    manifest, _ = build(tmp_path)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the workers' spill folders go here
    loader = mmcurate.video_loader(manifest, 2, T, workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(batch["__key__"]) for batch in loader) == 8
    loader.close()  # the workers live across epochs until then (trainer/data/video_epochs.py)
    assert [p.name for p in temp.iterdir() if p.name.startswith("mmcurate-spill-")] == []


def test_with_two_ranks_a_skipped_batch_keeps_the_steps_equal(tmp_path):
    """A rank whose batch has no decodable clip hands out its previous batch again (counted
    in `skipped`): the ranks' step counts stay equal, so a DDP step never waits forever."""
    manifest, sizes = build(tmp_path)
    options = {"world": 2, "workers": 0, "verify": False}
    loaders = [mmcurate.video_loader(manifest, 1, T, rank=r, **options) for r in (0, 1)]
    planned = [len(loader) for loader in loaders]
    broken = {key for key, size in sizes.items() if size == BROKEN}
    zero_clips(manifest, broken)
    runs = [list(loader) for loader in loaders]
    assert [len(run) for run in runs] == planned and planned[0] == planned[1]
    for loader, run in zip(loaders, runs, strict=True):
        keys = [key for batch in run for key in batch["__key__"]]
        assert not broken & set(keys)
        repeats = sum(a is b for a, b in zip(run, run[1:], strict=False))
        assert loader.skipped >= repeats
    assert sum(loader.skipped for loader in loaders) > 0

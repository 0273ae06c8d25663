"""Phase A streams a partition in byte-bounded chunks and spills big members to disk: a task's
memory does not grow with its tar or its members (issue 37), and the output is the same for
any chunk size or spill threshold.

Memory is the peak PSS of a fresh process tree (driver and local-pool worker) above the same
tree once warm (tests/bounded_build.py). Big inputs are sparse files: only their tar headers
and a marker at each end of a member take disk space."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from mmcurate.core.spill import SPILL_PREFIX
from mmcurate.core.tar_writer import member_header
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def sparse_tar(path: Path, members: list[tuple[str, int]]) -> dict[str, str]:
    """A tar of (name, size) members whose data are holes except 4 KiB of distinct bytes at
    each end; returns each member's sha256 (hashed over the holes without holding them)."""
    digests, offset = {}, 0
    with open(path, "wb") as f:
        for name, size in members:
            f.seek(offset)
            f.write(member_header(name, size))
            digests[name] = write_data(f, name, size)
            offset += 512 + size + -size % 512
        end = offset + 1024
        f.truncate(end + -end % tarfile.RECORDSIZE)
    return digests


def write_data(f, name: str, size: int) -> str:
    """A member's data at the file's position: ASCII text when small (a caption), else 4 KiB
    of distinct bytes at each end around a hole; returns its sha256."""
    mark = hashlib.sha256(name.encode()).digest() * 128  # 4 KiB
    if size < 2 * len(mark):
        data = (name.encode() * size)[:size]
        f.write(data)
        return hashlib.sha256(data).hexdigest()
    start = f.tell()
    f.write(mark)
    f.seek(start + size - len(mark))
    f.write(mark)
    digest = hashlib.sha256(mark)
    for _ in range((size - 2 * len(mark)) // MiB):
        digest.update(bytes(MiB))
    digest.update(bytes((size - 2 * len(mark)) % MiB))
    digest.update(mark)
    return digest.hexdigest()


def video_members(total: int) -> list[tuple[str, int]]:
    """`mp4` members of 4 to 8 MiB (with a caption each) adding up to about `total` bytes."""
    members, at, i = [], 0, 0
    while at < total:
        size = (4 + i % 5) * MiB
        members += [(f"s{i:06d}.mp4", size), (f"s{i:06d}.txt", 16)]
        at, i = at + size, i + 1
    return members


def config(source: Path, out: Path, **source_options) -> dict:
    return {
        "source": {"kind": "webdataset", "path": str(source), **source_options},
        "output": {"path": str(out)},
        "ray": {"runtime": "local", "num_cpus": 1},
    }


def measured_build(tmp_path: Path, tar: Path, name: str, **source_options) -> dict:
    """Build `tar` in a fresh process (after a warm build of a small tar); returns its
    {"idle", "peak"} and the TMPDIR it ran with (where spill folders go)."""
    warm = tmp_path / "warm.tar"
    if not warm.exists():
        sparse_tar(warm, video_members(16 * MiB))
    temp = tmp_path / f"tmp-{name}"
    temp.mkdir()
    spec = {
        "warm": config(warm, tmp_path / f"warm-out-{name}", **source_options),
        "build": config(tar, tmp_path / f"out-{name}", **source_options),
    }
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    env = os.environ | {"TMPDIR": str(temp)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bounded_build.py"), str(tmp_path / f"{name}.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"tmpdir": temp}


def member_digests(shards: list[Path]) -> dict[str, str]:
    """sha256 of every member of the output shards, streamed (never a member in memory)."""
    found = {}
    for shard in shards:
        with tarfile.open(shard, "r|") as tar:
            for member in tar:
                digest, data = hashlib.sha256(), tar.extractfile(member)
                while block := data.read(MiB):
                    digest.update(block)
                found[member.name] = digest.hexdigest()
    return found


def spill_folders(temp: Path) -> list[str]:
    return [p.name for p in temp.iterdir() if p.name.startswith(SPILL_PREFIX)]


def test_peak_memory_does_not_grow_with_the_tar(tmp_path):
    small, big = tmp_path / "small.tar", tmp_path / "big.tar"
    sparse_tar(small, video_members(256 * MiB))
    sparse_tar(big, video_members(2048 * MiB))
    chunk = 16 * MiB
    runs = [measured_build(tmp_path, tar, tar.stem, chunk_bytes=chunk) for tar in (small, big)]
    above = [run["peak"] - run["idle"] for run in runs]
    print(f"peak above idle: 256 MB tar {above[0] / MiB:.1f} MiB, 2 GB {above[1] / MiB:.1f} MiB")
    assert abs(above[1] - above[0]) < 32 * MiB
    assert max(above) < 3 * chunk + 64 * MiB
    manifest = json.loads((tmp_path / "out-big" / "manifest.json").read_text())
    assert manifest["samples"] == len(video_members(2048 * MiB)) // 2


def test_members_bigger_than_memory_stream_through_disk(tmp_path):
    tar = tmp_path / "huge.tar"
    members = [("a.mp4", 1 << 30), ("a.txt", 8), ("b.mp4", 1 << 30), ("b.txt", 8)]
    expected = sparse_tar(tar, members)
    run = measured_build(tmp_path, tar, "huge")
    print(f"peak above idle, two 1 GiB members: {(run['peak'] - run['idle']) / MiB:.1f} MiB")
    assert run["peak"] - run["idle"] < 64 * MiB
    shards = sorted((tmp_path / "out-huge").glob("shard-*.tar"))
    got = member_digests(shards)
    assert {name: got[name] for name in ("a.mp4", "b.mp4")} == {
        name: expected[name] for name in ("a.mp4", "b.mp4")
    }
    assert spill_folders(run["tmpdir"]) == []  # every task's folder removed


def build_files(out: Path) -> tuple[dict[str, bytes], list[dict]]:
    shards = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}
    return shards, json.loads((out / "manifest.json").read_text())["shards"]


@pytest.mark.parametrize("kind", ["webdataset", "images"])
def test_chunking_and_spilling_change_no_output_byte(ray_session, tmp_path, kind, image_folder,
                                                     tar_shards):  # fmt: skip
    if kind == "images":
        source = image_folder(n=12, exact_copies=2)
        stages = [{"name": "decode_image", "resize": {"size": 32}}, {"name": "exact_dedupe"}]
        stages += [{"name": "near_dedupe"}]
    else:
        source = tar_shards(n_shards=2, per_shard=8) / "*.tar"
        stages = [{"name": "exact_dedupe"}]
    before = sorted(str(p) for p in Path(str(source).removesuffix("/*.tar")).rglob("*"))
    outputs = {}
    for name, options in {
        "defaults": {},
        "tiny_chunks": {"chunk_bytes": 1},
        "all_spilled": {"spill_bytes": 0, "chunk_bytes": 3000},
    }.items():
        cfg = {
            "source": {"kind": kind, "path": str(source), **options},
            "stages": stages,
            "output": {"path": str(tmp_path / name)},
        }
        run_build(BuildConfig.model_validate(cfg), False)
        outputs[name] = build_files(tmp_path / name)
    assert outputs["tiny_chunks"] == outputs["defaults"]
    assert outputs["all_spilled"] == outputs["defaults"]
    assert outputs["defaults"][1] and outputs["defaults"][1][0]["samples"] > 0
    after = sorted(str(p) for p in Path(str(source).removesuffix("/*.tar")).rglob("*"))
    assert after == before  # a local file passed by path is never deleted


def test_a_tar_read_in_chunks_with_spills_is_the_tar_read_whole(tmp_path, tar_shards):
    from mmcurate.core.spill import Spilled
    from mmcurate.pipeline.config import SourceConfig
    from mmcurate.pipeline.sources.partitions import plan_source, read_chunks, read_partition
    from mmcurate.pipeline.sources.samples import Reading

    part = plan_source(SourceConfig(kind="webdataset", path=f"{tar_shards(1, 6)}/*.tar"), {})[0]
    whole = read_partition(part, {})
    reading = Reading(batch_size=64, chunk_bytes=1, spill_bytes=0, folder=str(tmp_path))
    chunks = list(read_chunks(part, {}, reading))
    assert [len(c["__key__"]) for c in chunks] == [1] * 6  # one sample reaches 1 byte
    for col in ("__key__", "__index__", "__drop__", "txt", "json"):
        assert [v for c in chunks for v in c[col]] == whole[col]
    spilled = [v for c in chunks for v in c["jpg"]]
    assert all(isinstance(v, Spilled) and v.owned for v in spilled)
    assert [v.read() for v in spilled] == whole["jpg"]


def test_image_stages_read_a_spilled_image_from_disk(tmp_path):
    from mmcurate.core.spill import Spilled, spill_bytes
    from mmcurate.pipeline.demo_data import make_demo_images
    from mmcurate.stages.lib.pixels import SPILLED_IMAGE_MAX
    from mmcurate.stages.registry import build_stages

    make_demo_images(tmp_path / "img", n=4, exact_copies=0, broken=0)
    photos = sorted((tmp_path / "img").glob("*.jpg"))[:2]
    stages = [{"name": "decode_image", "resize": {"size": 16}}, {"name": "exact_dedupe"}]
    stages += [{"name": "exact_dedupe", "of": "pixels"}, {"name": "near_dedupe"}]

    def run(values: list) -> dict:
        batch = {"__key__": ["a", "b", "c"], "jpg": values, "json": [None] * 3}
        batch |= {"__drop__": [None] * 3, "__drop_stage__": [None] * 3}
        for stage in build_stages(stages[1:]):  # on the source bytes, then decoded
            batch = stage(batch)
        return build_stages(stages[:1])[0](batch)

    data = [p.read_bytes() for p in photos]
    held = run([*data, data[0]])
    huge = Spilled(str(photos[0]), SPILLED_IMAGE_MAX + 1, owned=False)  # never opened
    on_disk = run([spill_bytes(data[0], str(tmp_path)), Spilled(str(photos[1]), len(data[1]),
                                                                 owned=False), huge])  # fmt: skip
    columns = ("sha256", "phash", "jpg", "json")
    assert {c: on_disk[c][:2] for c in columns} == {c: held[c][:2] for c in columns}
    assert on_disk["__drop__"] == [None, None, "too_big"]


def test_a_spill_folder_that_cannot_take_a_member_fails_the_task_not_the_tar(tmp_path, tar_shards):
    """A local disk that cannot take a spilled member (full, gone: here a folder path that is
    a file) is the machine's fault: the read fails with one line naming the folder, so the
    task is retried, instead of the tar's remaining samples being dropped as `corrupt_tar`."""
    from mmcurate.core.spill import SpillError
    from mmcurate.pipeline.config import SourceConfig
    from mmcurate.pipeline.sources.partitions import plan_source, read_chunks
    from mmcurate.pipeline.sources.samples import Reading

    part = plan_source(SourceConfig(kind="webdataset", path=f"{tar_shards(1, 3)}/*.tar"), {})[0]
    not_a_folder = tmp_path / "spill"
    not_a_folder.write_bytes(b"")
    reading = Reading(batch_size=64, chunk_bytes=1, spill_bytes=0, folder=str(not_a_folder))
    with pytest.raises(SpillError, match=f"to {not_a_folder}: Not a directory"):
        list(read_chunks(part, {}, reading))
    assert not_a_folder.read_bytes() == b""

"""Video keys stay unique once clip_split numbers clips (`<key>_0000`): a file `a_0001.mp4`
beside `a.mp4` gets its whole-path key when planned, the same for every partitioning."""

import json
from collections import Counter

import pyarrow.parquet as pq
from mmcurate.core.tario import iter_tar_samples, safe_key
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig, SourceConfig
from mmcurate.pipeline.sources.images import plan_images
from mmcurate.pipeline.sources.partitions import plan_source
from mmcurate.pipeline.video_data import encode_video

NAMES = {  # file -> frames at 24 fps
    "a.mp4": 48,  # two 1 s clips: a_0000, a_0001
    "a_0001.mp4": 6,  # 0.25 s: no clip (dropped, it keeps its source key)
    "a_0000.mp4": 48,  # two clips of its own
    "a_0000_0001.mp4": 24,  # a clip key of clip_split listed twice
    "b_0001.mp4": 24,  # no video `b`: its key stays
}


def video_folder(root):
    root.mkdir()
    for name, frames in NAMES.items():
        (root / name).write_bytes(encode_video(frames, 24))
        (root / name.replace(".mp4", ".txt")).write_text(f"the video {name}")
    return root


def planned_keys(path: str, files_per_task: int) -> dict[str, str]:
    cfg = SourceConfig.model_validate(
        {"kind": "videos", "path": path, "files_per_task": files_per_task}
    )
    return {e.rel: e.key for part in plan_source(cfg, {}) for e in part.entries}


def test_a_key_clip_split_could_make_is_replaced_by_its_whole_path_key(tmp_path):
    folder = video_folder(tmp_path / "in")
    keys = planned_keys(str(folder), 2)
    assert keys == {
        "a.mp4": "a",
        "a_0001.mp4": safe_key("a_0001.mp4"),
        "a_0000.mp4": safe_key("a_0000.mp4"),
        "a_0000_0001.mp4": safe_key("a_0000_0001.mp4"),
        "b_0001.mp4": "b_0001",
    }
    assert all(planned_keys(str(folder), n) == keys for n in (1, 3, 100))
    assert planned_keys(str(folder / "*.mp4"), 1) == keys  # the glob planner too


def test_images_named_like_clips_keep_their_keys(tmp_path):
    (tmp_path / "in").mkdir()
    for name in ("a.jpg", "a_0001.jpg"):
        (tmp_path / "in" / name).write_bytes(b"not decoded when planning")
    cfg = SourceConfig.model_validate({"kind": "images", "path": str(tmp_path / "in")})
    keys = [e.key for part in plan_images(cfg, {}) for e in part.entries]
    assert keys == ["a", "a_0001"]


def test_clips_and_dropped_videos_never_share_a_key(ray_session, tmp_path):
    folder = video_folder(tmp_path / "in")
    source = {"kind": "videos", "path": str(folder), "files_per_task": 2}
    written, rows = split_build(source, tmp_path / "out")
    assert [k for k, n in Counter(r["key"] for r in rows).items() if n > 1] == []
    twice, twice_nested = safe_key("a_0000.mp4"), safe_key("a_0000_0001.mp4")
    clips = ["a_0000", "a_0001", f"{twice}_0000", f"{twice}_0001", f"{twice_nested}_0000"]
    assert sorted(written) == sorted([*clips, "b_0001_0000"])
    dropped = {r["key"]: r["drop_reason"] for r in rows if r["drop_reason"]}
    assert dropped == {safe_key("a_0001.mp4"): "no_clips"}
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["stages"][1]["dropped"] == {"no_clips": 1}


def test_a_webdataset_sample_named_like_a_clip_is_never_written_beside_it(ray_session, tmp_path):
    """A tar's keys are not known before it is planned, so a sample `a_0001` beside the video
    `a` cannot be renamed as a folder's file is. It is never written beside the clip `a_0001`:
    clip_split drops what is not a video (`no_video`), and a second live sample of a key is
    dropped by the repeated-keys round, so the shards' keys stay unique. Its signatures row
    keeps its source key, told apart from the clip's by `parent` (the clip's video)."""
    import io
    import tarfile

    (tmp_path / "in").mkdir()
    members = {"a.mp4": encode_video(48, 24), "a.txt": b"two clips", "a_0001.txt": b"an image"}
    members["a_0001.jpg"] = make_jpeg()
    with tarfile.open(tmp_path / "in" / "shard-0.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    source = {"kind": "webdataset", "path": str(tmp_path / "in" / "*.tar")}
    written, rows = split_build(source, tmp_path / "out")
    assert sorted(written) == sorted(set(written))
    assert set(written) == {"a_0000", "a_0001"}
    dropped = [r for r in rows if r["drop_reason"]]
    assert [(r["key"], r["drop_reason"]) for r in dropped] == [("a_0001", "no_video")]
    assert sorted(str(r["parent"]) for r in rows if r["key"] == "a_0001") == ["None", "a"]


def split_build(source: dict, out) -> tuple[list[str], list[dict]]:
    """A clip_split build of `source` (1 s clips): the shards' keys, and the signatures rows."""
    cfg = BuildConfig.model_validate(
        {
            "source": source,
            "stages": [{"name": "clip_split", "mode": "fixed", "window_s": 1.0, "min_clip_s": 0.5}],
            "output": {"path": str(out)},
        }
    )
    written = []
    for shard in run_build(cfg, progress=False)["shards"]:
        with open(out / shard["name"], "rb") as f:
            written += [sample["__key__"] for sample in iter_tar_samples(f)]
    return written, pq.read_table(out / "signatures").to_pylist()


def make_jpeg() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 10, 10)).save(out, "JPEG")
    return out.getvalue()

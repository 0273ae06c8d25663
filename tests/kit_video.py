"""Small video builds for the video loader's tests: real encoded clips with captions."""

from pathlib import Path
from typing import Any

from mmcurate.pipeline.video_data import encode_video

import mmcurate


def clip_build(
    root: Path,
    clips: list[tuple[int, tuple[int, int]]],
    shard_max_samples: int = 2,
    out: str = "out",
    **source: Any,
) -> str:
    """A `videos` build of one clip per (frames, (width, height)) at 24 fps, numbered frames,
    `caption i`, from root/in into root/`out`; `source` adds source options (e.g.
    files_per_task). The manifest's path."""
    folder = root / "in"
    folder.mkdir()
    for i, (frames, size) in enumerate(clips):
        (folder / f"clip{i}.mp4").write_bytes(encode_video(frames, 24, size=size))
        (folder / f"clip{i}.txt").write_text(f"caption {i}")
    config = {
        "source": {"kind": "videos", "path": str(folder), **source},
        "stages": [],
        "output": {"path": str(root / out), "shard_max_samples": shard_max_samples},
    }
    return mmcurate.build(config)["manifest"]

"""Child of tests/video/test_video_by_path.py: runs one video stage on a small MP4 (warm-up and
reference), measures idle, then runs it on the same MP4 padded with a big `free` box and
prints, as JSON, the peak PSS of the whole process tree (the decoder child included) above
idle and whether the results equal the small file's.

argv: stage (video_frames | clip_split), small path, padded path, how (spilled | bytes:
the padded file read whole into the sample, as before issue 37), the spill folder."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmcurate.core.spill import Spilled, media_bytes, set_task_folder  # noqa: E402
from mmcurate.stages.registry import build_stage  # noqa: E402

from bench.memwatch import PeakMemory, tree_pss  # noqa: E402

SPECS = {
    "video_frames": {"name": "video_frames", "num_frames": 4, "size": 64},
    "clip_split": {"name": "clip_split", "mode": "fixed", "window_s": 1.0, "inline_clip_bytes": 0},
}

META = ("frame_indices", "frame_timestamps", "fps", "decoder")


def batch_of(value: object) -> dict:
    batch = {"__key__": ["v"], "__drop__": [None], "__drop_stage__": [None], "__index__": [0]}
    return batch | {"txt": ["a video"], "json": [None], "mp4": [value]}


def summary(stage: str, out: dict) -> dict:
    """What must not change with the padding: drops, frames, clip bounds and clip files."""
    found = {"drop": out["__drop__"], "keys": out["__key__"]}
    if stage == "video_frames":
        frames = sorted(c for c in out if c.endswith(".jpg"))
        found["frames"] = [hashlib.sha256(out[c][0]).hexdigest() for c in frames]
        meta = json.loads(out["json"][0])
        found["meta"] = {k: meta[k] for k in META}
    else:
        found["meta"] = [json.loads(m) for m in out["json"]]
        found["spilled"] = [isinstance(v, Spilled) for v in out["mp4"]]
        found["clips"] = [hashlib.sha256(media_bytes(v)).hexdigest() for v in out["mp4"]]
    return found


def main() -> None:
    stage_name, small, padded, how, folder = sys.argv[1:6]
    set_task_folder(folder)
    stage = build_stage(SPECS[stage_name])
    size = Path(small).stat().st_size
    reference = summary(stage_name, stage(batch_of(Spilled(small, size, owned=False))))
    idle = tree_pss()
    with PeakMemory(interval=0.005) as peak:
        big = Spilled(padded, Path(padded).stat().st_size, owned=False)
        out = stage(batch_of(big if how == "spilled" else media_bytes(big)))
    found = summary(stage_name, out)
    print(json.dumps({"peak": peak.bytes - idle, "same": found == reference, "found": found}))


if __name__ == "__main__":
    main()

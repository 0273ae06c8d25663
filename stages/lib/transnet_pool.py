"""clip_split `mode: transnetv2` with the network in an actor pool (`num_gpus`, `concurrency`,
chosen as for clip_score: pipeline/runtime/actors.py). The in-task path (transnet.split_shots)
runs everything in the decoder child; with a pool the work is split in three:

1. the decoder child (`scan_to_file`): the one decoding pass, every frame shrunk to 48x27 as in
   the in-task path, fed to the cheap first pass and appended to a file of raw frames in the
   task's spill folder (3,888 bytes a frame: 5.8 MB a video-minute at 25 fps; on disk, not in
   memory; removed after the call);
2. the task (`pooled_spans`): the in-task path's predictor (transnet.predictor_for) fed from
   that file, CHUNK frames at a time, its batched windows scored by a pool's actor
   (`TransNetScorer.middles`, the same `middles` on the same network), then the same
   `shot_spans`: the same windows give the same shots;
3. the decoder child (`transnet.clips_of_spans`): the clips cut, as in the in-task path.

Memory in the task: a chunk of small frames (1 MB) and the predictor's few windows. The task's
side imports no decoder (PyAV): bench/gpu_video.py runs it on a device without one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from mmcurate.core.spill import Media
from mmcurate.stages.lib.shot_candidates import ChangeSignal
from mmcurate.stages.lib.transnet import predictor_for, shot_spans, small_rgb
from mmcurate.stages.lib.transnet_net import HEIGHT, WIDTH, batch_for, load_net, middles

if TYPE_CHECKING:
    from mmcurate.stages.lib.video_split import Scan

CHUNK = 256  # frames read from the file at a time
FRAME_BYTES = HEIGHT * WIDTH * 3


class TransNetScorer:
    """A pool actor's model (ModelActor's `loader`): the network on the actor's device."""

    def __init__(self, device: str) -> None:
        self.net = load_net(device)

    def middles(self, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return middles(self.net, windows)

    def batch(self) -> int:
        """Windows a forward pass on this device (transnet_net.batch_for)."""
        return batch_for(self.net)


def scan_to_file(value: Media, opts: dict[str, Any], path: str) -> tuple[Scan, ChangeSignal]:
    """Decoder child: the scan, every 48x27 frame written to `path`, and the first pass."""
    from mmcurate.stages.lib.video_decode import Watched
    from mmcurate.stages.lib.video_split import end_time, scan

    signal, watched = ChangeSignal(), Watched()
    with open(path, "wb") as out:

        def on_frame(frame: Any) -> None:
            small = small_rgb(frame)
            signal.add(small)
            out.write(small.tobytes())

        found = scan(value, None, watched, on_frame=on_frame)
    watched.to(end_time(found.times, found.fps))
    return found, signal


def pooled_spans(
    path: str, signal: ChangeSignal, opts: dict[str, Any], call: Callable[..., Any]
) -> tuple[list[tuple[int, int]], int]:
    """In the task: (the shots' frame ranges, windows scored) from the frames file, the
    network reached through `call(method, *args)` (a pool's RemoteEncoder.call)."""
    predictor = predictor_for(opts, signal, partial(call, "middles"), call("batch"))
    with open(path, "rb") as frames:
        while chunk := frames.read(CHUNK * FRAME_BYTES):
            for small in np.frombuffer(chunk, np.uint8).reshape(-1, HEIGHT, WIDTH, 3):
                predictor.add(small)
    probs, extent = predictor.finish()
    return shot_spans(probs, opts["threshold"], extent, signal), predictor.scored

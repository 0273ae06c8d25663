"""Progress inside long partitions: a build's bar shows samples done and seconds of video
decoded or cut while a partition runs (`partitions: 0/1 [..., samples 5]`), on the local pool
and on Ray, and nothing with `--no-progress`. No timing assertions: a task waits until the
driver's bar shows what it reported (a deadline only turns a hang into a failure)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mmcurate.core.progress import UNITS, Meter, channel, report
from mmcurate.pipeline.config import RayConfig
from mmcurate.pipeline.runtime import session
from mmcurate.pipeline.video_data import encode_video
from mmcurate.stages.lib.isolation import Isolated
from mmcurate.stages.lib.video_decode import sample_video
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[2]
FRAMES = {"mode": "uniform", "num_frames": 4, "fps": 1.0, "size": 32, "crop": True, "quality": 80}


def counts(**named: float) -> list[float]:
    return [named.get(unit, 0.0) for unit in UNITS]


def test_the_bar_shows_what_running_tasks_reported_and_refreshes_only_on_change():
    out = io.StringIO()
    bar = tqdm(total=1, desc="partitions", unit="task", file=out)
    seen = [counts(), counts(samples=37, video_s=41.4), counts(samples=37, video_s=41.4)]
    seen.append(counts(samples=64, video_s=70, cut_s=12))
    meter = Meter(bar.set_postfix_str, lambda: seen.pop(0))
    meter.refresh()  # nothing done yet: no postfix
    assert "samples" not in out.getvalue()
    meter.refresh()
    assert out.getvalue().endswith("0/1 [00:00<?, ?task/s, samples 37, video 41 s]")
    written = len(out.getvalue())
    meter.refresh()  # the same counts: not drawn again
    assert len(out.getvalue()) == written
    meter.refresh()
    assert "0/1" in out.getvalue()[written:]
    assert "samples 64, video 70 s, cut 12 s]" in out.getvalue()[written:]
    bar.close()


class Collected:
    """A channel that keeps what it is given (core.progress.Channel)."""

    def __init__(self) -> None:
        self.counts = counts()

    def add(self, column: int, units: float) -> None:
        self.counts[column] += units

    def close(self) -> None:
        pass


def test_seconds_decoded_in_the_isolated_decoder_reach_the_calling_process():
    """video_frames decodes in a child process: what it reports there comes back over its
    pipe, into the caller's channel (two videos of 2 s and 3 s: 5 s)."""
    decoder, got = Isolated(preload=("mmcurate.stages.lib.video_decode",)), Collected()
    try:
        with channel(got):
            for frames in (48, 72):
                result = decoder.call(sample_video, (encode_video(frames), FRAMES), 60)
                assert len(result["frames"]) == 4
    finally:
        decoder.stop()
    assert got.counts == counts(video_s=5.0)


def reports_then_waits(shown: str) -> int:
    """A task that reports 5 samples and 2 s of video, then waits until the driver's bar
    (written to the file `shown`) shows them before it reports 5 more and finishes."""
    report(5, "samples")
    report(2, "video_s")
    deadline = time.monotonic() + 60
    while "samples 5, video 2 s" not in Path(shown).read_text():
        if time.monotonic() > deadline:
            raise AssertionError("the bar never showed the running task's counts")
        time.sleep(0.05)
    report(5, "samples")
    return 1


def shown_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: session.Runtime
) -> str:
    shown = tmp_path / "stderr.txt"
    with shown.open("w") as stderr:
        monkeypatch.setattr(sys, "stderr", stderr)  # where tqdm draws the bar
        done = runtime.run_tasks([str(shown)], reports_then_waits, "partitions", progress=True)
        assert done == [1]
    return shown.read_text()


def assert_counted_while_running(text: str) -> None:
    """The bar's refreshes: the task's first counts drawn while it runs (0/1), the totals of
    both its reports once it is done (1/1)."""
    drawn = [line.rstrip() for line in re.split("[\r\n]", text) if line.startswith("partitions")]
    first = next(line for line in drawn if "samples 5, video 2 s" in line)
    assert "0/1 [" in first, first
    assert "1/1 [" in drawn[-1] and drawn[-1].endswith("samples 10, video 2 s]"), drawn[-1]


def test_the_local_pool_shows_a_partition_counts_before_it_completes(tmp_path, monkeypatch):
    runtime = session.connect(RayConfig(runtime="local", num_cpus=1))
    try:
        text = shown_while_running(tmp_path, monkeypatch, runtime)
    finally:
        runtime.close()
    assert_counted_while_running(text)


def test_ray_tasks_show_a_partition_counts_before_it_completes(ray_session, tmp_path, monkeypatch):
    from ray import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # Ray's workers cannot import tests/
    try:
        text = shown_while_running(tmp_path, monkeypatch, session.Runtime())
        assert_counted_while_running(text)
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def video_build(tmp_path: Path, name: str) -> Path:
    """Three videos of 2 s (48 frames at 24 fps) in one partition: cut into 1 s clips, then
    frames sampled from each clip."""
    folder = tmp_path / "videos"
    if not folder.exists():
        folder.mkdir()
        for i in range(3):
            (folder / f"v{i}.mp4").write_bytes(encode_video(48, size=(64, 48)))
    config = {
        "source": {"kind": "videos", "path": str(folder)},
        "stages": [
            {"name": "clip_split", "mode": "fixed", "window_s": 1.0},
            {"name": "video_frames", "num_frames": 2, "size": 32},
        ],
        "output": {"path": str(tmp_path / name)},
        "ray": {"num_cpus": 1},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def build(config: Path, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    command = [sys.executable, "-m", "mmcurate", "build", str(config), *flags]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


def test_a_video_build_ends_with_the_partition_totals_and_no_progress_prints_none(tmp_path):
    """The build command on the default (local) runtime: 3 videos, 6 s; clip_split scans 6 s
    and cuts 6 clips of 1 s, video_frames decodes the 6 s of clips: video 12 s, cut 6 s."""
    done = build(video_build(tmp_path, "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    bar = [line for line in re.split("[\r\n]", done.stderr) if line.startswith("partitions")][-1]
    assert "1/1 [" in bar and bar.rstrip().endswith("samples 3, video 12 s, cut 6 s]"), bar
    quiet = build(video_build(tmp_path, "quiet"), "--no-progress")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "partitions" not in quiet.stderr and "samples" not in quiet.stderr

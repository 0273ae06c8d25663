"""Every stage that looks at pixels sees them as a viewer does (stages/lib/pixels.py): upright by
EXIF orientation, deep grey scaled to 8 bits, a damaged EXIF block or a decoder's odd exception
a per-sample drop at worst. Plus the option checks found with them: `device: cuda` without a
GPU, a score range that keeps nothing, an output too long for its format."""

import io
import json
import struct

import numpy as np
import pyarrow as pa
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.base import DROP
from mmcurate.stages.lib.clip_model import prepare_images
from mmcurate.stages.lib.image_hash import image_hash
from mmcurate.stages.registry import build_stage
from PIL import Image

from tests.kit_stages import batch_of, decoded


def jpeg_with_exif(orientation: int, odd_tag: bool) -> bytes:
    """A 40x30 JPEG, left half black and right half white, whose EXIF says `orientation`;
    `odd_tag`: also tag 0x014C (a number field in Pillow) holding text, which made Pillow's
    exif_transpose raise struct.error while it rewrote the block."""
    pixels = np.zeros((30, 40, 3), np.uint8)
    pixels[:, 20:] = 255
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    entries = [struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)]
    if odd_tag:
        entries.append(struct.pack(">HHII", 0x014C, 2, 6, 8 + 2 + 2 * 12 + 4))
    tiff = b"MM\x00\x2a" + struct.pack(">IH", 8, len(entries)) + b"".join(entries)
    tiff += b"\x00\x00\x00\x00" + b"Canon\x00"
    app1 = b"Exif\x00\x00" + tiff
    data = out.getvalue()
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + data[2:]


@pytest.mark.parametrize("odd_tag", [False, True])
def test_an_odd_exif_tag_never_fails_the_build_and_the_image_is_upright(tmp_path, odd_tag):
    """Bug: one JPEG whose EXIF held text in a number field stopped the whole build with a
    struct.error traceback."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg_with_exif(6, odd_tag))
    (folder / "a.txt").write_text("a picture")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": [{"name": "decode_image", "resize": {"mode": "none"}, "format": "png"}],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    assert run_build(cfg, progress=False)["samples"] == 1
    import tarfile

    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        png = tar.extractfile("a.png").read()
    image = np.asarray(decoded(png).convert("L"), np.int32)
    assert image.shape == (40, 30)  # orientation 6: turned a quarter clockwise
    assert image[:18].mean() < 40 and image[22:].mean() > 215  # black on top, white below


def deep_grey(kind: int, mode: str) -> bytes:
    """Three clearly different 16-bit or float grey pictures, all above 8-bit white."""
    ramp = np.linspace(0, 1, 64 * 64).reshape(64, 64)
    pictures = [ramp, ramp.T, (np.indices((64, 64)).sum(0) // 8 % 2).astype(float)]
    values = pictures[kind]
    out = io.BytesIO()
    if mode == "I;16":
        Image.fromarray((values * 60000 + 1000).astype(np.uint16)).save(out, "PNG")
    else:
        Image.fromarray(values.astype(np.float32), "F").save(out, "TIFF")
    return out.getvalue()


@pytest.mark.parametrize("mode", ["I;16", "F"])
def test_distinct_deep_grey_images_are_not_duplicates(mode):
    """Bug: Pillow's convert clipped 16-bit grey to white and float to black, so three
    different pictures had one pixel sha256 and one perceptual hash, and two were dropped."""
    images = [deep_grey(kind, mode) for kind in range(3)]
    stage = build_stage({"name": "exact_dedupe", "of": "pixels"})
    out = stage(batch_of(images))
    assert out[DROP] == [None] * 3 and len(set(out["sha256"])) == 3
    hashes = [image_hash(data)[0] for data in images]
    assert len(set(hashes)) == 3 and 0 not in hashes


def test_model_input_is_upright_and_scaled():
    """Bug: clip_score's input ignored EXIF orientation (a portrait photo scored sideways) and
    clipped 16-bit grey to white."""
    turned = jpeg_with_exif(6, odd_tag=True)
    deep = deep_grey(0, "I;16")
    pixels, reasons = prepare_images([turned, deep], lambda image: image, 10_000)
    assert reasons == [None, None]
    assert pixels[0].shape[:2] == (40, 30)
    assert pixels[0][:18].mean() < 40 and pixels[0][22:].mean() > 215
    assert 20 < pixels[1].mean() < 235  # a ramp, not all white


def test_exact_dedupe_keeps_the_highest_clip_score():
    """Bug: exact_dedupe kept the smallest key where the documented policy (and near_dedupe)
    keeps the highest clip_score: identical images with different captions score apart."""
    stage = build_stage({"name": "exact_dedupe"})
    keys = ["a", "b", "c", "d", "e"]
    table = pa.table(
        {
            "__key__": keys,
            "sha256": ["x", "x", "x", "y", "y"],
            "clip_score": pa.array([0.1, 0.3, float("nan"), None, 0.2], pa.float32()),
            DROP: pa.nulls(5, pa.string()),
        }
    )
    assert stage.decide(table) == {
        "a": ("duplicate_exact", "b"),
        "c": ("duplicate_exact", "b"),  # NaN ranks last
        "d": ("duplicate_exact", "e"),  # no score ranks last
    }
    without = table.drop_columns(["clip_score"])  # no scores: the smallest key
    assert stage.decide(without) == {
        "b": ("duplicate_exact", "a"),
        "c": ("duplicate_exact", "a"),
        "e": ("duplicate_exact", "d"),
    }


def test_cuda_without_a_gpu_is_one_line_before_any_work(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(jpeg_with_exif(1, odd_tag=False))
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": [
                {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None,
                 "device": "cuda", "num_gpus": 0},
            ],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )  # fmt: skip
    with pytest.raises(ConfigError) as err:
        run_build(cfg, progress=False)
    assert str(err.value) == "stages.0.device: cuda, but this machine has no GPU"
    assert not (tmp_path / "out" / "_work" / "candidates").exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"min_score": 0.9, "max_score": 0.1}, "min_score 0.9 is above max_score 0.1"),
        ({"concepts": {"nsfw": {"min": 0.8, "max": 0.2}}}, "min 0.8 is above max 0.2"),
    ],
)
def test_a_score_range_that_keeps_nothing_is_refused(spec, message):
    with pytest.raises(ConfigError) as err:
        build_stage({"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, **spec})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_output_longer_than_webp_can_hold_is_too_big():
    strip = io.BytesIO()
    Image.new("RGB", (20000, 1), (10, 20, 30)).save(strip, "PNG")
    for fmt, reason in (("webp", "too_big"), ("png", None)):
        stage = build_stage({"name": "decode_image", "resize": {"mode": "none"}, "format": fmt})
        out = stage(batch_of([strip.getvalue()]))
        assert out[DROP] == [reason]
        if reason is None:
            assert json.loads(out["json"][0])["width"] == 20000


def test_the_report_does_not_decode_a_picture_too_large_to_show():
    """Bug: report.html decoded in the driver the very images decode_image had dropped as too
    large (a 13,000 x 13,000 PNG of 194 KB took the driver to 931 MB)."""
    from mmcurate.pipeline.report.page import THUMB_MAX_PIXELS, thumb

    big = io.BytesIO()
    Image.new("L", (5001, 5000)).save(big, "PNG")
    assert 5001 * 5000 > THUMB_MAX_PIXELS
    assert "undecodable" in thumb(big.getvalue())
    small = io.BytesIO()
    Image.new("L", (300, 200)).save(small, "PNG")
    assert "<img" in thumb(small.getvalue())


def test_upload_temporaries_of_killed_processes_are_swept(tmp_path, monkeypatch):
    """Bug: a worker killed while writing a candidate tar or shard for an object store left
    the whole file in /tmp for good. Upload temporaries carry their writer's pid; a file whose
    writer is gone and that nobody touched for an hour is removed by the next process."""
    import os
    import subprocess
    import tempfile

    from mmcurate.core import atomic as storage

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(storage, "_SWEPT", [])
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = {
        "gone_old": f"mmcurate-up-{dead.pid}-a",
        "gone_new": f"mmcurate-up-{dead.pid}-b",
        "alive_old": f"mmcurate-up-{os.getpid()}-c",
        "other": "someone-else-d",
    }
    for label, name in names.items():
        (tmp_path / name).write_bytes(b"x")
        if label != "gone_new":
            os.utime(tmp_path / name, (0, 0))
    storage.sweep_uploads()
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {names["gone_new"], names["alive_old"], names["other"]}


@pytest.mark.parametrize("fmt", ["TIFF", "JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_orientation_of_every_format_comes_out_as_a_viewer_shows_it(fmt, orientation):
    """Bug: Pillow turns a TIFF upright as it loads it; `upright` read the tag of the unloaded
    TIFF and turned it a second time (landscape for 6 and 8, mirrored for 2, 4, 5, 7)."""
    from mmcurate.stages.lib.pixels import upright
    from PIL import ImageOps

    pixels = np.zeros((24, 40, 3), np.uint8)
    pixels[:12, :10] = 255  # a white block in one corner shows any turn or mirror
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, exif=exif, **({"quality": 95} if fmt != "PNG" else {}))
    viewer = ImageOps.exif_transpose(Image.open(io.BytesIO(out.getvalue())))
    ours = upright(Image.open(io.BytesIO(out.getvalue())))
    assert ours.size == viewer.size
    difference = np.abs(np.asarray(ours, np.int16) - np.asarray(viewer, np.int16))
    assert difference.max() <= 8  # lossy formats: the same decode either way

"""aspect_buckets: bucket lists and assignment equal an implementation written here from the
published rules (kohya-ss sd-scripts, the SDXL paper's table, NovelAI's write-up); real JPEGs
(EXIF-rotated among them) come out exactly their bucket's size, never enlarged unless asked,
with the json fields a trainer needs for size and crop conditioning."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.stages.registry import build_stage
from PIL import Image

from tests.kit_stages import batch_of

# The SDXL paper, appendix (multi-aspect training), as printed: height, width, aspect ratio.
SDXL_TABLE = """
512 2048 0.25  512 1984 0.26  512 1920 0.27  512 1856 0.28  576 1792 0.32  576 1728 0.33
576 1664 0.35  640 1600 0.4   640 1536 0.42  704 1472 0.48  704 1408 0.5   704 1344 0.52
768 1344 0.57  768 1280 0.6   832 1216 0.68  832 1152 0.72  896 1152 0.78  896 1088 0.82
960 1088 0.88  960 1024 0.94  1024 1024 1.0  1024 960 1.07  1088 960 1.13  1088 896 1.21
1152 896 1.29  1152 832 1.38  1216 832 1.46  1280 768 1.67  1344 768 1.75  1408 704 2.0
1472 704 2.09  1536 640 2.4   1600 640 2.5   1664 576 2.89  1728 576 3.0   1792 576 3.11
1856 512 3.62  1920 512 3.75  1984 512 3.88  2048 512 4.0
"""


def sdxl_reference() -> set[tuple[int, int]]:
    values = SDXL_TABLE.split()
    rows = [values[i : i + 3] for i in range(0, len(values), 3)]
    for h, w, ratio in rows:
        assert abs(int(h) / int(w) - float(ratio)) < 0.011  # the table's ratio is height / width
    return {(int(w), int(h)) for h, w, _ in rows}


def kohya_reference(base: int, lo: int = 256, hi: int = 1024, step: int = 64) -> set:
    """sd-scripts library/model_util.py make_bucket_resolutions, as published."""
    area = base * base
    sizes = {(int(math.sqrt(area) // step) * step,) * 2}
    for width in range(lo, hi + 1, step):
        height = min(hi, int((area // width) // step) * step)
        if height >= lo:
            sizes.add((width, height))
            sizes.add((height, width))
    return sizes


def novelai_reference() -> set:
    """NovelAI: width 256.. <= 1024 by 64, the largest height (multiple of 64, <= 1024) with
    width x height <= 512 x 768; the same with the sides exchanged; plus 512 x 512."""
    sizes = {(512, 512)}
    for width in range(256, 1025, 64):
        height = max(h for h in range(64, 1025, 64) if width * h <= 512 * 768)
        sizes |= {(width, height), (height, width)}
    return sizes


def nearest_reference(width: int, height: int, buckets: set) -> set:
    """Buckets at the smallest |log ratio difference| (several when it ties, to float noise)."""
    errors = {b: abs(math.log(width / height) - math.log(b[0] / b[1])) for b in buckets}
    best = min(errors.values())
    return {b for b, e in errors.items() if e - best < 1e-12}


PRESETS = {
    "sdxl": ({"preset": "sdxl"}, sdxl_reference()),
    "kohya512": ({"preset": "kohya"}, kohya_reference(512)),
    "kohya1024": ({"preset": "kohya", "base": 1024}, kohya_reference(1024)),
    "novelai": ({"preset": "novelai"}, novelai_reference()),
    "explicit": (
        {"buckets": ["640x480", [480, 640], "512x512"]},
        {(640, 480), (480, 640), (512, 512)},
    ),
}
GRID = [(w, h) for w in range(96, 4200, 233) for h in range(96, 4200, 211)]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_lists_and_assignment_equal_the_published_rules(preset):
    options, reference = PRESETS[preset]
    stage = build_stage({"name": "aspect_buckets", **options, "upscale": {"max_factor": 100}})
    stage.setup()
    assert set(stage.buckets) == reference
    for width, height in GRID:
        where, problem = stage.place(width, height, "k")
        assert problem is None
        assert where.bucket in nearest_reference(width, height, reference), (width, height)
        assert where.resized[0] >= where.bucket[0] and where.resized[1] >= where.bucket[1]
        assert min(where.resized[0] - where.bucket[0], where.resized[1] - where.bucket[1]) <= 1


def test_sdxl_list_is_forty_multiples_of_64_near_a_megapixel():
    buckets = sdxl_reference()
    assert len(buckets) == 40
    assert all(w % 64 == 0 and h % 64 == 0 for w, h in buckets)
    assert all(0.9e6 < w * h < 1.1e6 for w, h in buckets)


def test_log_ratio_is_symmetric_for_portrait_and_landscape():
    stage = build_stage({"name": "aspect_buckets", "preset": "kohya", "upscale": {"max_factor": 9}})
    stage.setup()
    for width, height in GRID:
        flat, _ = stage.place(width, height, "k")
        tall, _ = stage.place(height, width, "k")
        assert tall.bucket == flat.bucket[::-1]


def jpeg(width: int, height: int, orientation: int = 1) -> bytes:
    """Stored top half black, bottom half white; EXIF orientation tag when not 1."""
    pixels = np.full((height, width, 3), 255, np.uint8)
    pixels[: height // 2] = 0
    out = io.BytesIO()
    image = Image.fromarray(pixels)
    if orientation == 1:
        image.save(out, "JPEG", quality=90)
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(out, "JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def run_stage(images: list[bytes], **options) -> dict:
    stage = build_stage({"name": "aspect_buckets", "preset": "sdxl", **options})
    return stage(batch_of(images))


SIZES = [(1200, 1100), (2100, 600), (720, 1500), (1024, 1024), (1300, 900), (900, 700), (500, 300)]


def test_every_output_is_its_bucket_and_nothing_is_enlarged():
    out = run_stage([jpeg(w, h) for w, h in SIZES])
    kept = 0
    rows = zip(SIZES, out["jpg"], out["json"], out["__drop__"], strict=True)
    for (width, height), data, text, drop in rows:
        if drop is not None:
            assert drop == "below_bucket"
            continue
        kept += 1
        meta = json.loads(text)
        bw, bh = (int(v) for v in meta["bucket"].split("x"))
        assert Image.open(io.BytesIO(data)).size == (bw, bh)
        assert (meta["original_width"], meta["original_height"]) == (width, height)
        assert width >= bw and height >= bh  # covered by shrinking (or not resizing) only
        assert 0 <= meta["crop_left"] and 0 <= meta["crop_top"]
        error = abs(math.log(width / height * bh / bw))
        assert meta["aspect_error"] == pytest.approx(error, abs=1e-6)
    assert out["__drop__"][-2:] == ["below_bucket", "below_bucket"]  # 900x700, 500x300
    assert kept == len(SIZES) - 2
    upscaled = run_stage([jpeg(900, 700)], upscale={"max_factor": 1.5})
    assert upscaled["__drop__"] == [None]
    assert json.loads(upscaled["json"][0])["bucket"] == "1152x896"
    assert run_stage([jpeg(500, 300)], upscale={"max_factor": 1.5})["__drop__"] == ["below_bucket"]


def test_an_exif_rotated_photo_gets_the_bucket_of_its_displayed_shape():
    stored = jpeg(1600, 1000, orientation=6)  # displayed 1000 wide, 1600 tall
    out = run_stage([stored, jpeg(1600, 1000)])
    turned, plain = (json.loads(t) for t in out["json"])
    assert (turned["original_width"], turned["original_height"]) == (1000, 1600)
    assert turned["bucket"] == "768x1280" and plain["bucket"] == "1280x768"
    pixels = np.asarray(Image.open(io.BytesIO(out["jpg"][0])).convert("L"), np.float32)
    assert pixels.shape == (1280, 768)
    # orientation 6 turns the stored top (black) to the right: the picture is upright
    assert pixels[:, :300].mean() > 200 and pixels[:, -300:].mean() < 50


def test_rules_drop_with_named_reasons():
    images = [jpeg(1400, 1000), jpeg(3000, 700), jpeg(1100, 1100), b"not an image"]
    out = run_stage(images, min_side=1050, max_aspect_ratio=3.0)
    assert out["__drop__"] == ["too_small", "too_small", None, "decode_error"]
    out = run_stage(images[:3], max_aspect_ratio=3.0, min_pixels=1_300_000)
    assert out["__drop__"] == [None, "bad_aspect_ratio", "too_few_pixels"]


def test_random_crop_is_keyed_and_reruns_are_identical():
    images = [jpeg(2000, 1100)] * 4
    first = run_stage(images, crop="random", seed=3)
    second = run_stage(images, crop="random", seed=3)
    assert first["jpg"] == second["jpg"] and first["json"] == second["json"]
    lefts = [json.loads(t)["crop_left"] for t in first["json"]]
    assert len(set(lefts)) > 1  # each key draws its own offset
    centred = json.loads(run_stage(images[:1])["json"][0])
    resized_width = round(2000 * 768 / 1100)  # covers 1344x768 by its height
    assert centred["crop_left"] == (resized_width - 1344) // 2


@pytest.mark.parametrize(
    "options,message",
    [
        ({"preset": "sdxl", "buckets": ["512x512"]}, "either preset or buckets"),
        ({"buckets": ["512by512"]}, "WIDTHxHEIGHT"),
        ({"preset": "sd15"}, "preset"),
        ({"upscale": {"max_factor": 0.5}}, "max_factor"),
    ],
)
def test_bad_options_fail_in_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        build_stage({"name": "aspect_buckets", **options})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_build_writes_buckets_json_counted_over_the_kept_samples(tmp_path):
    import tarfile

    from mmcurate.pipeline.build import run_build
    from mmcurate.pipeline.config import BuildConfig

    folder = tmp_path / "in"
    folder.mkdir()
    sizes = [(1200, 1100), (1300, 1150), (2100, 600), (720, 1500), (1024, 1024), (500, 300)]
    for i, (width, height) in enumerate(sizes):
        (folder / f"p{i}.jpg").write_bytes(jpeg(width, height))
        (folder / f"p{i}.txt").write_text(f"picture {i}")
    (folder / "q.jpg").write_bytes(jpeg(2100, 600))  # an exact copy of p2: dedupe drops one
    (folder / "q.txt").write_text("a copy")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": [
                {"name": "aspect_buckets", "preset": "sdxl"},
                {"name": "exact_dedupe"},
            ],
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    manifest = run_build(cfg, progress=False)
    assert manifest["samples"] == 5  # 7 in, 500x300 below every bucket, one copy
    document = json.loads((tmp_path / "out" / "buckets.json").read_text())
    assert "buckets.json" in manifest["files"]
    assert document["algorithm"] == "sdxl" and len(document["buckets"]) == 40
    used = {name: n for name, n in document["counts"].items() if n}
    assert used == {"1024x960": 1, "1088x960": 1, "1856x512": 1, "704x1472": 1, "1024x1024": 1}
    assert document["samples"] == 5
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    errors = []
    for name, data in members.items():
        if name.endswith(".json"):
            meta = json.loads(data)
            image = Image.open(io.BytesIO(members[name.replace(".json", ".jpg")]))
            assert "x".join(map(str, image.size)) == meta["bucket"]
            errors.append(meta["aspect_error"])
    assert document["mean_aspect_error"] == pytest.approx(sum(errors) / 5, abs=1e-5)
    assert "Aspect-ratio buckets" in (tmp_path / "out" / "report.html").read_text()

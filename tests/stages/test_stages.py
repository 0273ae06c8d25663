"""Stages and pure planning helpers, without Ray or storage."""

import io
import json

import numpy as np
import pyarrow as pa
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.core.tar_writer import sample_members, write_tar
from mmcurate.core.tario import iter_tar_samples, split_member_name
from mmcurate.pipeline.output.layout import ShardPlanner
from mmcurate.pipeline.output.shards import TAR_END_BYTES
from mmcurate.pipeline.sources.samples import sanitize_key
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.registry import build_stage, build_stages
from PIL import Image

from tests.kit_stages import batch_of, decoded, jpeg


@pytest.mark.parametrize(
    "mode,size,expected",
    [
        ("keep_ratio", (300, 200), (96, 64)),
        ("center_crop", (300, 200), (64, 64)),
        ("none", (300, 200), (300, 200)),
        ("keep_ratio", (40, 50), (40, 50)),  # never enlarged unless upscale is on
    ],
)
def test_decode_image_resize_modes(mode, size, expected):
    stage = build_stage({"name": "decode_image", "resize": {"size": 64, "mode": mode}})
    out = stage(batch_of([jpeg(size)]))
    assert out[DROP] == [None]
    assert decoded(out["jpg"][0]).size == expected
    meta = json.loads(out["json"][0])
    assert (meta["original_width"], meta["original_height"]) == size
    assert (meta["width"], meta["height"]) == expected


def test_decode_image_upscale_switch():
    stage = build_stage({"name": "decode_image", "resize": {"size": 64, "upscale": True}})
    assert decoded(stage(batch_of([jpeg((40, 50))]))["jpg"][0]).size == (64, 80)


@pytest.mark.parametrize("fmt,pil", [("jpg", "JPEG"), ("webp", "WEBP"), ("png", "PNG")])
def test_decode_image_output_format(fmt, pil):
    stage = build_stage({"name": "decode_image", "format": fmt, "quality": 80})
    out = stage(batch_of([jpeg()]))
    assert decoded(out[fmt][0]).format == pil
    assert out["jpg"][0] is None or fmt == "jpg"


@pytest.mark.parametrize(
    "mode,color", [("RGBA", (10, 20, 30, 128)), ("L", 128), ("CMYK", (0, 255, 255, 0)), ("P", 3)]
)
def test_decode_image_converts_to_rgb(mode, color):
    fmt = "PNG" if mode in ("RGBA", "P") else "JPEG"
    stage = build_stage({"name": "decode_image", "resize": {"mode": "none"}})
    out = stage(batch_of([jpeg(mode=mode, color=color, fmt=fmt)]))
    assert out[DROP] == [None]
    assert decoded(out["jpg"][0]).mode == "RGB"


def test_decode_image_applies_exif_orientation():
    image = Image.new("RGB", (300, 100), (0, 200, 0))
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif)
    stage = build_stage({"name": "decode_image", "resize": {"mode": "none"}})
    assert decoded(stage(batch_of([out.getvalue()]))["jpg"][0]).size == (100, 300)


def test_decode_image_drops_broken_and_keeps_order():
    good = jpeg()
    broken = [b"", b"<html>not an image</html>", good[:200], b"\x89PNG\r\n\x1a\n" + b"\0" * 20]
    stage = build_stage({"name": "decode_image"})
    out = stage(batch_of([good, *broken, None]))
    assert out[DROP] == [None, *["decode_error"] * len(broken), "no_image"]
    assert out[DROP_STAGE] == [None, *["decode_image"] * (len(broken) + 1)]
    assert all(v is None for v in out["jpg"][1:])  # dropped media is not carried on


def test_decode_image_threads_give_the_same_rows_in_the_same_order():
    """Decoding on several threads changes nothing a row carries: bytes, JSON and reasons,
    row for row, with missing and broken images and PNGs mixed in."""
    images = []
    for i in range(40):
        kind = i % 5
        if kind == 3:
            images.append(None if i % 2 else b"broken bytes")
        else:
            fmt = "PNG" if kind == 4 else "JPEG"
            images.append(jpeg((120 + 7 * i, 90 + 3 * i), (5 * i, 255 - 5 * i, 100), fmt=fmt))
    outs = [
        build_stage({"name": "decode_image", "threads": n, "resize": {"size": 48}})(
            batch_of(images)
        )
        for n in (1, 3)
    ]
    for column in ("jpg", "json", DROP, DROP_STAGE, "__key__"):
        assert outs[0][column] == outs[1][column], column
    assert outs[0][DROP].count(None) == 32 and outs[0][DROP].count("no_image") == 4


def test_decode_image_threads_default_to_two_only_after_a_download():
    def decode_threads(specs: list[dict]) -> int:
        stage = next(s for s in build_stages(specs) if s.name == "decode_image")
        stage.setup()
        return stage.executor._max_workers if stage.executor is not None else 1

    assert decode_threads([{"name": "download"}, {"name": "decode_image"}]) == 2
    assert decode_threads([{"name": "decode_image"}]) == 1  # a folder: nothing to fill
    assert decode_threads([{"name": "decode_image", "threads": 4}]) == 4


def test_decode_image_pixel_cap():
    stage = build_stage({"name": "decode_image", "max_pixels": 1000})
    assert stage(batch_of([jpeg((100, 100))]))[DROP] == ["too_many_pixels"]


@pytest.mark.parametrize(
    "caption,reason",
    [
        (None, "missing_caption"),
        ("   ", "empty_caption"),
        ("one", "too_few_words"),
        ("w " * 9, "too_many_words"),
        ("  two words ", None),
        ("猫", "too_few_words"),  # Chinese: characters / 1.5, at least 1
        (" 一只橘猫趴在红色沙发上 ", None),  # 11 characters: 7 words
        ("一只橘猫趴在红色沙发上，旁边有一只小狗", "too_many_words"),  # 18: 12
        ("一只橘猫 on a sofa", None),  # mixed: 3 + 3
        ("ねこ", "too_few_words"),  # Japanese (kana): 2 characters / 2.0 = 1 word
        ("赤いソファの上の猫", None),  # 9 characters: 5 words
    ],
)
def test_caption_filter_reasons(caption, reason):
    stage = build_stage({"name": "caption_filter", "min_words": 2, "max_words": 8})
    out = stage(batch_of([jpeg()], [caption]))
    assert out[DROP] == [reason]
    if reason is None:
        assert out["txt"] == [caption.strip()]


def test_later_stages_skip_dropped_samples():
    stages = build_stages([{"name": "caption_filter"}, {"name": "decode_image"}])
    batch = batch_of([b"junk", b"junk"], [None, "caption"])
    for stage in stages:
        batch = stage(batch)
    assert batch[DROP] == ["missing_caption", "decode_error"]
    assert batch[DROP_STAGE] == ["caption_filter", "decode_image"]


def test_exact_dedupe_keeps_smallest_key_per_hash():
    stage = build_stage({"name": "exact_dedupe"})
    a, b = jpeg(color=(1, 2, 3)), jpeg(color=(9, 9, 9))
    batch = batch_of([a, b, a, a])
    batch["__key__"] = ["zeta", "beta", "alpha", "gamma"]
    out = stage(batch)
    signatures = pa.table({"__key__": out["__key__"], "sha256": out["sha256"], DROP: out[DROP]})
    decided = stage.decide(signatures)
    assert decided == {"zeta": ("duplicate_exact", "alpha"), "gamma": ("duplicate_exact", "alpha")}


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "nope"}, "stages.0.name: unknown stage 'nope'"),
        ({"name": ["decode_image"]}, "stages.0.name: unknown stage ['decode_image']"),
        ({"name": "__init__"}, "stages.0.name: unknown stage '__init__'"),
        ({"name": "decode_image", "colour": 1}, "stages.0.colour: unknown key"),
        ({"name": "decode_image", "resize": {"mode": "fit"}}, "stages.0.resize.mode:"),
        ({"name": "decode_image", "quality": 0}, "stages.0.quality:"),
        ({"name": "caption_filter", "min_words": 5, "max_words": 2}, "stages.0:"),
    ],
)
def test_stage_config_errors_name_the_key(spec, message):
    with pytest.raises(ConfigError) as err:
        build_stage(spec)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def plan_shards(sizes: list[int], max_samples: int, max_bytes: int) -> list[tuple[int, int]]:
    """The build's shard plan over these sample sizes, fed in two pieces as groups are."""
    planner = ShardPlanner(max_samples, max_bytes)
    half = len(sizes) // 2
    planner.feed(np.array(sizes[:half], dtype=np.int64))
    planner.feed(np.array(sizes[half:], dtype=np.int64))
    return planner.ranges()


def test_plan_shards_respects_both_limits_and_order():
    sizes = [100, 5000, 100, 100, 100, 100, 100, 100, 100, 100]
    ranges = plan_shards(sizes, max_samples=4, max_bytes=2000)
    assert ranges[0] == (0, 1)  # 100 then 5000 would overflow
    assert ranges[1] == (1, 2)  # an oversized sample gets a shard to itself
    flat = [i for start, end in ranges for i in range(start, end)]
    assert flat == list(range(len(sizes)))
    for start, end in ranges:
        assert end - start <= 4
        assert end - start == 1 or sum(sizes[start:end]) + TAR_END_BYTES <= 2000


def test_plan_shards_exhaustive_small_cases():
    for max_samples in range(1, 5):
        for n in range(0, 9):
            ranges = plan_shards([700] * n, max_samples, max_bytes=10_000)
            assert [e - s for s, e in ranges][:-1] == [max_samples] * (len(ranges) - 1)
            assert sum(e - s for s, e in ranges) == n


def sample_tar_bytes(sample) -> int:
    """Bytes a sample occupies in a tar: a 512-byte header + padded data per member."""
    return sum(512 + -(-len(data) // 512) * 512 for _, data in sample_members(sample))


def test_tar_roundtrip_and_size_estimate(tmp_path):
    samples = [
        {"__key__": f"s{i}", "jpg": jpeg(), "txt": "ünïcode", "json": "{}"} for i in range(3)
    ]
    path = tmp_path / "x.tar"
    with open(path, "wb") as out:
        spans = write_tar(samples, out)
    assert [length for _, length in spans] == [sample_tar_bytes(s) for s in samples]
    assert [offset for offset, _ in spans] == [0, spans[0][1], spans[0][1] + spans[1][1]]
    with open(path, "rb") as src:
        back = list(iter_tar_samples(src))
    assert [s["__key__"] for s in back] == ["s0", "s1", "s2"]
    assert back[0]["txt"].decode() == "ünïcode" and back[0]["jpg"] == samples[0]["jpg"]


def test_member_names_and_keys():
    assert split_member_name("a/b/abc.seg.jpg") == ("a/b/abc", "seg.jpg")
    assert split_member_name("00001.JPG") == ("00001", "jpg")
    assert sanitize_key("dir/photo.v2 final") == "dir_photo_v2_final"


def test_decode_image_side_limits():
    stage = build_stage({"name": "decode_image", "max_side": 250, "min_side": 50})
    out = stage(batch_of([jpeg((300, 200)), jpeg((40, 200)), jpeg((240, 200))]))
    assert out[DROP] == ["too_big", "too_small", None]


def test_download_without_url_is_no_url():
    stage = build_stage({"name": "download"})  # an images source has no url column
    assert stage(batch_of([jpeg()]))[DROP] == ["no_url"]


def test_each_stage_module_registers_its_own_name_and_a_build_imports_only_its_stages():
    """The registry imports a stage's module when a config names it: every name maps to a
    module registering exactly that stage, and loading a config that runs decode_image alone
    imports none of the other stages (nor PyAV)."""
    import json
    import subprocess
    import sys

    from mmcurate.stages.registry import STAGE_MODULES, all_stages

    classes = all_stages()
    assert sorted(classes) == sorted(STAGE_MODULES)
    assert all(cls.name == name for name, cls in classes.items())
    script = (
        "import json, sys; from mmcurate.pipeline.config import BuildConfig; "
        "BuildConfig.model_validate({'source': {'kind': 'images', 'path': '/nowhere'}, "
        "'stages': [{'name': 'decode_image'}], 'output': {'path': '/nowhere-out'}}); "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith('mmcurate.stages.') or m == 'av')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    stage_modules = [m for m in loaded if m in STAGE_MODULES.values()]
    assert stage_modules == ["mmcurate.stages.decode_image"] and "av" not in loaded

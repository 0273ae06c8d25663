"""aspect_buckets' bucket lists, as a user's YAML reaches them (file -> pipeline config load):
every nonsense list is refused in one line that names the bucket, says what is wrong and what
is accepted; nothing that could not be a bucket (a bool, a float, a side not a multiple of 8,
a bucket no image could fill) slips through, and one bucket written twice is refused."""

from __future__ import annotations

import pytest
import yaml
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.cli import main
from mmcurate.pipeline.config import load_build_config
from mmcurate.stages.registry import build_stage

FORMS = 'write each bucket as "WIDTHxHEIGHT" or [WIDTH, HEIGHT], e.g. "1024x768" or [1024, 768]'
RULE = "(sides are multiples of 8 from 8 to 16384)"
WHERE = "stages.0.buckets: bucket"

# (the stage's options as YAML, the whole error line)
BAD = {
    "bool": (
        "buckets: [[true, 768]]",
        f"{WHERE} [true, 768]: side true is not an integer; {FORMS}",
    ),
    "float": (
        "buckets: [[1024.5, 768]]",
        f"{WHERE} [1024.5, 768]: side 1024.5 is not an integer; {FORMS}",
    ),
    "whole float": (
        "buckets: [[1024.0, 768]]",
        f"{WHERE} [1024.0, 768]: side 1024.0 is not an integer; {FORMS}",
    ),
    "quoted side": (
        "buckets: [['1024', 768]]",
        f'{WHERE} ["1024", 768]: side "1024" is not an integer; {FORMS}',
    ),
    "not multiple of 8": (
        "buckets: [[1024, 770]]",
        f"{WHERE} [1024, 770]: side 770 is not allowed {RULE}",
    ),
    "odd text": ("buckets: [1023x768]", f'{WHERE} "1023x768": side 1023 is not allowed {RULE}'),
    "huge text": (
        "buckets: [9999999999999999999x1]",
        f'{WHERE} "9999999999999999999x1": side 9999999999999999999 is not allowed {RULE}',
    ),
    "too large": (
        "buckets: [100000x100000]",
        f'{WHERE} "100000x100000": side 100000 is not allowed {RULE}',
    ),
    "zero": ("buckets: [[0, 768]]", f"{WHERE} [0, 768]: side 0 is not allowed {RULE}"),
    # quoted: unquoted, YAML reads 0x768 as the hex number 1896
    "zero text": ("buckets: ['0x768']", f'{WHERE} "0x768": side 0 is not allowed {RULE}'),
    "negative": ("buckets: [[-8, 768]]", f"{WHERE} [-8, 768]: side -8 is not allowed {RULE}"),
    "half text": ("buckets: [1024x]", f'{WHERE} "1024x": not a size; {FORMS}'),
    "letters": ("buckets: [axb]", f'{WHERE} "axb": not a size; {FORMS}'),
    "three sides": ("buckets: [[1024, 768, 3]]", f"{WHERE} [1024, 768, 3]: {FORMS}"),
    "one number": ("buckets: [1024]", f"{WHERE} 1024: {FORMS}"),
    "not a list": (
        "buckets: 1024x768",
        f"stages.0.buckets: give a list of at least one bucket; {FORMS}",
    ),
    "same bucket twice": (
        "buckets: [1024x768, [1024, 768]]",
        f'{WHERE} "1024x768" and [1024, 768] are the same bucket 1024x768: list it once',
    ),
    "above max_pixels": (
        "buckets: [16384x16384]",
        "stages.0: buckets: bucket 16384x16384 has 268,435,456 pixels, above max_pixels "
        "(100,000,000): no image could fill it",
    ),
    "preset above max_pixels": (
        "{preset: sdxl, max_pixels: 1000000}",
        "stages.0: preset sdxl: bucket 512x2048 has 1,048,576 pixels, above max_pixels "
        "(1,000,000): no image could fill it",
    ),
    "webp side": (
        "{buckets: [16384x4096], format: webp}",
        "stages.0: buckets: bucket 16384x4096 is over WebP's 16383 pixels a side; "
        "use format jpg or png",
    ),
    "kohya step": ("{preset: kohya, step: 12}", "stages.0.step: Input should be a multiple of 8"),
    "kohya max side": (
        "{preset: kohya, bucket_max_side: 1000000000000}",
        "stages.0.bucket_max_side: Input should be less than or equal to 16384",
    ),
}


def config_file(tmp_path, options: str):
    """A build config file with one aspect_buckets stage given `options` (YAML text)."""
    tree = {
        "source": {"kind": "images", "path": str(tmp_path / "in")},
        "output": {"path": str(tmp_path / "out")},
        "stages": [{"name": "aspect_buckets", **yaml.safe_load(options_text(options))}],
    }
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def options_text(options: str) -> str:
    return options if options.startswith("{") else "{" + options + "}"


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_nonsense_bucket_list_is_one_line_saying_what_is_wrong(tmp_path, case):
    options, line = BAD[case]
    with pytest.raises(ConfigError) as err:
        load_build_config(config_file(tmp_path, options))
    assert str(err.value) == line


def test_the_cli_exits_2_with_the_line(tmp_path, capsys):
    options, line = BAD["bool"]
    assert main(["build", str(config_file(tmp_path, options))]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {line}\n"


@pytest.mark.parametrize(
    "options,buckets",
    [
        ("buckets: [1024x768, [768, 1024], ' 512 X 512 ']", [(512, 512), (768, 1024), (1024, 768)]),
        ("buckets: [[8, 16384]]", [(8, 16384)]),
        ("{buckets: [16376x8], format: webp}", [(16376, 8)]),
    ],
)
def test_the_documented_forms_are_accepted(tmp_path, options, buckets):
    cfg = load_build_config(config_file(tmp_path, options))
    stage = build_stage(cfg.stages[0])
    assert stage.options.bucket_list() == buckets


def test_every_preset_is_accepted_with_its_defaults():
    for preset in ("sdxl", "kohya", "novelai"):
        buckets = build_stage({"name": "aspect_buckets", "preset": preset}).options.bucket_list()
        assert all(w % 8 == 0 and h % 8 == 0 for w, h in buckets)
    kohya = {"name": "aspect_buckets", "preset": "kohya", "step": 8, "base": 1024}
    assert len(build_stage(kohya).options.bucket_list()) > 100

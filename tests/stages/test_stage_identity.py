"""A stage is identified by its position as well as its name (DESIGN.md, point 11): the same
stage listed twice with different options runs twice and is counted twice, correctly."""

import json
from pathlib import Path

import pyarrow.parquet as pq
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.registry import build_stages, stage_order


def write_pairs(folder: Path, captions: list[str]) -> None:
    """Real JPEGs with the given captions (the demo's photo maker)."""
    from mmcurate.pipeline.demo_data import make_demo_images

    make_demo_images(folder, n=len(captions), exact_copies=0, broken=0, seed=3)
    for txt, caption in zip(sorted(folder.glob("*.txt")), captions, strict=True):
        txt.write_text(caption)


def test_repeated_stage_names_get_positional_labels():
    specs = [
        {"name": "caption_filter", "min_words": 2},
        {"name": "exact_dedupe"},
        {"name": "caption_filter", "max_words": 4},
        {"name": "decode_image"},
    ]
    stages = build_stages(specs)
    assert [s.label for s in stages] == [
        "0:caption_filter",
        "exact_dedupe",
        "2:caption_filter",
        "decode_image",
    ]
    assert [s.label for s in stage_order(stages)] == [
        "0:caption_filter",
        "2:caption_filter",
        "decode_image",
        "exact_dedupe",
    ]


def test_two_caption_filters_in_one_build(ray_session, tmp_path):
    captions = ["one", "two words", "now three words", "a caption of five words", "x"] * 4
    folder = tmp_path / "in"
    write_pairs(folder, captions)
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 7},
            "stages": [
                {"name": "caption_filter", "min_words": 2},
                {"name": "caption_filter", "max_words": 3},
                {"name": "decode_image", "resize": {"size": 32}},
            ],
            "output": {"path": str(tmp_path / "out")},
        }
    )
    manifest = run_build(cfg, progress=False)
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    counts = {s["name"]: (s["in"], s["out"], s["dropped"]) for s in stats["stages"]}
    assert counts["0:caption_filter"] == (20, 12, {"too_few_words": 8})
    assert counts["1:caption_filter"] == (12, 8, {"too_many_words": 4})
    assert counts["decode_image"] == (8, 8, {})
    assert manifest["samples"] == stats["samples_out"] == 8
    signatures = pq.read_table(tmp_path / "out" / "signatures" / "part-000000.parquet")
    by_stage = {}
    for row in signatures.select(["drop_stage", "drop_reason"]).to_pylist():
        by_stage.setdefault(row["drop_stage"], set()).add(row["drop_reason"])
    assert by_stage == {
        None: {None},
        "0:caption_filter": {"too_few_words"},
        "1:caption_filter": {"too_many_words"},
    }
    assert run_build(cfg, progress=False) == manifest  # a rerun is a no-op, not a failure


def test_semantic_dedupe_after_clip_score_needs_no_model_of_its_own():
    """clip_score gives every live sample its embedding: semantic_dedupe's own model (a tag
    that would need a download) is neither checked nor loaded."""
    specs = [
        {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None},
        {"name": "semantic_dedupe", "eps": 0.01},  # default model: ViT-B-32 with a tag
    ]
    clip, semantic = build_stages(specs)
    assert semantic.embeddings_given and clip.uses_model_pool
    semantic.check()  # would fail offline: laion2b_s34b_b79k is not on this machine
    batch = {
        "__key__": ["a"],
        "__drop__": [None],
        "__drop_stage__": [None],
        "jpg": [b"not decoded: the embedding is already there"],
        "embedding": [[0.5, 0.5]],
    }
    out = semantic(batch)
    assert out["__drop__"] == [None] and out["embedding"] == [[0.5, 0.5]]
    alone = build_stages([{"name": "semantic_dedupe"}])[0]
    assert not alone.embeddings_given

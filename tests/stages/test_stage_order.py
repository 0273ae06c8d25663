"""Stage order across the per-sample / global split (adversarial review):

- a `metadata_filter` listed after `clip_score` ran before it (all per-sample stages ran
  before every global stage's per-sample work), found no `clip_score` or `concept_*` column,
  and dropped every sample as `missing_...`: the config docs/configuration.md shows;
- `semantic_dedupe` listed before a `clip_score` with another model embedded with its own
  model, and clip_score then wrote its embeddings over them: the dedupe silently ran on
  clip_score's model;
- `keep_top_fraction` kept ceil(f x N - 1e-9) samples: none at all when f x N is tiny.
"""

import json

import pyarrow as pa
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.lib.decisions import top_count
from mmcurate.stages.lib.top_fraction import top_fraction_decisions
from mmcurate.stages.registry import build_stages, stage_order, validate_stage_list

from tests.kit_clip import TINY
from tests.shapes import make_shapes, write_folder

WATERMARK = {**TINY, "concepts": {"watermark": {}}}


def order(specs: list[dict]) -> list[str]:
    return [s.label for s in stage_order(build_stages(specs))]


def test_a_filter_on_a_global_stages_column_runs_after_that_stage():
    specs = [
        {"name": "caption_filter"},
        WATERMARK,
        {"name": "metadata_filter", "where": ["concept_watermark <= 1.0"]},
        {"name": "metadata_filter", "where": ["punsafe < 0.1"]},  # a json field: stays early
        {"name": "exact_dedupe"},
    ]
    assert order(specs) == [
        "caption_filter",
        "3:metadata_filter",
        "clip_score",
        "exact_dedupe",
        "2:metadata_filter",
    ]


def test_a_filter_listed_before_the_stage_keeps_its_place():
    specs = [{"name": "metadata_filter", "where": ["clip_score > 0"]}, TINY]
    assert order(specs) == ["metadata_filter", "clip_score"]


def test_a_build_filters_on_scores_and_concepts_written_in_the_same_build(ray_session, tmp_path):
    """Scores of a random model lie in [-1, 1] and a concept probability in [0, 1]: every
    sample passes. Before, every sample was dropped as `missing_clip_score`."""
    folder = write_folder(make_shapes(6, seed=2), tmp_path / "in")
    stages = [
        WATERMARK,
        {"name": "metadata_filter", "where": ["clip_score >= -1.0", "concept_watermark <= 1.0"]},
    ]
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder)},
            "stages": stages,
            "output": {"path": str(tmp_path / "out")},
            "ray": {"runtime": "local", "num_cpus": 1},
        }
    )
    assert run_build(cfg, False)["samples"] == 6
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert [(s["name"], s["in"], s["out"]) for s in stats["stages"]] == [
        ("source", 6, 6),
        ("clip_score", 6, 6),
        ("metadata_filter", 6, 6),
    ]


def semantic(model: str = "mmcurate-tiny", pretrained: str | None = None) -> dict:
    return {"name": "semantic_dedupe", "model": model, "pretrained": pretrained}


@pytest.mark.parametrize("first", [True, False])
def test_semantic_dedupe_before_clip_score_needs_the_same_model(first, tmp_path):
    other = semantic(pretrained=str(tmp_path / "other.pt"))
    specs = [other, TINY] if first else [TINY, other]
    if first:
        with pytest.raises(ConfigError) as err:
            validate_stage_list(specs)
        assert str(err.value).startswith("stages.0: semantic_dedupe before clip_score")
    else:  # listed after: it reuses clip_score's embeddings, as documented
        validate_stage_list(specs)
    validate_stage_list([semantic(), TINY])  # one model: nothing to refuse


@pytest.mark.parametrize(
    ("fraction", "total", "keep"),
    [
        (1e-9, 1, 1),
        (1e-10, 5, 1),
        (0.3, 10, 3),
        (0.1, 30, 3),
        (0.5, 3, 2),
        (1.0, 7, 7),
        (0.3, 0, 0),
    ],
)
def test_top_count_is_the_ceiling_of_the_product(fraction, total, keep):
    assert top_count(fraction, total) == keep


def test_a_tiny_fraction_of_one_sample_keeps_that_sample():
    table = pa.table({"__key__": ["a"], "clip_score": [0.2]})
    assert top_fraction_decisions(table, 1e-9) == {}

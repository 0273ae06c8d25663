"""`mmcurate sweep` without training (issue 50): bad configs fail in one line before anything
runs; arms' decisions over recorded scores (thresholds, top fraction, mixtures); the
recommendation's separability rule; the report renders in a browser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from mmcurate.pipeline.sweep.arms import mix, select_keys, top_fraction
from mmcurate.pipeline.sweep.config import Arm, load_sweep_config
from mmcurate.pipeline.sweep.report import recommend, summarize
from mmcurate.pipeline.sweep.run import main

from tests.browser import chromium
from tests.kit_sweep import assert_refused_in_one_line


def base(tmp_path: Path) -> dict:
    (tmp_path / "raw").mkdir(exist_ok=True)
    stages = [{"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None}]
    return {
        "build": {"source": {"kind": "images", "path": str(tmp_path / "raw")}, "stages": stages},
        "train": {"run": {"max_steps": 2}},
        "eval": {"retrieval": {"recall_at": [1]}},
        "splits": {"validation": "val/manifest.json", "test": "test/manifest.json"},
        "seeds": [0],
        "arms": [{"name": "raw"}],
        "output": str(tmp_path / "out"),
    }


BAD = [
    ({"arms": [{"name": "a", "min_score": 0.2, "keep_top_fraction": 0.5}]}, "not both"),
    ({"arms": [{"name": "a", "min_scor": 0.2}]}, "arms.0.min_scor: unknown key"),
    ({"arms": [{"name": "a"}, {"name": "a"}]}, "each name once"),
    ({"arms": [{"name": "a", "dedupe": True}]}, "needs the sweep's dedupe stages"),
    ({"arms": [{"name": "a", "weights": {"web": 1}}]}, "unknown source 'web'"),
    ({"arms": [{"name": "A b"}]}, "arm name 'A b'"),
    ({"arms": []}, "arms: List should have at least 1 item"),
    ({"seeds": [1, 1]}, "seeds: each seed once"),
    ({"splits": {"validation": "v"}}, "splits.test: required key is missing"),
    ({"sources": {"a": "x", "b": "y"}}, "arm raw: several sources: say which in weights"),
    ({"train": {"optim": {"lr": "fast"}}}, "train: optim.lr:"),
    ({"eval": {"retrieval": {"recall_at": [0]}}}, "eval: retrieval.recall_at:"),
    ({"color": 1}, "color: unknown key"),
    ({"dedupe": [{"name": "exact_dedupe", "radius": 3}]}, "dedupe: stages.0"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_sweep_config_fails_in_one_line_before_anything_runs(tmp_path, capsys, change, message):
    assert_refused_in_one_line(tmp_path, capsys, {**base(tmp_path), **change}, message)


def test_dedupe_in_the_base_build_is_refused(tmp_path, capsys):
    tree = base(tmp_path)
    tree["build"]["stages"].append({"name": "exact_dedupe"})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(tree))
    assert main([str(tmp_path / "s.yaml")]) == 2
    assert "build.stages.1: exact_dedupe drops; list it in `dedupe`" in capsys.readouterr().err


def test_the_example_config_loads():
    cfg = load_sweep_config(Path(__file__).resolve().parents[2] / "configs" / "sweep_example.yaml")
    assert len(cfg.arms) == 8 and cfg.seeds == [0, 1, 2]


def test_a_build_without_a_scorer_cannot_have_threshold_arms(tmp_path, capsys):
    tree = base(tmp_path)
    tree["build"]["stages"] = [{"name": "decode_image"}]
    tree["arms"] = [{"name": "t", "min_score": 0.1}]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(tree))
    assert main([str(tmp_path / "s.yaml")]) == 2
    assert "needs a clip_score stage" in capsys.readouterr().err


F32_07 = float(np.float32(0.7))  # 0.69999998807...: as a score 0.7 comes back from float32
ROWS = [("a", 0.5), ("b", 0.1), ("c", 0.3), ("d", 0.3), ("e", None), ("f", F32_07)]


def test_arm_decisions_over_recorded_scores():
    assert select_keys(ROWS, Arm(name="x"), None) == {"a", "b", "c", "d", "e", "f"}
    # min_score compares the score as clip_score does: rounded to 6 decimals
    assert select_keys(ROWS, Arm(name="x", min_score=0.7), None) == {"f"}
    assert select_keys(ROWS, Arm(name="x", min_score=0.3), None) == {"a", "c", "d", "f"}
    # ceil(0.5 x 5 scored) = 3: highest first, ties by the smallest key
    assert top_fraction(ROWS, 0.5) == {"f", "a", "c"}
    assert top_fraction(ROWS, 0.4) == {"f", "a"}
    arm = Arm(name="x", keep_top_fraction=0.5, dedupe=True)
    assert select_keys(ROWS, arm, {"a", "d", "b"}) == {"a"}


def test_mixture_takes_each_sources_share_of_the_largest_total():
    pools = {"web": {f"w{i}" for i in range(100)}, "clean": {f"c{i}" for i in range(30)}}
    chosen = mix(pools, {"web": 0.75, "clean": 0.25})
    assert (len(chosen["web"]), len(chosen["clean"])) == (90, 30)  # clean limits: 30 / 0.25
    assert chosen == mix(pools, {"web": 0.75, "clean": 0.25})  # no seed: the same draw
    assert mix(pools, {"web": 1.0}) == {"web": pools["web"]}


def runs(values: dict[str, list[float]], test: dict[str, list[float]] | None = None) -> list:
    metric = "image_retrieval_recall@1"
    out = []
    for arm, vals in values.items():
        for seed, v in enumerate(vals):
            t = (test or values)[arm][seed]
            out.append({"arm": arm, "seed": seed, "validation": {metric: v}, "test": {metric: t}})
    return out


def test_recommendation_says_when_the_best_arm_is_not_separable():
    metric = "image_retrieval_recall@1"
    apart = recommend(summarize(runs({"a": [0.5, 0.6], "b": [0.3, 0.4]}), metric), metric)
    assert (apart["arm"], apart["runner_up"], apart["separable"]) == ("a", "b", True)
    assert "Not separable" not in apart["text"]
    close = recommend(summarize(runs({"a": [0.5, 0.7], "b": [0.4, 0.55]}), metric), metric)
    assert (close["arm"], close["separable"]) == ("a", False)
    assert "Not separable from b" in close["text"]
    one = recommend(summarize(runs({"a": [0.9], "b": [0.1]}), metric), metric)
    assert one["separable"] is False and "one seed" in one["text"]
    flipped = runs({"a": [0.5, 0.6], "b": [0.3, 0.4]}, test={"a": [0.1, 0.1], "b": [0.2, 0.3]})
    rec = recommend(summarize(flipped, metric), metric)
    assert rec["arm"] == "a" and rec["best_on_test"] == "b"  # chosen on validation only
    assert rec["test"]["mean"] == pytest.approx(0.1)


def test_more_seeds_of_the_same_spread_separate_what_two_cannot():
    """The gap against its standard error over seeds: two seeds leave a 0.10 gap inside the
    noise; eight seeds with the same spread separate it, though the arms' min-max ranges still
    touch (a rule on overlapping ranges only gets stricter as seeds are added)."""
    metric = "image_retrieval_recall@1"
    two = recommend(summarize(runs({"a": [0.5, 0.6], "b": [0.4, 0.5]}), metric), metric)
    assert two["separable"] is False and "within twice its standard error" in two["text"]
    eight = runs({"a": [0.5, 0.6] * 4, "b": [0.4, 0.5] * 4})
    rec = recommend(summarize(eight, metric), metric)
    assert rec["separable"] is True and rec["gap"] == pytest.approx(0.1)
    assert rec["gap_se"] == pytest.approx((2 * 0.0028571428 / 8) ** 0.5, rel=1e-4)


def test_the_report_renders_in_a_browser(tmp_path):
    from mmcurate.pipeline.sweep.report import write_report

    tree = {**base(tmp_path), "arms": [{"name": "a"}, {"name": "b"}]}
    cfg = load_sweep_config(tree)
    (tmp_path / "out").mkdir()
    results = runs({"a": [0.5, 0.6], "b": [0.3, 0.4]})
    kept = {"a": {"samples": 10}, "b": {"samples": 5}}
    write_report(cfg, tmp_path / "out", results, kept, {"main": {"clip_score": 1}})
    browser = chromium(tmp_path / "chromium")
    try:
        browser.get((tmp_path / "out" / "report.html").as_uri())
        assert browser.title == "mmcurate sweep"
        text = browser.find_element("tag name", "body").text
        circles = browser.execute_script("return document.querySelectorAll('svg circle').length")
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        browser.quit()
    assert "Recommended: a" in text and "samples kept" in text
    assert circles == 4  # 2 arms x (validation, test)
    assert errors == []


def test_an_output_of_another_sweep_is_refused_before_anything_runs(tmp_path, capsys):
    from mmcurate.pipeline.sweep.run import claim_output

    tree = {**base(tmp_path), "arms": [{"name": "a", "keep_top_fraction": 0.5}]}
    claim_output(load_sweep_config(tree), tmp_path / "out")
    more = {**tree, "seeds": [0, 1], "arms": [*tree["arms"], {"name": "b"}]}
    claim_output(load_sweep_config(more), tmp_path / "out")  # more seeds and arms: fine
    changed = {**tree, "arms": [{"name": "a", "keep_top_fraction": 0.3}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(changed))
    assert main([str(tmp_path / "s.yaml")]) == 2
    assert "arms: a in" in capsys.readouterr().err
    other = {**tree, "train": {"run": {"max_steps": 5}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(other))
    assert main([str(tmp_path / "s.yaml")]) == 2
    assert "holds a sweep of another" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sweep.json"]


def scored_build(folder: Path, scores: dict[str, float]) -> None:
    """A scored build as the sweep's scoring build leaves it: shards, manifest, signatures."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.eval_sets import photo, write_build

    samples = [{"key": k, "image": photo(i), "txt": f"caption {k}"} for i, k in enumerate(scores)]
    write_build(folder, [samples])
    (folder / "signatures").mkdir()
    rows = {"key": list(scores), "clip_score": list(scores.values()), "drop_reason": [None] * 3}
    table = pa.table(
        rows,
        schema=pa.schema(
            [("key", pa.string()), ("clip_score", pa.float32()), ("drop_reason", pa.string())]
        ),
    )
    pq.write_table(table, folder / "signatures" / "part-0.parquet")


def test_arm_builds_mix_sources_and_an_empty_arm_is_one_line(tmp_path):
    import tarfile

    from mmcurate.core.config_io import ConfigError
    from mmcurate.pipeline.sweep.run import make_arms

    out = tmp_path / "out"
    scored_build(out / "scored" / "web", {"w1": 0.1, "w2": 0.5, "w3": 0.3})
    scored_build(out / "scored" / "clean", {"c1": 0.4, "c2": 0.2, "c3": 0.6})
    tree = {**base(tmp_path), "sources": {"web": "w", "clean": "c"}}
    tree["arms"] = [
        {"name": "top", "keep_top_fraction": 0.5, "weights": {"web": 1}},
        {"name": "mix", "weights": {"web": 2, "clean": 1}},
    ]
    kept = make_arms(load_sweep_config(tree), out)
    assert kept["top"] == {"samples": 2, "per_source": {"web": 2}}
    # the largest N both fill: min(3 / (2/3), 3 / (1/3)) = 4; floor(4 x 2/3), floor(4 x 1/3)
    assert kept["mix"] == {"samples": 3, "per_source": {"web": 2, "clean": 1}}
    with tarfile.open(out / "arms" / "top" / "shard-000000.tar") as tar:
        assert [n for n in tar.getnames() if n.endswith(".txt")] == ["w2.txt", "w3.txt"]
        assert tar.extractfile("w2.txt").read() == b"caption w2"  # members copied as they were
    with tarfile.open(out / "arms" / "mix" / "shard-000000.tar") as tar:
        names = [n for n in tar.getnames() if n.endswith(".txt")]
    assert len(names) == 3 and sum(n.startswith("web_") for n in names) == 2
    assert sum(n.startswith("clean_") for n in names) == 1
    tree["arms"] = [{"name": "none", "min_score": 0.9, "weights": {"web": 1}}]
    with pytest.raises(ConfigError, match="arms: none keeps no sample"):
        make_arms(load_sweep_config(tree), out)

"""Phase B on partitioned signatures (pipeline/decide/phase_b.py) decides exactly what the
whole-table decisions decide (the driver-side phase B before issue 19, kept here as the oracle):
repeated keys, exact dedupe, near dedupe, keep_top_fraction (ties and NaN included), semantic
dedupe, in-process and in Ray tasks, for any grouping of the partitions."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from mmcurate.core.atomic import write_parquet
from mmcurate.core.mapreduce import LocalRunner, RayRunner
from mmcurate.pipeline.decide.phase_b import decide
from mmcurate.pipeline.decide.top_fraction import score_codes, threshold_bucket
from mmcurate.pipeline.output.groups import Groups, plan_groups, read_fate, scan_partitions
from mmcurate.stages.base import DROP, DROP_STAGE
from mmcurate.stages.registry import build_stages

from tests.kit_decide import oracle

STAGES = [
    {"name": "exact_dedupe"},
    {"name": "near_dedupe", "verify": "none", "candidate_radius": 0, "radius": 3},
    {"name": "clip_score", "model": "tiny", "pretrained": None, "keep_top_fraction": 0.7},
    {"name": "semantic_dedupe", "eps": 0.02, "clusters": 2},
]


def synthetic_partitions(rng: np.random.Generator, parts: int, rows: int) -> list[pa.Table]:
    """Signature rows with planted exact, near and semantic duplicates, repeated keys, tied
    and NaN scores, and rows phase A already dropped."""
    n = parts * rows
    sha = [f"{x:064x}" for x in rng.integers(0, 2**62, n)]
    phash = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    score = rng.choice(np.float32([0.1, 0.2, 0.25, 0.3, np.nan, -0.0, 0.0]), n)
    score = np.where(rng.random(n) < 0.5, rng.random(n).astype(np.float32), score)
    emb = rng.normal(size=(n, 8)).astype(np.float16)
    for i in rng.choice(n, n // 5, replace=False):  # copies of another row, three kinds
        j, kind = int(rng.integers(0, n)), int(rng.integers(0, 3))
        emb[i] = emb[j]
        if kind < 2:
            phash[i] = phash[j] ^ np.uint64(1 << int(rng.integers(0, 64)))
        if kind == 0:
            sha[i] = sha[j]
    keys = [f"k{i:05d}" for i in range(n)]
    for i in rng.choice(n, n // 20, replace=False):
        keys[i] = keys[int(rng.integers(0, n))]
    drops = [None if rng.random() > 0.1 else "too_small" for _ in range(n)]
    tables = []
    for p in range(parts):
        s = slice(p * rows, (p + 1) * rows)
        index = rng.permutation(rows)  # files need not be in index order
        tables.append(
            pa.table(
                {
                    "__key__": pa.array(keys[s], pa.string()).take(index),
                    "__part__": pa.array([p] * rows, pa.int64()),
                    "__index__": pa.array(np.arange(rows)[index]),
                    DROP: pa.array(drops[s], pa.string()).take(index),
                    DROP_STAGE: pa.array([d and "decode_image" for d in drops[s]]).take(index),
                    "sha256": pa.array(sha[s]).take(index),
                    "phash": pa.array(phash[s], pa.uint64()).take(index),
                    "clip_score": pa.array(score[s], pa.float32()).take(index),
                    "width": pa.array(rng.integers(50, 60, rows)).take(index),
                    "height": pa.array(rng.integers(50, 60, rows)).take(index),
                    "embedding": pa.array(list(emb[s]), pa.list_(pa.float16())).take(index),
                }
            )
        )
    return tables


def run_decide(tmp_path, tables, group_rows: int, runner) -> dict[tuple[int, int], tuple]:
    work = str(tmp_path / "_work")
    for p, table in enumerate(tables):
        write_parquet(table, f"{work}/signatures/part-{p:06d}.parquet", {})
    parts = list(range(len(tables)))
    rows, _ = scan_partitions(work, parts, {}, runner)
    members = plan_groups(parts, rows, group_rows)
    groups = Groups(work, {}, members, [sum(rows[p] for p in m) for m in members])
    final = decide(groups, build_stages(STAGES), runner)
    fates = pa.concat_tables(read_fate(groups, final, g) for g in range(groups.count))
    columns = [fates[c].to_pylist() for c in ("__part__", "__index__", DROP, DROP_STAGE)]
    dup = fates["duplicate_of"].to_pylist()
    return {(p, i): (d, s, k) for p, i, d, s, k in zip(*columns, dup, strict=True)}


@pytest.mark.parametrize("group_rows", [10**9, 150, 61])
def test_partitioned_decisions_equal_the_whole_table(tmp_path, group_rows):
    tables = synthetic_partitions(np.random.default_rng(7), parts=9, rows=60)
    expected = oracle(pa.concat_tables(tables), build_stages(STAGES))
    got = run_decide(tmp_path, tables, group_rows, LocalRunner())
    assert got == expected
    reasons = {d for d, _, _ in got.values()}
    assert reasons == {
        None,
        "too_small",
        "duplicate_key",
        "duplicate_exact",
        "duplicate_near",
        "below_top_fraction",
        "duplicate_semantic",
    }


def test_partitioned_decisions_in_ray_tasks(ray_session, tmp_path):
    tables = synthetic_partitions(np.random.default_rng(11), parts=6, rows=50)
    expected = oracle(pa.concat_tables(tables), build_stages(STAGES))
    assert run_decide(tmp_path, tables, 120, RayRunner()) == expected


def test_score_codes_keep_order_and_threshold_buckets():
    values = np.float32([np.nan, -np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 0.5, 2.0, np.inf])
    codes = score_codes(values)
    assert codes[0] < codes[1] < codes[2] < codes[3] < codes[4]
    assert codes[4] == codes[5] < codes[6] < codes[7] < codes[8] < codes[9]
    counts = np.array([5, 0, 3, 2])  # buckets 0..3, walking down from 3
    assert threshold_bucket(counts, 1) == (3, 1)
    assert threshold_bucket(counts, 2) == (3, 2)
    assert threshold_bucket(counts, 4) == (2, 2)
    assert threshold_bucket(counts, 6) == (0, 1)
    assert pc.sum(pa.array(counts)).as_py() == 10


def test_first_per_key_keeps_the_first_in_input_order_and_handles_one_row():
    from mmcurate.stages.lib.decisions import first_per_key

    one = pa.table({"__key__": ["a"], "__part__": [0], "__index__": [0]})
    assert first_per_key([one]).num_rows == 0
    rows = pa.table(
        {"__key__": ["b", "a", "b", "b"], "__part__": [2, 0, 1, 1], "__index__": [0, 5, 9, 3]}
    )
    dropped = first_per_key([rows.slice(0, 2), rows.slice(2)])
    where = zip(dropped["__part__"].to_pylist(), dropped["__index__"].to_pylist(), strict=True)
    assert sorted(where) == [
        (1, 9),
        (2, 0),
    ]


def test_partition_cap_splits_groups_and_decisions_stay_the_same(tmp_path, monkeypatch):
    """Many small partitions (files_per_task: 1): the partition cap, not the row cap, splits
    the groups, and each group gathers its files in several batches."""
    import mmcurate.pipeline.output.groups as groups_module

    monkeypatch.setattr(groups_module, "PARTS_PER_GROUP", 4)
    monkeypatch.setattr(groups_module, "GATHER_BATCH", 3)
    assert plan_groups(list(range(9)), [60] * 9, 10**9) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    tables = synthetic_partitions(np.random.default_rng(5), parts=9, rows=60)
    expected = oracle(pa.concat_tables(tables), build_stages(STAGES))
    assert run_decide(tmp_path, tables, 10**9, LocalRunner()) == expected


def test_plan_groups_caps_rows_and_partitions():
    rows = [1, 1, 1, 5, 1, 1, 1, 1]
    parts = list(range(len(rows)))
    assert plan_groups(parts, rows, 4, max_parts=3) == [[0, 1, 2], [3], [4, 5, 6], [7]]
    assert plan_groups(parts, rows, 100, max_parts=2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan_groups(parts, rows, 100, max_parts=100) == [parts]
    assert plan_groups([], [], 4, max_parts=2) == []


def test_gather_group_in_batches_unifies_columns_like_one_concat(tmp_path, monkeypatch):
    """Batches whose files differ in columns and null-typed columns combine as one concat."""
    import mmcurate.pipeline.output.groups as groups_module
    from mmcurate.pipeline.output.groups import gather_group

    monkeypatch.setattr(groups_module, "GATHER_BATCH", 2)
    work = str(tmp_path / "_work")
    tables = []
    for p in range(5):
        columns = {"__key__": [f"k{p}{i}" for i in (1, 0)], "__part__": [p, p], "__index__": [1, 0]}
        if p >= 3:  # only the last batches have it; a null-typed column before that
            columns["caption"] = pa.array(["b", "a"], pa.string())
        elif p == 1:
            columns["caption"] = pa.nulls(2)
        tables.append(pa.table(columns))
        write_parquet(tables[-1], f"{work}/signatures/part-{p:06d}.parquet", {})
    groups = Groups(work, {}, [[0, 1, 2, 3, 4]], [10])
    got = gather_group(groups, 0)
    expected = pa.concat_tables(tables, promote_options="permissive").sort_by(
        [("__part__", "ascending"), ("__index__", "ascending")]
    )
    assert got.equals(expected)
    assert got["caption"].to_pylist() == [None] * 6 + ["a", "b", "a", "b"]

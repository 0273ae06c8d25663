"""Global dedupe inside real builds on the session Ray: duplicates in different tasks."""

import io

import numpy as np
import pyarrow.parquet as pq
from mmcurate.pipeline.build import run_build
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.demo_data import source_photo
from PIL import Image


def save(folder, key: str, image: Image.Image, fmt: str = "JPEG", **opts) -> None:
    out = io.BytesIO()
    image.save(out, fmt, **opts)
    ext = "png" if fmt == "PNG" else "jpg"
    (folder / f"{key}.{ext}").write_bytes(out.getvalue())
    (folder / f"{key}.txt").write_text(f"a photo called {key}")


def photo_folder(tmp_path):
    """Ten distinct photos; an exact copy and near copies placed far apart in key order."""
    folder = tmp_path / "photos"
    folder.mkdir()
    names = ["astronaut", "coffee", "rocket", "chelsea", "coins", "camera", "clock", "brick"]
    for i, name in enumerate(names):
        save(folder, f"m{i}_{name}", source_photo(name).convert("RGB").resize((256, 256)))
    (folder / "zz_copy.jpg").write_bytes((folder / "m0_astronaut.jpg").read_bytes())
    (folder / "zz_copy.txt").write_text("the same bytes again")
    coffee = source_photo("coffee").convert("RGB").resize((256, 256))
    save(folder, "a_coffee_small", coffee.resize((160, 160)))
    save(folder, "zz_coffee_q40", coffee, quality=40)
    save(folder, "zz_coffee_png", coffee, "PNG")
    return folder


def build(folder, out, stages, overwrite=False):
    cfg = BuildConfig.model_validate(
        {
            "source": {"kind": "images", "path": str(folder), "files_per_task": 3},
            "stages": stages,
            "output": {"path": str(out), "overwrite": overwrite},
        }
    )
    manifest = run_build(cfg, progress=False)
    rows = pq.read_table(out / "signatures").to_pylist()
    return manifest, {r["key"]: (r["drop_reason"], r["duplicate_of"]) for r in rows}


def test_exact_then_near_across_tasks_and_rerun_identical(ray_session, tmp_path):
    folder = photo_folder(tmp_path)
    stages = [{"name": "exact_dedupe"}, {"name": "near_dedupe", "radius": 8}]
    manifest, fate = build(folder, tmp_path / "out", stages)
    dropped = {k: v for k, v in fate.items() if v[0]}
    assert dropped == {
        "zz_copy": ("duplicate_exact", "m0_astronaut"),
        "a_coffee_small": ("duplicate_near", "m1_coffee"),  # the larger image is kept
        "zz_coffee_q40": ("duplicate_near", "m1_coffee"),
        "zz_coffee_png": ("duplicate_near", "m1_coffee"),
    }
    assert manifest["samples"] == 8
    published = pq.read_table(tmp_path / "out" / "signatures").column_names
    assert "phash_crops" in published and "thumb" not in published  # thumbnails stay inside
    _, again = build(folder, tmp_path / "out", stages, overwrite=True)
    assert again == fate


def test_semantic_dedupe_in_a_build_drops_identical_embeddings(ray_session, tmp_path):
    folder = photo_folder(tmp_path)
    semantic = {
        "name": "semantic_dedupe",
        "model": "mmcurate-tiny",
        "pretrained": None,
        "device": "cpu",
        "eps": 1e-4,
        "clusters": 1,
    }
    manifest, fate = build(folder, tmp_path / "out", [semantic])
    assert fate["zz_copy"] == ("duplicate_semantic", "m0_astronaut")
    assert manifest["samples"] == len(fate) - sum(1 for v in fate.values() if v[0])
    embeddings = np.load(tmp_path / "out" / "embeddings" / "img_emb" / "img_emb_0000.npy")
    assert embeddings.dtype == np.float16 and embeddings.shape == (manifest["samples"], 64)
    assert "embedding" not in pq.read_table(tmp_path / "out" / "signatures").column_names


def test_ray_map_reduce_with_many_partitions_matches_brute_force(ray_session, monkeypatch):
    import mmcurate.stages.near_dedupe as near_module
    import numpy as np
    from mmcurate.core.mapreduce import RayRunner
    from mmcurate.stages.lib.hamming import brute_force_pairs
    from mmcurate.stages.lib.hamming_plan import plan_tables
    from mmcurate.stages.near_dedupe import close_pairs

    rng = np.random.default_rng(4)
    hashes = rng.integers(0, 2**64 - 1, size=3000, dtype=np.uint64, endpoint=True)
    hashes[1::3] = hashes[::3][: len(hashes[1::3])] ^ np.uint64(0b1011)  # distance 3
    monkeypatch.setattr(near_module, "REDUCE_BYTES", 8192)  # route across several reduces
    plan = plan_tables(len(hashes), 4, 0.99, mode="exact")
    a, b = close_pairs(hashes, plan, RayRunner(), wave_bytes=1 << 17)
    assert set(zip(a.tolist(), b.tolist(), strict=True)) == brute_force_pairs(hashes, 4)


def test_exact_decisions_routed_through_ray_match_in_process(ray_session, monkeypatch):
    import mmcurate.stages.exact_dedupe as exact_module
    import numpy as np
    import pyarrow as pa
    from mmcurate.core.mapreduce import RayRunner
    from mmcurate.stages.registry import build_stage

    rng = np.random.default_rng(6)
    keys = [f"k{i:04d}" for i in rng.permutation(500)]
    digests = [f"{int(v):064x}" for v in rng.integers(0, 60, size=500)]
    table = pa.table({"__key__": keys, "__drop__": [None] * 500, "sha256": digests})
    stage = build_stage({"name": "exact_dedupe"})
    in_process = stage.decide(table)
    monkeypatch.setattr(exact_module, "partitions_for", lambda *_: 5)
    assert stage.decide(table, RayRunner()) == in_process
    assert len(in_process) == 500 - len(set(digests))

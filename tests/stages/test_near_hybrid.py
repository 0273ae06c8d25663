"""near_dedupe's hybrid decisions on real photos: crops pHash misses, distinct crops of one
scene kept apart, no chaining, the embedding check, and the same decisions however the rows
were partitioned or ordered (no Ray here)."""

import io

import mmcurate.stages.near_dedupe as near_module
import numpy as np
import pyarrow as pa
import pytest
from mmcurate.pipeline.demo_data import source_photo
from mmcurate.stages.base import DROP
from mmcurate.stages.lib.dedupe_common import star_keepers
from mmcurate.stages.lib.image_hash import hamming
from mmcurate.stages.lib.thumb_match import mismatch, thumbnails
from mmcurate.stages.registry import build_stage
from PIL import Image, ImageEnhance


def jpeg(image: Image.Image, quality: int = 92) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def scene(name: str, window: tuple[float, float, float, float], side: int = 480) -> Image.Image:
    """A view of a photo: the window (fractions) resized to `side` px wide."""
    photo = source_photo(name).convert("RGB")
    w, h = photo.size
    x0, y0, x1, y1 = window
    view = photo.crop((round(x0 * w), round(y0 * h), round(x1 * w), round(y1 * h)))
    return view.resize((side, round(side * view.height / view.width)))


def cut(image: Image.Image, left: float, top: float, right: float, bottom: float) -> Image.Image:
    w, h = image.size
    return image.crop(
        (round(w * left), round(h * top), round(w * (1 - right)), round(h * (1 - bottom)))
    )


def views() -> tuple[list[str], list[bytes]]:
    """Per photo: a view, its near-duplicates (crops of 1-4% a side, the crop re-encoded
    smaller and darker) and another view of the same scene, shifted by 5-7% (distinct)."""
    keys, data = [], []
    for name in ("astronaut", "coffee", "chelsea", "rocket", "camera"):
        base = scene(name, (0.05, 0.05, 0.8, 0.8))
        crop = cut(base, 0.03, 0.02, 0.01, 0.03)
        smaller = ImageEnhance.Brightness(cut(base, 0.01, 0.02, 0.03, 0.02)).enhance(0.92)
        smaller = smaller.resize((smaller.width * 2 // 3, smaller.height * 2 // 3))
        shifted = scene(name, (0.12, 0.1, 0.87, 0.85))
        for suffix, image in (("a", base), ("b_crop", crop), ("c_edit", smaller), ("z", shifted)):
            keys.append(f"{name}_{suffix}")
            data.append(jpeg(image))
    return keys, data


def signatures(stage, keys: list[str], data: list[bytes], parts: int = 1) -> pa.Table:
    """Phase A as a build runs it: the stage on each partition, then the rows concatenated."""
    rows: dict[str, list] = {}
    for chunk in np.array_split(np.arange(len(keys)), parts):
        batch = {"__key__": [keys[i] for i in chunk], "jpg": [data[i] for i in chunk]}
        batch[DROP] = [None] * len(chunk)
        out = stage(batch)
        for column in ("__key__", DROP, "phash", "phash_crops", "thumb", "width", "height"):
            rows.setdefault(column, []).extend(out[column])
    types = {"phash": pa.uint64(), "phash_crops": pa.list_(pa.uint64()), DROP: pa.string()}
    return pa.table({c: pa.array(v, types.get(c)) for c, v in rows.items()})


@pytest.fixture(scope="module")
def photo_set():
    keys, data = views()
    stage = build_stage({"name": "near_dedupe"})
    return keys, data, signatures(stage, keys, data)


def base(key: str) -> str:
    return key.split("_")[0] + "_a"


def expected_drops(keys: list[str]) -> dict[str, tuple[str, str]]:
    return {k: ("duplicate_near", base(k)) for k in keys if k.endswith(("crop", "edit"))}


def test_defaults_drop_crops_phash_misses_and_keep_other_crops_of_the_scene(photo_set):
    keys, _, table = photo_set
    phash = dict(zip(keys, table["phash"].to_pylist(), strict=True))
    far = [k for k in keys if k.endswith("crop") and hamming(phash[k], phash[base(k)]) > 4]
    assert far, "the set must hold crops beyond the default radius, or it tests nothing"
    assert build_stage({"name": "near_dedupe"}).decide(table) == expected_drops(keys)
    unverified = build_stage({"name": "near_dedupe", "verify": "none"}).decide(table)
    assert not set(far) & set(unverified)  # radius 4 alone misses them


def test_same_decisions_across_partitionings_row_orders_and_routing(photo_set, monkeypatch):
    keys, data, table = photo_set
    stage = build_stage({"name": "near_dedupe"})
    reference = stage.decide(table)
    for parts in (2, 7):
        assert stage.decide(signatures(stage, keys, data, parts)) == reference
    shuffled = table.take(pa.array(np.random.default_rng(1).permutation(table.num_rows)))
    assert stage.decide(shuffled) == reference
    monkeypatch.setattr(near_module, "REDUCE_BYTES", 1024)  # route entries across reduces
    assert stage.decide(shuffled) == reference


def test_embedding_cosine_can_veto_a_thumbnail_match(photo_set):
    keys, _, table = photo_set
    dim = 16
    vectors = np.zeros((len(keys), dim), np.float16)
    vectors[np.arange(len(keys)), np.arange(len(keys)) % dim] = 1  # all orthogonal...
    crops = [i for i, k in enumerate(keys) if k.endswith("crop")]
    vectors[crops] = vectors[[keys.index(base(keys[i])) for i in crops]]  # ...but crops
    with_emb = table.append_column("embedding", pa.array(list(vectors), pa.list_(pa.float16())))
    decided = build_stage({"name": "near_dedupe"}).decide(with_emb)
    expected = {k: v for k, v in expected_drops(keys).items() if k.endswith("crop")}
    # edits still within `radius` of pHash are sure pairs: no check vetoes those
    sure = {k: v for k, v in expected_drops(keys).items() if k in decided and k.endswith("edit")}
    assert decided == expected | sure


def test_thumbnail_mismatch_of_crops_edits_and_shifted_views(photo_set):
    keys, _, table = photo_set
    thumbs = dict(zip(keys, thumbnails(table["thumb"].to_pylist()), strict=True))
    names = {k.split("_")[0] for k in keys}
    pairs = {
        kind: [(thumbs[f"{n}_a"], thumbs[f"{n}_{kind}"]) for n in sorted(names)]
        for kind in ("b_crop", "c_edit", "z")
    }
    score = {kind: mismatch(*map(np.stack, zip(*p, strict=True))) for kind, p in pairs.items()}
    assert score["b_crop"].max() < 0.4 and score["c_edit"].max() < 0.4
    assert score["z"].min() > 0.4
    flat = np.full((1, 32, 32), 128, np.uint8)
    assert np.isinf(mismatch(flat, flat)).all()  # nothing to align: never verified by looks


def sequential_star(n: int, a: np.ndarray, b: np.ndarray, rank: np.ndarray) -> list[int]:
    """The rule, spelled out: in keep order, an unclaimed item is kept and claims its partners."""
    partners: list[set[int]] = [set() for _ in range(n)]
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        partners[x].add(y)
        partners[y].add(x)
    keeper = [-1] * n
    for i in np.argsort(rank).tolist():
        if keeper[i] == -1:
            keeper[i] = i
            for j in partners[i]:
                if keeper[j] == -1:
                    keeper[j] = i
    return keeper


def test_star_keepers_follow_the_rule_and_never_chain():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        a, b = rng.integers(0, n, size=(2, int(rng.integers(0, 60))))
        a, b = a[a != b], b[a != b]
        rank = rng.permutation(n)
        keeper = star_keepers(n, a, b, rank)
        assert keeper.tolist() == sequential_star(n, a, b, rank)
        paired = set(zip(a.tolist(), b.tolist(), strict=True))
        for item, kept in enumerate(keeper.tolist()):
            assert keeper[kept] == kept  # a keeper is kept
            assert kept == item or (item, kept) in paired or (kept, item) in paired
    chain = star_keepers(3, np.array([0, 1]), np.array([1, 2]), np.array([0, 1, 2]))
    assert chain.tolist() == [0, 0, 2]  # 2 is paired only with the dropped 1: kept

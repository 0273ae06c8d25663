"""Shared pieces of the sweep tests: a tiny raw image set, two small eval builds, the base
build / train / eval configs of a tiny grid."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from mmcurate.pipeline.demo_data import make_demo_images

from tests.eval_sets import PHOTOS, photo, write_build

CLIP = {"name": "clip_score", "model": "mmcurate-tiny", "pretrained": None, "num_gpus": 0}
TRAIN = {
    "data": {"batch_size": 4, "workers": 0, "decode_threads": 1},
    "optim": {"warmup_steps": 1},
    "run": {"max_steps": 3, "log_every": 3},
}
EVAL = {"retrieval": {"recall_at": [1, 5]}, "data": {"batch_size": 8, "workers": 0}}


def make_sweep_data(root: Path) -> dict[str, Path]:
    """A raw image folder (with exact copies) and two small eval builds (validation, test)."""
    make_demo_images(root / "raw", n=20, exact_copies=3, broken=0, seed=0)
    pairs = [{"key": f"p{i:02d}", "image": photo(i), "txt": PHOTOS[i].caption} for i in range(20)]
    return {
        "raw": root / "raw",
        "validation": write_build(root / "val", [pairs[:10]]),
        "test": write_build(root / "test", [pairs[10:]]),
    }


def base_build(data: dict[str, Path]) -> dict:
    return {
        "source": {"kind": "images", "path": str(data["raw"]), "files_per_task": 12},
        "stages": [{"name": "decode_image", "resize": {"size": 32}}, CLIP],
        "output": {"path": "set-by-the-sweep", "shard_max_samples": 8},
    }


def sweep_tree(data: dict[str, Path], out: Path, arms: list[dict], seeds: list[int]) -> dict:
    splits = {"validation": str(data["validation"]), "test": str(data["test"])}
    return {
        **{"build": base_build(data), "train": TRAIN, "eval": EVAL, "splits": splits},
        **{"seeds": seeds, "arms": arms, "output": str(out)},
    }


def keys_of(build: Path) -> list[str]:
    """Sample keys in shard order (the order training reads them in)."""
    manifest = json.loads((build / "manifest.json").read_text())
    keys: list[str] = []
    for shard in manifest["shards"]:
        with tarfile.open(build / shard["name"]) as tar:
            keys += [n.partition(".")[0] for n in tar.getnames() if n.endswith(".txt")]
    return keys


def train_filter_network(manifest: Path, run: Path, steps: int = 3, seed: int = 0) -> Path:
    """A filter network: `mmcurate train` of the tiny CLIP on a trusted build; its run folder
    (checkpoints/step-<steps>.pt), which clip_score's `pretrained` takes as it is."""
    import mmcurate

    tree = {
        **TRAIN,
        "data": {**TRAIN["data"], "manifest": str(manifest), "seed": seed},
        "run": {"max_steps": steps, "log_every": steps, "output": str(run)},
    }
    mmcurate.train(tree)
    return run


def picture_batch(pictures: list[bytes], captions: list[str]) -> dict:
    """A stage batch of jpg + txt rows (keys k000, k001, ...), as a source gives one."""
    from mmcurate.pipeline.sources.samples import empty_batch

    batch = empty_batch()
    for i, (data, caption) in enumerate(zip(pictures, captions, strict=True)):
        batch["__key__"].append(f"k{i:03d}")
        for column in batch:
            if column != "__key__":
                batch[column].append(None)
        batch["jpg"][-1], batch["txt"][-1] = data, caption
    return batch


def assert_refused_in_one_line(tmp_path: Path, capsys, tree: dict, message: str) -> None:
    """`mmcurate sweep` over `tree` exits 2 with one `error:` line naming `message`, and
    nothing ran (no output folder)."""
    import yaml
    from mmcurate.pipeline.sweep.run import main

    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump(tree))
    assert main([str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (tmp_path / "out").exists()  # nothing ran

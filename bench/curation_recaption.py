"""The curation bench's recaption arm (issue 39): the clip arm's threshold, the recaption
build's settings, and what the recaptioned samples say by the generator's ground truth.

The arm is configs/curation/recaption.yaml: decode, clip_score with the filter model (no
threshold of its own), then `recaption` with `choose: fill` at `min_score` = the lowest score
the clip arm kept. So the arm keeps what the clip arm keeps, plus every sample the clip arm
drops whose new caption (from bench/curation_captioner.py's tiny BLIP-2) scores at least that.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from bench.curation_data import BACKGROUNDS, PHRASES, Group, Scene, group_phrase


def build_jsons(out: Path) -> dict[str, dict]:
    """Every sample's json member in a build's shards, by key, its caption added as `txt`."""
    manifest = json.loads((out / "manifest.json").read_text())
    found: dict[str, dict] = {}
    texts: dict[str, str] = {}
    for shard in manifest["shards"]:
        with tarfile.open(out / shard["name"]) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                if ext == "json":
                    found[key] = json.loads(tar.extractfile(member).read())
                elif ext == "txt":
                    texts[key] = tar.extractfile(member).read().decode().strip()
    return {key: {**meta, "txt": texts.get(key, "")} for key, meta in found.items()}


def lowest_kept_score(clip_build: Path) -> float:
    """The clip arm's threshold: the lowest clip_score keep_top_fraction kept (less 1e-6, so
    rounding never moves a sample the clip arm kept below it)."""
    return min(j["clip_score"] for j in build_jsons(clip_build).values()) - 1e-6


def recaption_sets(checkpoint: Path, captioner: Path, threshold: float) -> list[str]:
    """The --set items of the recaption arm's build."""
    return [
        f"stages.1.pretrained={checkpoint}",
        f"stages.2.model={captioner}",
        f"stages.2.min_score={threshold:.6f}",
    ]


def true_captions(scene: dict) -> set[str]:
    """Every phrasing of a scene's caption the generator writes."""
    group = Group(**scene["group"])
    text = group_phrase(Scene(group, scene["background"]).group)
    where = BACKGROUNDS[scene["background"]][0]
    return {phrase.format(g=text, b=where) for phrase in PHRASES}


def recaptioned(out: Path, roles: dict[str, dict]) -> dict[str, int]:
    """The recaption arm's samples by caption source and truth: synthetic captions that say
    exactly what the picture shows, or not, and which kind of raw sample got them."""
    counts = {"original": 0, "synthetic": 0, "synthetic_right": 0}
    for part in ("colour", "shape", "background"):
        counts[f"synthetic_{part}_right"] = 0
    for kind in ("clean", "mismatched"):
        counts[f"synthetic_of_{kind}"] = 0
    for key, meta in build_jsons(out).items():
        source = roles[key].get("of", key)
        if meta.get("caption_source") != "synthetic":
            counts["original"] += 1
            continue
        counts["synthetic"] += 1
        counts[f"synthetic_of_{roles[source]['role']}"] += 1
        scene, text = roles[source]["scene"], meta.get("txt", "")
        counts["synthetic_right"] += text in true_captions(scene)
        for part, right in parts_right(scene, text).items():
            counts[f"synthetic_{part}_right"] += right
    return counts


def parts_right(scene: dict, text: str) -> dict[str, bool]:
    """Which parts of a caption name the scene's colour, shape and background correctly."""
    words = text.replace(":", " ").replace(",", " ").split()
    group = scene["group"]
    return {
        "colour": group["colour"] in words,
        "shape": any(w.startswith(group["shape"]) for w in words),
        "background": BACKGROUNDS[scene["background"]][0] in text,
    }

"""A sweep's scorers: the base build's `clip_score` stage (named `clip_score`) and the named
`scorers:` of the sweep config (clip_score options each: another CLIP, a filter network
trained by `mmcurate train` on a trusted set, `mask_text: true`), each run once per source.

The base build's scorer runs inside the scoring build (output/scored/<source>/). Every other
scorer is one more build over that build's shards (output/scorers/<scorer>/<source>/): a
webdataset source and the one clip_score stage, so it scores exactly the samples the scoring
build kept, and nothing is downloaded or decoded again. output/scoring.json counts the runs
per source and scorer (the ledger: `{source: {scorer: runs}}`); a finished build is reused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mmcurate.core.config_io import ConfigError

SCORERS = ("clip_score",)  # stages whose recorded value an arm thresholds (by default)
DEFAULT_SCORER = "clip_score"  # the base build's clip_score stage, as arms and the ledger name it
# The options that decide a score: two scorers equal in these would score twice for nothing.
SCORE_KEYS = ("model", "pretrained", "mask_text", "mask_fill")
THRESHOLDS = ("min_score", "max_score", "keep_top_fraction")  # the arms' job, never a scorer's


def scorer_stage(name: str, options: dict[str, Any]) -> Any:
    """A named scorer's clip_score stage, validated (one line naming `scorers.<name>`)."""
    from mmcurate.stages.registry import build_stage

    if not isinstance(options, dict):
        raise ConfigError(f"scorers.{name}: a mapping of clip_score options")
    if options.get("name", "clip_score") != "clip_score":
        raise ConfigError(f"scorers.{name}.name: a scorer is a clip_score stage")
    thresholds = [key for key in THRESHOLDS if options.get(key) is not None]
    if thresholds:
        raise ConfigError(f"scorers.{name}.{thresholds[0]}: thresholds belong to the arms")
    try:
        return build_stage({**options, "name": "clip_score"}, 0)
    except ConfigError as err:
        raise ConfigError(f"scorers.{name}: {str(err).removeprefix('stages.0')}") from None


def weights_file(pretrained: str | None) -> str | None:
    """The local file `pretrained` loads (a run folder: its newest checkpoint), resolved; None
    for a named weight tag, none, or a path that does not resolve (said in one line when the
    model is loaded: load_scorer_models)."""
    from mmcurate.stages.lib.clip_model import looks_like_path, newest_checkpoint

    if not looks_like_path(pretrained):
        return None
    try:
        return os.path.realpath(newest_checkpoint(pretrained))
    except ConfigError:
        return None


def score_identity(options: Any) -> tuple:
    """What decides a scorer's scores; a local `pretrained` as the file it loads (a run
    folder and its newest checkpoint are the same weights)."""
    values = {key: getattr(options, key) for key in SCORE_KEYS}
    values["pretrained"] = weights_file(values["pretrained"]) or values["pretrained"]
    return tuple(values.values())


def weights_of(options: dict[str, Any]) -> dict[str, Any] | None:
    """`weights_file` with its size and modification time. Why: sweep.json keeps `pretrained`
    as written, and a run retrained in place would leave the old weights' scores looking
    current."""
    path = weights_file(options.get("pretrained"))
    try:
        stat = os.stat(path) if path else None
    except OSError:
        return None
    return {"file": path, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns} if stat else None


def scorer_weights(build: dict[str, Any], scorers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`weights_of` for every scorer (the base one as `clip_score`) whose weights are a file."""
    index = scorer_index(build)
    named = {DEFAULT_SCORER: build["stages"][index] if index is not None else {}, **scorers}
    found = {name: weights_of(options) for name, options in named.items()}
    return {name: weights for name, weights in found.items() if weights is not None}


def check_scorers(build: dict[str, Any], scorers: dict[str, dict[str, Any]]) -> None:
    """Each scorer once: its name not the base build's scorer's, its options not those of
    another scorer (the same scores computed twice); ConfigError, one line."""
    seen: dict[tuple, str] = {}
    index = scorer_index(build)
    if index is not None:
        base = {k: v for k, v in build["stages"][index].items() if k not in THRESHOLDS}
        try:
            seen[score_identity(scorer_stage(DEFAULT_SCORER, base).options)] = DEFAULT_SCORER
        except ConfigError:
            pass  # the build's own loader says what is wrong with it (check_named_configs)
    for name, options in scorers.items():
        if name == DEFAULT_SCORER:
            raise ConfigError(f"scorers.{name}: the name of the base build's clip_score scorer")
        identity = score_identity(scorer_stage(name, options).options)
        if identity in seen:
            raise ConfigError(
                f"scorers.{name}: scores as {seen[identity]} does (same model, pretrained, "
                "mask_text, mask_fill); each scorer once"
            )
        seen[identity] = name


def load_scorer_models(scorers: dict[str, dict[str, Any]]) -> None:
    """Load each named scorer's model once on CPU (then free it): a missing checkpoint or a
    wrong model name fails before anything runs, not after the scoring builds."""
    for name, options in scorers.items():
        stage = scorer_stage(name, options)
        try:
            stage.check()
        except ConfigError as err:
            raise ConfigError(f"scorers.{name}: {str(err).removeprefix('stages.0: ')}") from None


def scorer_index(build: dict[str, Any]) -> int | None:
    """The position of the build's clip_score stage (the scorer named `clip_score`)."""
    stages = build.get("stages") or []
    found = [i for i, s in enumerate(stages) if isinstance(s, dict) and s.get("name") in SCORERS]
    return found[0] if found else None


def scorer_tree(
    build: dict[str, Any], options: dict[str, Any], scored: Path, out: Path
) -> dict[str, Any]:
    """The build of one named scorer (its clip_score `options`) over a scoring build's
    shards: their samples, scored; the base build's ray, storage and shard sizes."""
    tree = {k: v for k, v in build.items() if k in ("ray", "storage_options")}
    tree["source"] = {"kind": "webdataset", "path": str(Path(scored) / "shard-*.tar")}
    tree["stages"] = [{**options, "name": "clip_score"}]
    tree["output"] = {**build.get("output", {}), "path": str(out)}
    return tree


def scores_folder(output: Path, scorer: str | None, source: str) -> Path:
    """The build whose signatures hold `scorer`'s scores of `source`."""
    if scorer is None or scorer == DEFAULT_SCORER:
        return output / "scored" / source
    return output / "scorers" / scorer / source


def count_run(output: Path, ledger: dict[str, Any], source: str, scorer: str | None) -> None:
    """One more run of `scorer` (None: a scoring build without one) over `source` in the
    ledger (output/scoring.json)."""
    entry = ledger.setdefault(source, {})
    if scorer is not None:
        entry[scorer] = entry.get(scorer, 0) + 1
    (output / "scoring.json").write_text(json.dumps(ledger, indent=1) + "\n")

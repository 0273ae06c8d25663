"""Every name a build writes inside `_work/`, spelled once.

The functions below spell a scratch file's name (relative to its folder, or to `_work/`),
as pipeline/sources/staging.py does for a URL list's staged copy (sources come before output);
`WORK_NAMES`, the pattern by which a rerun recognises a `_work/` folder as nothing but a
build's scratch (pipeline/output/existing.py), is made from the same table. A scratch file
spelled elsewhere would miss the pattern and make a rerun refuse its own folder:
tests/builds/test_work_names.py checks that every name these functions give matches it.
"""

from __future__ import annotations

import re

from mmcurate.pipeline.sources.staging import STAGE_FOLDER as SOURCE
from mmcurate.pipeline.sources.staging import STAGED_DONE

WORK_DIR = "_work"
BUILD_FILE = "build.json"  # the claim (pipeline/output/resume.py)
CANDIDATES = "candidates"  # phase A: a partition's candidate tar, its metadata, its payloads
SIGNATURES = "signatures"  # phase A: a partition's signatures (its completion mark)
PARTS = "parts"  # phase A: a partition's done marker
SHARDS = "shards"  # phase C: a shard's done marker
DECIDE = "decide"  # phase B: each round's fates and shuffles, the groups' rows and kept tables
FOLDERS = (CANDIDATES, SIGNATURES, PARTS, SHARDS, DECIDE, SOURCE)

CANDIDATE_EXTENSIONS = ("tar", "parquet", "media.parquet")  # payloads, metadata, media index
DECIDE_FOLDERS = ("signatures", "kept")  # the groups' rows, the kept rows per group
ROUND_KINDS = ("fate", "shuffle")  # per decide round: each group's fate, the routed rows
# `mmcurate remove` (pipeline/maintain/remove*.py): its plan, the list of staged files and
# the staged copies themselves (output names under staged/), all dropped once it is done.
REMOVE = "remove"
REMOVE_FILES = ("plan.json", "staged.json")
REMOVE_STAGED = "staged"


def part_stem(part: int) -> str:
    """`part-000012`: a partition's files' name before the extension."""
    return f"part-{part:06d}"


def part_file(part: int, extension: str) -> str:
    """`part-000012.<extension>`: a partition's file in candidates/, signatures/ or parts/."""
    return f"{part_stem(part)}.{extension}"


def part_number(name: str) -> int | None:
    """The partition of a `part-000012.<ext>` name (None for any other name)."""
    match = re.fullmatch(r"part-([0-9]{6,})\..+", name)
    return int(match.group(1)) if match else None


def shard_marker_name(shard: str) -> str:
    """`shard-000003.json` for `shard-000003.tar`: the shard's done marker in shards/."""
    return shard.removesuffix(".tar") + ".json"


def group_file(group: int) -> str:
    """`g-000004.parquet`: one signature group's file in a decide folder."""
    return f"g-{group:06d}.parquet"


def round_folder(kind: str, round_name: str) -> str:
    """`fate-001`, `shuffle-001`: a decide round's folder under decide/."""
    if kind not in ROUND_KINDS:
        raise ValueError(f"unknown decide round folder {kind!r}")
    return f"{kind}-{round_name}"


def round_name(number: int) -> str:
    return f"{number:03d}"


def remove_file(name: str) -> str:
    """`remove/plan.json`, `remove/staged.json`: an unfinished remove's records."""
    if name not in REMOVE_FILES:
        raise ValueError(f"unknown remove file {name!r}")
    return f"{REMOVE}/{name}"


def remove_staged(rel: str) -> str:
    """`remove/staged/<rel>`: the staged copy of the output file `rel` (relative to output)."""
    return f"{REMOVE}/{REMOVE_STAGED}/{rel}"


def _work_pattern() -> re.Pattern[str]:
    """Every name above (folders too: some stores list them as entries), with the temp copy
    an interrupted atomic write leaves (core/atomic.py)."""
    tmp = r"(\.tmp-[0-9a-f]{32})?"
    part = r"part-[0-9]{6,}"
    alternatives = "|".join(re.escape(e) for e in CANDIDATE_EXTENSIONS)
    rounds = "|".join([*DECIDE_FOLDERS, *(rf"{kind}-[0-9]{{3}}" for kind in ROUND_KINDS)])
    return re.compile(
        "|".join(
            [
                rf"{re.escape(BUILD_FILE)}\.tmp-[0-9a-f]{{32}}",
                "|".join(FOLDERS),
                rf"{CANDIDATES}/{part}\.({alternatives}){tmp}",
                rf"({SIGNATURES}/{part}\.parquet|{PARTS}/{part}\.json){tmp}",
                rf"{SHARDS}/shard-[0-9]{{6,}}\.json{tmp}",
                rf"{DECIDE}/({rounds})(/[a-z0-9-]+\.parquet{tmp})?",
                rf"{SOURCE}/[0-9a-f]{{16}}-[0-9]+(/([0-9]{{6,}}\.parquet|{re.escape(STAGED_DONE)}){tmp})?",
                rf"{REMOVE}(/({'|'.join(map(re.escape, REMOVE_FILES))}){tmp})?",
                rf"{REMOVE}/{REMOVE_STAGED}(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*",  # output names
            ]
        )
    )


WORK_NAMES = _work_pattern()

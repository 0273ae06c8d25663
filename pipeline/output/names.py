"""Every name a build writes, spelled once: inside `_work/` (its scratch) and outside it
(what its ledger records, pipeline/output/claim.py, and the only files a later build may
delete).

The functions below spell a scratch file's name (relative to its folder, or to `_work/`),
as pipeline/sources/staging.py does for a URL list's staged copy (sources come before output);
`WORK_NAMES`, the pattern by which a rerun recognises a `_work/` folder as nothing but a
build's scratch (pipeline/output/existing.py), is made from the same table. A scratch file
spelled elsewhere would miss the pattern and make a rerun refuse its own folder:
tests/builds/test_work_names.py checks that every name these functions give matches it.
"""

from __future__ import annotations

import re
from typing import Any

from mmcurate.core.formats import MANIFEST_FORMAT
from mmcurate.pipeline.output.embeddings import EMBEDDING_COLUMNS, ROWS_PER_FILE
from mmcurate.pipeline.sources.staging import STAGE_FOLDER as SOURCE
from mmcurate.pipeline.sources.staging import STAGED_DONE

MANIFEST = "manifest.json"
BUILD_ID = re.compile(r"[0-9a-f]{64}")
# Names a build writes: a file there that no build of ours recorded would be overwritten.
RESERVED_FILES = (
    *(MANIFEST, "stats.json", "report.html", "shardindex.json", "buckets.json"),
    "audit.jsonl",  # `mmcurate remove`'s record of what it took out (pipeline/maintain/)
)
PUBLISHED_FOLDERS = ("signatures", "embeddings")
SHARD_PREFIX = "shard-"
ATOMIC_TMP = re.compile(r"(.+)\.tmp-[0-9a-f]{32}")  # atomic.write_bytes_atomic's temp names

WORK_DIR = "_work"
BUILD_FILE = "build.json"  # the claim (pipeline/output/claim.py)
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
# `mmcurate retry` and `append` (pipeline/maintain/grow_*.py): their scratch beside _work/, what
# the unfinished operation was asked, and the merged output staged before it is published.
GROW_DIR = "_grow"
GROW_OP = "op.json"
GROW_MERGE = "merge"


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


# ---- the names a build writes outside _work/ ------------------------------------------------


def in_namespace(rel: str) -> bool:
    """Names a build records outside _work: the fixed files, shard-*, signatures/, embeddings/."""
    top, _, rest = rel.partition("/")
    if top in PUBLISHED_FOLDERS:
        return bool(rest)
    return not rest and (top in RESERVED_FILES or top.startswith(SHARD_PREFIX))


def safe_recorded(names: Any) -> list[str]:
    """Recorded names a build may delete: relative, inside our namespace, no `..` (a forged or
    damaged record can never point a deletion anywhere else)."""
    if not isinstance(names, list):
        return []
    ok = []
    for name in names:
        parts = name.split("/") if isinstance(name, str) else [""]
        if all(p not in ("", ".", "..") for p in parts) and in_namespace(name):
            ok.append(name)
    return ok


def temp_of(rel: str) -> str | None:
    """`x` for `x.tmp-<uuid>` (an atomic write a crash interrupted), else None."""
    match = ATOMIC_TMP.fullmatch(rel)
    return match.group(1) if match else None


def embedding_files(count: int) -> list[str]:
    """Every name pipeline.output.embeddings may write for `count` file sets (one per group)."""
    folders = [*EMBEDDING_COLUMNS.values(), "metadata"]
    return [
        f"embeddings/{f}/{f}_{i:04d}.{'parquet' if f == 'metadata' else 'npy'}"
        for i in range(count)
        for f in folders
    ]


def shard_files(name: str) -> list[str]:
    """A final shard and its metadata parquet (pipeline.output.shards.write_shard)."""
    return [name, name.removesuffix(".tar") + ".parquet"]


def output_files(shards: list[str], groups: int) -> list[str]:
    """Every file (but the manifest) a build with these shards and signature groups may write."""
    fixed = ["stats.json", "shardindex.json", "report.html", "buckets.json"]  # buckets: if asked
    fixed += [signatures_file(g) for g in range(max(1, groups))]
    return fixed + embedding_files(groups) + [f for name in shards for f in shard_files(name)]


def manifest_files(manifest: dict) -> set[str]:
    """What a finished build wrote: its `files` record, or for a manifest from before that
    record existed, the names such a build wrote (one signatures file, embeddings per 1M)."""
    if "files" in manifest:
        return {MANIFEST, *safe_recorded(manifest["files"])}
    shards = manifest.get("shards")
    names = (
        [e.get("name") for e in shards if isinstance(e, dict)] if isinstance(shards, list) else []
    )
    samples = manifest.get("samples")
    rows = samples if isinstance(samples, int) and samples > 0 else 0
    derived = output_files([n for n in names if isinstance(n, str)], 0)
    derived += embedding_files(-(-rows // ROWS_PER_FILE))
    return {MANIFEST, *safe_recorded(derived)}


def ours_manifest(value: Any) -> dict | None:
    """The manifest if an mmcurate build wrote it (format and build id), else None."""
    if isinstance(value, dict) and value.get("format") == MANIFEST_FORMAT:
        build_id = value.get("build_id")
        if isinstance(build_id, str) and BUILD_ID.fullmatch(build_id):
            return value
    return None


def signatures_file(group: int) -> str:
    """`signatures/part-000000.parquet`, ...: one file per signature group, in output order."""
    return f"signatures/{part_file(group, 'parquet')}"

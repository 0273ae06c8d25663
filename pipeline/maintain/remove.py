"""`mmcurate remove OUTPUT (--keys FILE | --urls FILE | --sha256 FILE | --like FOLDER)`: take
samples out of a finished build (docs/maintenance.md, "remove").

Plan (remove_plan.py), stage (remove_stage.py), swap (remove_swap.py): nothing in the build
changes until every new file is staged, only the shards that hold a removed sample are
rewritten, and the manifest moves last. A kill at any point and the same command again end
exactly where one uninterrupted run ends; a remove that finds nothing to take out changes
nothing and records nothing (so running it twice is the same as once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from typing import Any

from mmcurate.core.config_io import (
    ConfigError,
    OneLineParser,
    add_storage_options,
    parse_storage_options,
)
from mmcurate.core.redaction import redact_text
from mmcurate.pipeline.maintain.common import (
    FinishedBuild,
    finished_build,
)
from mmcurate.pipeline.maintain.remove_plan import check_shards, make_plan, pending_plan
from mmcurate.pipeline.maintain.remove_select import SELECTORS, Request, near_options, read_request
from mmcurate.pipeline.maintain.remove_stage import stage_all
from mmcurate.pipeline.maintain.remove_swap import drop_scratch, read_staged, swap_all

log = logging.getLogger("mmcurate.remove")


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="mmcurate remove", description=__doc__.split("\n")[0])
    top.add_argument("output", help="a finished build's output folder (any fsspec URL)")
    which = top.add_mutually_exclusive_group(required=True)
    which.add_argument("--keys", metavar="FILE", help="sample keys, one a line")
    which.add_argument("--urls", metavar="FILE", help="source URLs, one a line")
    which.add_argument("--sha256", metavar="FILE", help="sha256 hex digests, one a line")
    which.add_argument("--like", metavar="FOLDER", help="images: their near-duplicates go")
    add_storage_options(top)
    return top


def main(argv: list[str]) -> int:
    """The command: a summary as one JSON line; bad arguments or no build: one line, exit 2."""
    try:
        args = parser().parse_args(argv)
        kind = next(k for k in SELECTORS if getattr(args, k) is not None)
        summary = run_remove(
            args.output, kind, getattr(args, kind), parse_storage_options(args.storage_options)
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"output": redact_text(args.output), **summary}))
    return 0


def run_remove(url: str, kind: str, source: str, options: dict[str, Any]) -> dict[str, Any]:
    """Remove what the selector names from the build at `url`; returns the summary (removed:
    0 and nothing written when it names nothing the build holds)."""
    if kind not in SELECTORS:
        raise ConfigError(f"remove: unknown selector {kind!r} (one of {', '.join(SELECTORS)})")
    build = finished_build(url, options, "remove")
    request = read_request(kind, source, near_options(build.manifest) if kind == "like" else None)
    if (staged := read_staged(build)) is not None:  # a remove was killed while swapping
        log.info("finishing an interrupted remove first")
        swap_all(build, staged["actions"])
        if staged.get("request") == request.record():  # this one: done as it would have been
            return staged["summary"] | unreadable(request)
        build = finished_build(url, options, "remove")
    plan = resumable_plan(build, request)
    if plan is None:
        check_shards(build)
        plan = make_plan(build, request)
    if plan is None:
        drop_scratch(build)
        return {"removed": 0, "samples_after": build.manifest["samples"]} | unreadable(request)
    staged = stage_all(build, plan)
    swap_all(build, staged["actions"])
    return staged["summary"] | unreadable(request)


def resumable_plan(build: FinishedBuild, request: Request) -> dict[str, Any] | None:
    """A plan an interrupted run of this same request wrote for this same manifest (nothing
    was changed yet: it is staged again from the start); any other is dropped."""
    plan = pending_plan(build)
    if plan is None:
        return None
    same_build = plan.get("manifest_sha256") == hashlib.sha256(build.manifest_bytes).hexdigest()
    if same_build and plan.get("request") == request.record():
        return plan
    drop_scratch(build)
    return None


def unreadable(request: Request) -> dict[str, int]:
    return {"unreadable_images": request.unreadable} if request.kind == "like" else {}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main(sys.argv[1:]))

"""What makes a build resumable and what it may delete: its identity, its claim, its ledger.

`_work/build.json`, the claim: the build's identity (resolved config and input plan), the run
holding it, the runs whose finished work it trusts, and its ledger: every file outside `_work/`
it is about to write, recorded *before* writing; a finished build's manifest lists what it wrote
(`files`). Only recorded files are ever deleted. A rerun of the same identity takes the claim
over and skips each partition and shard whose marker names this build and a trusted run; another
identity is refused unless `--overwrite` (deletes exactly the recorded files, trusts no earlier
run); a finished build of the same identity is a no-op. A `_work/` without marker holding only
names a build writes there is an interrupted build's scratch: cleared. Anything else belongs to
someone else: refused unless `output.allow_other_files`, never deleted or overwritten. A run
checks the claim is still its own before it trusts markers, records files, writes a task's
results and commits; once another run took it over, it stops (TookOver, one line).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from mmcurate.core.atomic import create_bytes, write_bytes_atomic
from mmcurate.core.config_io import ConfigError
from mmcurate.core.redaction import redact
from mmcurate.core.storage import files_in, filesystem, join, remove_tree, with_retries
from mmcurate.pipeline.config import BuildConfig
from mmcurate.pipeline.output.existing import (
    TOOL,
    OutputState,
    collides,
    inspect_output,
    ours_marker,
    read_json,
    relative,
)
from mmcurate.pipeline.output.names import BUILD_FILE, MANIFEST, WORK_DIR, remove_file
from mmcurate.pipeline.sources.records import Partition

CLAIM_TRIES = 3
HEAD_BYTES = 512  # where a marker holds its run id (before its ledger, which can be large)
RUN_FIELD = re.compile(rb'"run": "([0-9a-f]{32})"')


class AlreadyBuilt(Exception):
    """The output already holds this very build; carries its manifest."""

    def __init__(self, manifest: dict) -> None:
        super().__init__("already built")
        self.manifest = manifest


class TookOver(ConfigError):
    """Another run holds output.path now: this one stops (one line, as config errors)."""


def build_identity(cfg: BuildConfig, parts: list[Partition]) -> str:
    """Hash of what decides the output: config (minus how it runs) and the input plan (each
    partition record as its dict, so the identity is the one plain-dict plans had)."""
    how = {"overwrite", "allow_other_files"}
    config = json.loads(cfg.model_dump_json(exclude={"ray": True, "output": how}))
    # Credentials do not decide the output: rotated keys must still resume or find the build.
    config["storage_options"] = redact(config["storage_options"])
    plan = [part.to_dict() for part in parts]
    text = json.dumps({"config": config, "parts": plan}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    """One run's hold on output.path (plain data: it travels to tasks). `runs` are the runs
    whose finished partitions and shards it trusts: itself and, when it resumes an interrupted
    build of the same identity, the runs that worked on that build before."""

    url: str
    storage_options: dict[str, Any]
    build_id: str
    run: str
    runs: tuple[str, ...]

    @property
    def work_url(self) -> str:
        return join(self.url, WORK_DIR)

    def check(self) -> dict:
        """The marker while this run holds the claim; TookOver once another run took it (a run
        id is never written twice, so a lost claim stays lost)."""
        fs, out = filesystem(self.url, self.storage_options)
        marker = ours_marker(read_json(fs, join(out, WORK_DIR, BUILD_FILE)))
        if marker is None or marker["run"] != self.run:
            raise self.lost()
        return marker

    def lost(self) -> TookOver:
        return TookOver(
            f"another build took over output.path {self.url} (a newer run, or --overwrite); "
            "this run stopped before its manifest"
        )

    def holds(self) -> bool:
        """`check` for tasks, from the marker's first bytes only: one small read."""
        fs, out = filesystem(self.url, self.storage_options)
        path = join(out, WORK_DIR, BUILD_FILE)
        try:
            head = with_retries(lambda: fs.cat_file(path, start=0, end=HEAD_BYTES))
        except FileNotFoundError:
            return False
        found = RUN_FIELD.search(head)
        return found is not None and found.group(1).decode() == self.run

    def stamp(self) -> dict[str, str]:
        """What a partition's or a shard's marker carries: which build and run wrote it."""
        return {"build_id": self.build_id, "run": self.run}

    def trusts(self, record: Any) -> bool:
        ours = isinstance(record, dict) and record.get("build_id") == self.build_id
        return ours and record.get("run") in self.runs

    def marker(self, files: list[str], clearing: bool = False) -> dict[str, Any]:
        """`_work/build.json` as this run writes it (while clearing: no build id, no runs);
        the run id comes before the ledger, where `holds` reads it."""
        build_id, runs = (None, []) if clearing else (self.build_id, list(self.runs))
        return {"tool": TOOL, "build_id": build_id, "run": self.run, "runs": runs, "files": files}


def claim_output(cfg: BuildConfig, identity: str, run: str | None = None) -> Claim:
    """Make output.path this run's: fresh, resumed, complete (AlreadyBuilt) or refused. Deletes
    only what an earlier mmcurate build recorded (with --overwrite, or to finish clearing what
    an interrupted --overwrite had started to delete) and an interrupted build's scratch."""
    run = run or uuid.uuid4().hex
    for _ in range(CLAIM_TRIES):
        try:
            claim = take_output(cfg, identity, run)
        except FileExistsError:
            continue  # another run made its marker after this one looked: look again
        claim.check()  # read back: on object stores the last of two racing writes holds it
        return claim
    raise TookOver(f"output.path: {cfg.output.path}: other builds keep claiming it; try again")


def take_output(cfg: BuildConfig, identity: str, run: str) -> Claim:
    """One look at output.path and the claim it allows. Where no marker was, it is created only
    if still absent (local disks: FileExistsError if another run made one since); a resumed
    build's marker is replaced, which takes the build over from a run that may still be going.
    Object stores differ on conditional writes, so there two runs that start together may both
    write; the read-back in `claim_output`, or the loser's next check, stops the one whose
    write landed first. What remains: a run that checked just before the claim moved on still
    finishes the one write it was making (a partition's or a shard's files)."""
    fs, out = filesystem(cfg.output.path, cfg.storage_options)
    state = inspect_output(fs, out, cfg.output.path)
    overwrite = cfg.output.overwrite
    if state.manifest is not None and state.previous == identity and not overwrite:
        refuse_unfinished_remove(fs, out, cfg.output.path)
        if state.marker is not None or state.leftover:  # scratch left after the commit
            drop_work(fs, out)
        raise AlreadyBuilt(state.manifest)
    refuse_foreign(state, cfg.output.allow_other_files)
    if state.previous not in (None, identity) and not overwrite:
        what = "already holds a different build"
        if state.manifest is None:
            what = "holds an unfinished build of another config or input"
        raise ConfigError(f"output.path: {cfg.output.path} {what}; pass --overwrite")
    resume = state.manifest is None and state.previous == identity and not overwrite
    old = state.marker if resume and state.marker is not None else {"runs": [], "files": []}
    claim = Claim(cfg.output.path, cfg.storage_options, identity, run, (*old["runs"], run))
    create = state.marker is None  # no marker there: make one only if there is still none
    try:
        if not resume and (state.manifest or state.marker or state.leftover):
            clear_build(fs, out, state, claim.marker(sorted(state.recorded()), True), create)
            create = False
        write_marker(fs, out, claim.marker(old["files"]), create)
    except (PermissionError, FileNotFoundError, NotADirectoryError) as err:
        # a read-only folder, a dangling link: the first write says so, in one line
        raise ConfigError(f"output.path: {cfg.output.path}: cannot write there ({err})") from None
    return claim


def refuse_unfinished_remove(fs: Any, out: str, url: str) -> None:
    """A `mmcurate remove` stopped part-way has swapped some files and not yet the manifest: the
    build is neither the one its manifest describes nor the one the remove will leave, and the
    remove's plan is what finishes it. So a rerun of the build refuses instead of taking the
    manifest as it is and dropping that plan with the rest of `_work/` (--overwrite rebuilds)."""
    if with_retries(lambda: fs.exists(join(out, WORK_DIR, remove_file("plan.json")))):
        raise ConfigError(
            f"output.path: {url} has an unfinished `mmcurate remove` "
            f"({WORK_DIR}/{remove_file('plan.json')}); run that remove again to finish it, "
            "or pass --overwrite to build again"
        )


def refuse_foreign(state: OutputState, allowed: bool) -> None:
    """Files no build of ours wrote: refused where a build writes; elsewhere unless allowed."""
    foreign = state.foreign()
    blocking = [name for name in foreign if collides(name)]
    if blocking:
        raise ConfigError(
            f"output.path: {state.url} holds {listing(blocking)}, which no mmcurate build "
            "wrote and a build would overwrite; choose another output.path"
        )
    if foreign and not allowed:
        raise ConfigError(
            f"output.path: {state.url} holds files no mmcurate build wrote ({listing(foreign)}); "
            "choose an empty folder, or set output.allow_other_files: true to write beside "
            "them (they are never deleted)"
        )


def listing(names: list[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def clear_build(fs: Any, out: str, state: OutputState, clearing: dict, create: bool) -> None:
    """Delete a previous build's recorded files, manifest first so no reader sees a half-deleted
    build; its records move to the marker (`clearing`) first, so a crash midway loses track of
    nothing, and a run still writing there finds its claim gone."""
    owned = state.owned()
    write_marker(fs, out, clearing, create)
    if MANIFEST in owned:
        fs.rm_file(join(out, MANIFEST))
    rest = [join(out, name) for name in sorted(owned - {MANIFEST})]
    if rest:
        fs.rm(rest)
    clear_work(fs, out)
    for folder in ("embeddings", "signatures"):
        path = join(out, folder)
        if folder in state.folders and not files_in(fs, path):
            remove_tree(fs, path)  # empty now; on object stores, its folder markers too


def clear_work(fs: Any, out: str) -> None:
    """Everything in _work/ except the marker (ours: the marker says so)."""
    work = join(out, WORK_DIR)
    fs.invalidate_cache(work)
    try:
        entries = fs.ls(work, detail=True)
    except FileNotFoundError:
        return
    for entry in entries:
        path = entry["name"].rstrip("/")
        if relative(path, work) in ("", BUILD_FILE):
            continue
        if entry["type"] == "directory":
            remove_tree(fs, path)
        else:
            fs.rm_file(path)


def drop_work(fs: Any, out: str) -> None:
    """Remove _work/, its marker last: a crash midway never leaves scratch without an owner."""
    clear_work(fs, out)
    remove_tree(fs, join(out, WORK_DIR))


def write_marker(fs: Any, out: str, record: dict, create: bool = False) -> None:
    """`_work/build.json`; with `create`, only where there is none yet (FileExistsError)."""
    write = create_bytes if create else write_bytes_atomic
    write(fs, join(out, WORK_DIR, BUILD_FILE), json.dumps(record).encode())


def record_files(claim: Claim, names: list[str]) -> None:
    """Add `names` (relative to output.path) to the ledger, before the build writes them. (A
    claim taken between the check and the write is overwritten: that run stops at its next.)"""
    marker = claim.check()
    files = sorted({*marker["files"], *names})
    if files != marker["files"]:
        fs, out = filesystem(claim.url, claim.storage_options)
        write_marker(fs, out, claim.marker(files))


def final_files(claim: Claim, expected: list[str]) -> list[str]:
    """Before the manifest, while this run holds the output (else TookOver): the expected
    files that exist (the manifest's record); recorded leftovers that are not among them (temp
    copies of interrupted writes) are deleted."""
    fs, out = filesystem(claim.url, claim.storage_options)
    state = inspect_output(fs, out, claim.url)
    if state.marker is None or state.marker["run"] != claim.run:
        raise claim.lost()
    final = sorted(set(expected) & state.files)
    stale = sorted(state.owned() - set(final) - {MANIFEST})
    if stale:
        fs.rm([join(out, name) for name in stale])
    return final

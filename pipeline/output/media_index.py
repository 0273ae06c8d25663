"""Content-addressed media in phase A (issue 37): a build stores each distinct payload once.

A media member (an image, a video, a frame) whose payload, the bytes its tar member holds,
equals one already in a done partition's candidate tar is not written again: the sample keeps
a reference (that candidate's partition, the payload's offset and size) in its partition's
media file, and phase C copies the payload from there under a header made for the sample's own
key (pipeline/output/shards.py). Within one partition a repeat refers to the earlier member of the
same tar. So a dedupe that drops copies no longer costs their bytes while its decision waits.

The index of stored payloads (digest -> location) lives during phase A: a Ray actor per run,
or on the local runtime a thread of the driver answering on a local socket. A partition
registers its payloads only once it is done (its signatures written): a done partition is
never written again, so a reference never points at a tar a rerun could change. Copies that
are processed at the same time are both stored (the in-flight window). On resume the index
is rebuilt from the done partitions' media files. A failed call is a miss (the payload is
stored again), never a wrong reference.
"""

from __future__ import annotations

import logging
import threading
import uuid
from multiprocessing import AuthenticationError, current_process
from multiprocessing.connection import Client, Listener
from typing import Any

import pyarrow as pa
from mmcurate.core.atomic import write_parquet
from mmcurate.core.spill import Media, media_size
from mmcurate.core.storage import join
from mmcurate.pipeline.output.media_table import (
    ENTRY_BYTES,
    MIN_PAYLOAD,
    Location,
    MediaTable,
    media_name,
)
from mmcurate.pipeline.output.names import part_stem
from mmcurate.pipeline.sources.records import Partition

log = logging.getLogger("mmcurate.build")

MEDIA_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("ext", pa.string()),
        ("digest", pa.binary()),
        ("stored", pa.bool_()),  # True: this tar holds it; False: a reference
        ("part", pa.int64()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("at", pa.int64()),  # a reference's place: bytes of the sample's own span before it
    ]
)


# ---- the local runtime: a driver thread on a unix socket -------------------------------------


class SocketIndex:
    """A task's handle on the driver's MediaTable (plain data: it pickles as its address).
    One connection per call, authenticated with the build's process-tree key."""

    def __init__(self, address: str) -> None:
        self.address = address

    def call(self, op: str, payload: Any) -> Any:
        with Client(self.address, family="AF_UNIX", authkey=current_process().authkey) as conn:
            conn.send((op, payload))
            return conn.recv()

    def lookup(self, digests: list[bytes]) -> list[Location | None]:
        return self.call("lookup", digests)

    def register(self, request: tuple[int, list]) -> int:
        return self.call("register", request)


class IndexServer:
    """Serves a MediaTable to the local pool's workers, one request at a time on a thread."""

    OPS = ("lookup", "register")

    def __init__(self, table: MediaTable) -> None:
        self.table = table
        self.listener = Listener(family="AF_UNIX", authkey=current_process().authkey)
        self.address = str(self.listener.address)
        self.thread = threading.Thread(target=self.serve, daemon=True, name="media-index")
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except AuthenticationError:
                continue  # not one of ours
            except OSError:
                return  # closed
            with conn:
                if not self.answer(conn):
                    return

    def answer(self, conn: Any) -> bool:
        """One request; False for `stop`."""
        try:
            if not conn.poll(60):
                return True  # a client that never asked: drop it, serve the others
            op, payload = conn.recv()
            if op == "stop":
                conn.send(None)
                return False
            conn.send(getattr(self.table, op)(payload) if op in self.OPS else None)
        except (EOFError, OSError, ValueError, TypeError):
            pass  # that client died mid-call; its task runs again
        return True

    def stop(self) -> None:
        SocketIndex(self.address).call("stop", None)
        self.thread.join()
        self.listener.close()


# ---- Ray: one actor per run ------------------------------------------------------------------


class MediaTables:
    """The Ray actor: a MediaTable per run. One actor serves every build of a driver process
    (an actor costs a worker process start, seconds on a busy node)."""

    def __init__(self) -> None:
        self.runs: dict[str, MediaTable] = {}

    def call(self, run: str, op: str, payload: Any, limit: int) -> Any:
        return getattr(self.runs.setdefault(run, MediaTable(limit)), op)(payload)

    def close(self, run: str) -> None:
        self.runs.pop(run, None)


_ACTOR: dict[str, Any] = {}  # Ray job id -> this driver's MediaTables actor


def tables_actor() -> Any:
    """This driver's MediaTables actor, started on first use in this Ray job."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    if job not in _ACTOR:
        _ACTOR.clear()
        remote = ray.remote(num_cpus=0, max_restarts=0)(MediaTables)
        _ACTOR[job] = remote.options(name=f"mmcurate-media-{uuid.uuid4().hex[:16]}").remote()
    return _ACTOR[job]


class RayIndex:
    """A task's handle on its run's table in the MediaTables actor."""

    def __init__(self, actor: Any, run: str, limit: int) -> None:
        self.actor, self.run, self.limit = actor, run, limit

    def call(self, op: str, payload: Any) -> Any:
        import ray

        return ray.get(self.actor.call.remote(self.run, op, payload, self.limit))

    def lookup(self, digests: list[bytes]) -> list[Location | None]:
        return self.call("lookup", digests)

    def register(self, request: tuple[int, list]) -> int:
        return self.call("register", request)


Index = SocketIndex | RayIndex


class RunIndex:
    """The run's index as the driver holds it: `client` goes to the partition tasks (a
    socket address, or the actor's handle), `commit` runs as each task's result arrives."""

    def __init__(self, local: bool, run: str, done: list, limit: int) -> None:
        self.server: IndexServer | None = None
        if local:
            table = MediaTable(limit)
            table.load(done)
            self.server = IndexServer(table)
            self.client: SocketIndex | RayIndex = SocketIndex(self.server.address)
            return
        self.client = RayIndex(tables_actor(), run, limit)
        for at in range(0, len(done), 100_000):
            self.client.call("load", done[at : at + 100_000])

    def commit(self, part: int) -> None:
        if self.server is not None:
            self.server.table.commit([part])
            return
        try:
            self.client.call("commit", [part])
        # Why broad: a commit that fails only means later copies of its payloads are stored.
        except Exception as err:  # noqa: BLE001
            log.warning("media index commit failed (%s: %s)", type(err).__name__, err)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        elif isinstance(self.client, RayIndex):
            self.client.actor.close.remote(self.client.run)  # the actor serves the next build


def safe_call(index: Index | None, op: str, payload: Any, missed: Any) -> Any:
    """`index.op(payload)`; `missed` when the index cannot answer (stored again, never wrong)."""
    if index is None:
        return missed
    try:
        return getattr(index, op)(payload)
    # Why broad: the index only saves bytes; any failure of it means "store the payload".
    except Exception as err:  # noqa: BLE001
        log.warning("media index %s failed (%s: %s); payloads stored", op, type(err).__name__, err)
        return missed


# ---- one partition's payloads while its candidate is written ---------------------------------


class PartitionMedia:
    """What a partition's candidate holds and refers to: the digests of its media members,
    looked up once per chunk; stored payloads registered once the partition is done."""

    def __init__(self, part: int, index: Index | None) -> None:
        self.part, self.index = part, index
        self.own: dict[bytes, Location] = {}  # payloads this tar holds
        self.rows: list[dict[str, Any]] = []  # the media file
        self.refers: set[int] = set()  # other partitions referred to

    def look_up(self, digests: list[bytes]) -> dict[bytes, Location]:
        """Stored payloads elsewhere among `digests` (one call for a chunk)."""
        wanted = [d for d in dict.fromkeys(digests) if d not in self.own]
        if not wanted:
            return {}
        found = safe_call(self.index, "lookup", wanted, [None] * len(wanted))
        return {d: loc for d, loc in zip(wanted, found, strict=True) if loc is not None}

    def place(self, digest: bytes, size: int, found: dict) -> Location | None:
        """Where a payload already is (this tar first), or None: write it."""
        loc = self.own.get(digest) or found.get(digest)
        return loc if loc is not None and loc[2] == size else None

    def stored(self, key: str, ext: str, digest: bytes, offset: int, size: int) -> None:
        self.own[digest] = (self.part, offset, size)
        self.rows.append(media_row(key, ext, digest, True, (self.part, offset, size), None))

    def referred(self, key: str, ext: str, digest: bytes, loc: Location, at: int) -> None:
        if loc[0] != self.part:
            self.refers.add(loc[0])
        self.rows.append(media_row(key, ext, digest, False, loc, at))

    def summary(self) -> dict[str, Any]:
        """For the partition's done marker: whether it wrote a media file, whom it refers to."""
        refs = sum(1 for row in self.rows if not row["stored"])
        return {"media": bool(self.rows), "media_refs": refs, "refers": sorted(self.refers)}

    def write(self, url: str, storage_options: dict) -> None:
        if self.rows:
            write_parquet(pa.Table.from_pylist(self.rows, MEDIA_SCHEMA), url, storage_options)

    def register(self) -> None:
        """The stored payloads, pending until the driver commits this partition."""
        entries = [(d, *loc) for d, loc in self.own.items()]
        safe_call(self.index, "register", (self.part, entries), 0)


def media_row(
    key: str, ext: str, digest: bytes, stored: bool, loc: Location, at: int | None
) -> dict[str, Any]:
    return dict(zip(MEDIA_SCHEMA.names, (key, ext, digest, stored, *loc, at), strict=True))


def addressed(data: Media) -> bool:
    return media_size(data) >= MIN_PAYLOAD


def committed_payloads(
    candidates_url: str, parts: list[int], storage_options: dict
) -> list[tuple[bytes, int, int, int]]:
    """The stored payloads of done partitions (their media files): the index on resume."""
    from mmcurate.pipeline.output.groups import read_parquet

    entries = []
    for part in parts:
        try:
            table = read_parquet(join(candidates_url, media_name(part)), storage_options)
        except FileNotFoundError:
            continue
        for row in table.filter(table["stored"]).to_pylist():
            entries.append((row["digest"], row["part"], row["offset"], row["size"]))
    return entries


def start_run_index(
    claim: Any, done: set[int], todo: list[dict], output: Any, local: bool
) -> RunIndex | None:
    """The index for this run's phase A (`output`: the build's OutputConfig), holding the done
    partitions' payloads; None when it is off or nothing is left to do. In this process when
    the local pool is the runtime (`local`)."""
    if not output.store_copies_once or not todo:
        return None
    from mmcurate.pipeline.output.markers import done_records

    records = done_records(claim, "parts")
    with_media = sorted(p for p in done if records.get(part_stem(p), {}).get("media"))
    payloads = committed_payloads(
        join(claim.work_url, "candidates"), with_media, claim.storage_options
    )
    limit = output.copies_index_bytes // ENTRY_BYTES
    return RunIndex(local, claim.run, payloads, limit)


def partition_done(
    index: int, result: Any, run_index: RunIndex | None, todo: list[Partition]
) -> None:
    """A partition task's result arrived (`run_tasks`' on_result): its payloads go live."""
    if run_index is not None and result is not None:
        run_index.commit(todo[index].number)


def finish_partition(
    media: PartitionMedia | None, folder: str, storage_options: dict
) -> dict[str, Any]:
    """Write the partition's media file (before its marker); what the marker records."""
    if media is None:
        return {}
    media.write(join(folder, media_name(media.part)), storage_options)
    return media.summary()

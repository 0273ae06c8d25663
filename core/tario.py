"""Reading and writing WebDataset tar shards: pure helpers over file objects.

Members are `<key>.<ext>`; a sample is the run of consecutive members sharing a key. Written
tars are deterministic (sorted extensions, zero mtimes and owners) so a rerun is byte-identical.

Keys (`safe_key`) are ASCII letters, digits, `_` and `-`, at most KEY_MAX_BYTES long: readers
split member names at the first dot, and a name that is not ASCII or is over 100 bytes gets a
PAX header, which some readers (wids' index) do not understand. So every member name fits the
plain ustar name field and the tars carry no PAX headers at all.
"""

from __future__ import annotations

import collections
import hashlib
import re
import tarfile
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import IO, Any

from mmcurate.core.spill import Spilled, spill_stream
from mmcurate.core.tar_writer import (
    BLOCK,
    USTAR_NAME_BYTES,
)

EXT_ALIASES = {"jpeg": "jpg", "tif": "tiff"}

LONGEST_SUFFIX = ".000.jpg"  # the longest member extension written (video frames)
CLIP_SUFFIX = "_0000"  # clip_split appends this to its source key
# Room left for one more derived suffix of the same size, should a stage add one.
KEY_MAX_BYTES = USTAR_NAME_BYTES - len(LONGEST_SUFFIX) - 2 * len(CLIP_SUFFIX) - 2  # 80
KEY_HASH_HEX = 12  # 48 bits of SHA-256: collisions need ~16M names sharing a readable prefix
CLEAN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def safe_key(name: str) -> str:
    """A member key for a source name: the name itself when it is already clean (ASCII letters,
    digits, `_`, `-`; 1 to KEY_MAX_BYTES long), else its readable ASCII form (accents dropped,
    other characters as `_`, cut short) plus `_` and a hash of the whole name. Pure, so keys
    are the same on every rerun; different names get different keys."""
    if CLEAN_KEY.fullmatch(name) and len(name) <= KEY_MAX_BYTES:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:KEY_HASH_HEX]
    plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", plain).strip("_")
    readable = readable[: KEY_MAX_BYTES - KEY_HASH_HEX - 1].rstrip("_")
    return f"{readable}_{digest}" if readable else digest


def text_name(name: str) -> str:
    """A path or name as valid UTF-8 text: undecodable bytes of local file names (Python's
    surrogate escapes) become `\\udcXX`, so they can go into JSON members and parquet."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def split_member_name(name: str) -> tuple[str, str]:
    """`dir/abc.def.jpg` -> (`dir/abc`, `def.jpg`): WebDataset's key/extension rule."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{folder}/{stem}" if folder else stem
    return key, ext.lower() if dot else ""


# A sample's extensions whose members had no data to read: symlinks, hard links (tarfile's
# stream mode cannot go back to their target), devices, FIFOs. Only with `links=True`.
LINKS = "__links__"
Member = tuple[str, Callable[[], bytes | Spilled] | None]


@dataclass(frozen=True)
class SpillTo:
    """Where big members go as they are read: one whose extension is in `columns` and that
    holds more than `over` bytes is streamed into `folder` and read as a `Spilled` (its file
    then belongs to the caller, who releases it)."""

    folder: str
    over: int
    columns: frozenset[str]

    def wants(self, name: str, size: int) -> bool:
        ext = split_member_name(name)[1]
        return size > self.over and EXT_ALIASES.get(ext, ext) in self.columns


def iter_tar_samples(
    fileobj: IO[bytes],
    start: int = 0,
    stop: int | None = None,
    links: bool = False,
    spill: SpillTo | None = None,
    columns: frozenset[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Stream samples [start, stop) from a tar: dicts of `__key__` plus raw bytes per
    extension (a Spilled for a member `spill` wants). Earlier samples are skipped without
    keeping their data; reading ends at `stop`. Members that are not files are skipped, as
    WebDataset does; with `links`, those that are not folders are listed under LINKS in their
    sample (a sample of such members only, too). With `columns`, members of other extensions
    are passed over unread (a report that wants images need not hold a video)."""
    return group_samples(tar_files(fileobj, links, spill), start, stop, columns)


def group_samples(
    files: Iterator[Member],
    start: int = 0,
    stop: int | None = None,
    columns: frozenset[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples [start, stop) of a tar's (name, read) members: runs of one key. A member whose
    extension the run already has starts another sample of the same key (two samples written
    back to back under one key), which a build then counts as a duplicate_key, instead of
    its bytes silently replacing the first's. A member without `read` (a link) goes to LINKS."""
    index, key, seen, current = -1, None, set(), None
    for member, read in files:
        name, ext = split_member_name(member)
        ext = EXT_ALIASES.get(ext, ext)
        if name != key or ext in seen:
            if current is not None:
                yield current
            index, key, seen, current = index + 1, name, set(), None
            if stop is not None and index >= stop:
                return
            if index >= start:
                current = {"__key__": name}
        seen.add(ext)
        if current is not None and read is None:
            current.setdefault(LINKS, []).append(ext)
        elif current is not None and (columns is None or ext in columns):
            current[ext] = read()
    if current is not None:
        yield current


def tar_files(
    fileobj: IO[bytes], links: bool = False, spill: SpillTo | None = None
) -> Iterator[Member]:
    """(name, read) of each regular file of a tar, in order, as tarfile's stream mode gives
    them: `read()` returns the member's bytes and is valid until the next member is drawn.
    With `links`, also (name, None) for each member that is neither a file nor a folder.

    Why not tarfile for all of it: at ~0.05 ms a member its headers cost a loader worker 6-8%
    of a sample's work. A regular file's header is read here with tarfile's own field parsers
    (`regular_member`); from the first header that is anything else (PAX, GNU long names, a
    link, a folder, a compressed stream, the end, damage) tarfile reads the rest, so each tar
    reads exactly as through tarfile, errors included - and one more: a tar whose data ends
    inside a header past the first member fails with tarfile's ReadError("unexpected end of
    data") where tarfile ends quietly. A member `spill` wants is streamed to its folder."""
    at_start = True
    while True:
        header = fileobj.read(BLOCK)
        if 0 < len(header) < BLOCK:  # a stream may return fewer bytes than asked (HTTP)
            header += b"".join(read_up_to(fileobj, BLOCK - len(header)))
        if 0 < len(header) < BLOCK and not at_start:
            raise tarfile.ReadError(CUT_HEADER)
        member = None if at_start and header.startswith(COMPRESSED) else regular_member(header)
        if member is None:
            yield from library_files(header, fileobj, at_start, links, spill)
            return
        at_start = False
        name, size = member
        kept: list[bytes | Spilled] = []
        to = spill if spill is not None and spill.wants(name, size) else None

        def read(size: int = size, kept: list = kept, to: SpillTo | None = to) -> bytes | Spilled:
            if not kept:
                kept.append(read_exact(fileobj, size) if to is None else spilled(fileobj, size, to))
            return kept[0]

        yield name, read
        skip_exact(fileobj, (0 if kept else size) + -size % BLOCK)  # the rest, then padding


# A header cut short by the end of the data, past the first member: the tar was truncated
# (tarfile ends there without a word; the samples after it would be lost unseen).
CUT_HEADER = "unexpected end of data"
# What tarfile's "r|*" takes for gzip, bzip2 and xz/lzma streams (it checks bzip2's further)
COMPRESSED = (b"\x1f\x8b\x08", b"BZh", b"\x5d\x00\x00\x80", b"\xfd7zXZ")
_NUMBER_FIELDS = ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345))


def regular_member(header: bytes) -> tuple[str, int] | None:
    """(name, size) when `header` is a regular file's, read as tarfile reads it; None for every
    other header (which tarfile then reads, or rejects as it always did)."""
    kind = header[156:157]
    if len(header) != BLOCK or kind not in (b"0", b"\x00"):
        return None
    try:
        # The checksum counts its own field as 8 spaces. (tarfile also accepts a sum of signed
        # bytes, from old tars: such a header is left to it.)
        if tarfile.nti(header[148:156]) != sum(header) - sum(header[148:156]) + 8 * 0x20:
            return None
        size = tarfile.nti(header[124:136])
        for begin, end in _NUMBER_FIELDS:  # mode, ids, mtime, devices: tarfile rejects non-numbers
            tarfile.nti(header[begin:end])
    except tarfile.HeaderError:
        return None
    name = tarfile.nts(header[:100], tarfile.ENCODING, "surrogateescape")
    if size < 0 or (kind == b"\x00" and name.endswith("/")):  # a v7 tar's folder
        return None
    prefix = tarfile.nts(header[345:500], tarfile.ENCODING, "surrogateescape")
    return (f"{prefix}/{name}" if prefix else name), size


READ_CHUNK = 1 << 20  # bytes a read asks for: a damaged size never makes one huge buffer


def read_exact(fileobj: IO[bytes], size: int) -> bytes:
    """`size` bytes, or tarfile's ReadError where the tar ends first (as tarfile does for a
    member or its padding cut short)."""
    data = fileobj.read(size) if 0 < size <= READ_CHUNK else b""
    if len(data) == size:
        return data
    chunks = [data, *read_up_to(fileobj, size - len(data))]
    if sum(map(len, chunks)) < size:
        raise tarfile.ReadError("unexpected end of data")
    return b"".join(chunks)


def spilled(fileobj: IO[bytes], size: int, to: SpillTo) -> Spilled:
    """`size` bytes streamed into a file of `to.folder`; tarfile's ReadError where the tar
    ends first (as `read_exact`)."""
    try:
        return spill_stream(fileobj, size, to.folder)
    except EOFError:
        raise tarfile.ReadError("unexpected end of data") from None


def skip_exact(fileobj: IO[bytes], size: int) -> None:
    """Read past `size` bytes (kept nowhere); ReadError where the tar ends first."""
    while size > 0:
        chunk = fileobj.read(min(size, READ_CHUNK))
        if not chunk:
            raise tarfile.ReadError("unexpected end of data")
        size -= len(chunk)


def read_up_to(fileobj: IO[bytes], size: int) -> list[bytes]:
    """Up to `size` bytes in chunks, asking again after a short read; fewer at the end."""
    chunks = []
    while size > 0 and (chunk := fileobj.read(min(size, READ_CHUNK))):
        chunks.append(chunk)
        size -= len(chunk)
    return chunks


def library_files(
    header: bytes,
    rest: IO[bytes],
    at_start: bool,
    links: bool = False,
    spill: SpillTo | None = None,
) -> Iterator[Member]:
    """`tar_files` from `header` on, read by tarfile. Past the first member tarfile ends an
    archive at any header it cannot read and fails only on a broken extension record; the
    same here, except that only a zero block (or the end of the data at a block boundary)
    ends it: a damaged header or one cut short fails with tarfile's ReadError, where tarfile
    took it as the end of the archive and the samples after it were lost unseen."""
    if not at_start and ends_archive(header):
        return
    stream = Recorded(Replayed(header, rest))
    try:
        tar = tarfile.open(fileobj=stream, mode="r|*" if at_start else "r|")
    except tarfile.ReadError as err:  # tarfile read the header as the first of a new stream
        if at_start or isinstance(err.__context__, tarfile.SubsequentHeaderError):
            raise
        return
    with tar:
        for member in tar:
            if member.isfile() and spill is not None and spill.wants(member.name, member.size):
                data = tar.extractfile(member)
                yield member.name, partial(spilled, data, member.size, spill)
            elif member.isfile():
                yield member.name, tar.extractfile(member).read
            elif links and not member.isdir():
                yield member.name, None
        if not (at_start and header.startswith(COMPRESSED)):  # positions are the file's
            check_last_header(stream, tar.offset, tar.fileobj.tell() - tar.offset)


def check_last_header(stream: Recorded, offset: int, read: int) -> None:
    """ReadError where the header tarfile stopped at (`read` bytes of it at `offset`) was
    cut short or damaged; nothing for a zero block or the end of the data."""
    if 0 < read < BLOCK:
        raise tarfile.ReadError(CUT_HEADER)
    block = stream.block(offset) if read == BLOCK else None
    if block is not None:
        ends_archive(block)


def ends_archive(block: bytes) -> bool:
    """True for a zero block or no data (the end of an archive), False for a valid header;
    tarfile's ReadError for a damaged one."""
    try:
        tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except (tarfile.EOFHeaderError, tarfile.EmptyHeaderError):
        return True
    except tarfile.HeaderError as err:
        raise tarfile.ReadError(str(err)) from None
    return False


class Recorded:
    """A stream that keeps the last bytes it gave (tarfile reads ahead, a record at a time):
    enough to look again at the header where tarfile stopped."""

    KEEP = 4 * tarfile.RECORDSIZE

    def __init__(self, stream: IO[bytes] | Replayed) -> None:
        self.stream, self.given = stream, 0
        self.kept: collections.deque[tuple[int, bytes]] = collections.deque()
        self.kept_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        if data:
            self.kept.append((self.given, data))
            self.given += len(data)
            self.kept_bytes += len(data)
            while self.kept_bytes - len(self.kept[0][1]) >= self.KEEP:
                self.kept_bytes -= len(self.kept.popleft()[1])
        return data

    def block(self, offset: int) -> bytes | None:
        """The BLOCK bytes at `offset`, if all of them are still kept."""
        if not self.kept or offset < self.kept[0][0]:
            return None
        data = b"".join(chunk for at, chunk in self.kept if at + len(chunk) > offset)
        start = offset - next(at for at, chunk in self.kept if at + len(chunk) > offset)
        return data[start : start + BLOCK] if len(data) - start >= BLOCK else None


class Replayed:
    """A stream that gives `head` again before the rest of `rest` (for tarfile, from a header
    already read)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(size)
        if size < 0:
            size = len(self.head) + len(more := self.rest.read())
            self.head += more
        out, self.head = self.head[:size], self.head[size:]
        return out + (self.rest.read(size - len(out)) if len(out) < size else b"")

"""`iter_tar_samples` reads every tar exactly as tarfile's stream mode does: the same samples,
and the same error (type and message) at the same point, for plain tars and every other kind
(PAX, GNU, v7, links, folders, gzip) and for damaged ones (cut near every block boundary, bytes
changed). One difference, on purpose: past the first member, a header cut short by the end of
the data is ReadError("unexpected end of data") and a damaged one ReadError with tarfile's own
header error, where tarfile ends the archive quietly; only a zero block ends it."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest
from mmcurate.core.tar_writer import write_tar
from mmcurate.core.tario import group_samples, iter_tar_samples


def tarfile_samples(
    fileobj: Any, start: int = 0, stop: int | None = None
) -> Iterator[dict[str, Any]]:
    """The reader as it was before the fast path: tarfile's stream mode for every member."""
    return group_samples(tarfile_files(fileobj), start, stop)


def tarfile_files(fileobj: Any) -> Iterator[tuple[str, Any]]:
    raw = (fileobj if isinstance(fileobj, io.BytesIO) else fileobj.raw).getvalue()
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for member in tar:
            if member.isfile():
                yield member.name, tar.extractfile(member).read
        if raw.startswith(b"\x1f\x8b"):
            return  # gzip: tarfile's positions are not the file's
        read = tar.fileobj.tell() - tar.offset  # the one difference: where tarfile stopped
        if 0 < read < tarfile.BLOCKSIZE:
            raise tarfile.ReadError("unexpected end of data")
        block = raw[tar.offset : tar.offset + tarfile.BLOCKSIZE]
        if read == tarfile.BLOCKSIZE and block.count(0) != tarfile.BLOCKSIZE:
            try:
                tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
            except tarfile.HeaderError as err:
                raise tarfile.ReadError(str(err)) from None


class ShortReads:
    """A stream that arrives in `most`-byte pieces: a read returns at most what is left of
    the current piece (as an HTTP stream returns what has arrived). Not seekable."""

    def __init__(self, raw: bytes, most: int) -> None:
        self.raw, self.most, self.left = io.BytesIO(raw), most, 0

    def read(self, size: int = -1) -> bytes:
        self.left = self.left or self.most
        data = self.raw.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        return data


def outcome(
    reader: Any, raw: bytes, start: int = 0, stop: int | None = None, most: int = 0
) -> tuple:
    """(samples read before the end or the error, the error's type and text or None)."""
    got: list[dict] = []
    stream = ShortReads(raw, most) if most else io.BytesIO(raw)
    try:
        for sample in reader(stream, start, stop):
            got.append(sample)
    except Exception as err:  # noqa: BLE001 - compared as data
        return got, (type(err).__name__, str(err))
    return got, None


def assert_same(raw: bytes, start: int = 0, stop: int | None = None) -> tuple:
    expected = outcome(tarfile_samples, raw, start, stop)
    assert outcome(iter_tar_samples, raw, start, stop) == expected
    for most in (7, 700):  # and through streams that return fewer bytes than asked
        assert outcome(iter_tar_samples, raw, start, stop, most) == expected
    return expected


def samples(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"__key__": f"s{i:03d}", "jpg": rng.randbytes(rng.randrange(0, 1500)), "txt": b"a cat"}
        for i in range(n)
    ]


def ours(n: int = 4) -> bytes:
    out = io.BytesIO()
    write_tar(samples(n), out)
    return out.getvalue()


def library_tar(fmt: int, names: list[str], extra: Any = None) -> bytes:
    """A tar written by tarfile in `fmt`, one member per name (`extra` adds others)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for i, name in enumerate(names):
            data = f"member {i} {name}".encode() * (i + 1)
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000 + i
            tar.addfile(info, io.BytesIO(data))
            if extra is not None:
                extra(tar, i)
    return out.getvalue()


LONG = "d" * 60 + "/" + "e" * 70 + "/k1.jpg"  # ustar splits it into prefix and name
NAMES = ["k0.jpg", "k0.txt", LONG, "k2.jpg", "ключ.txt", "k3." + "x" * 120, "k4.json"]


def with_links(tar: tarfile.TarFile, i: int) -> None:
    folder = tarfile.TarInfo(f"dir{i}")
    folder.type = tarfile.DIRTYPE
    link = tarfile.TarInfo(f"k{i}.lnk")
    link.type, link.linkname = tarfile.SYMTYPE, "k0.jpg"
    tar.addfile(folder)
    tar.addfile(link)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_library_tars_read_the_same(fmt):
    fits = [n for n in NAMES if n.isascii() and len(n.rpartition("/")[2]) < 100]  # ustar's limit
    names = fits if fmt == tarfile.USTAR_FORMAT else NAMES
    for raw in (library_tar(fmt, names), library_tar(fmt, names, with_links)):
        got, error = assert_same(raw)
        assert error is None and len(got) >= 4
        assert assert_same(raw, 1, 3)[0] == got[1:3]


def test_our_tars_read_the_same_and_start_stop_pick_samples():
    raw = ours(6)
    got, error = assert_same(raw)
    assert error is None
    assert [s["__key__"] for s in got] == [f"s{i:03d}" for i in range(6)]
    assert got == samples(6)
    for start, stop in ((0, 0), (2, None), (2, 4), (5, 9), (7, None)):
        assert assert_same(raw, start, stop)[0] == got[start:stop]


def test_gzip_and_empty_and_end_only_tars_read_the_same():
    assert assert_same(gzip.compress(ours(3)))[0] == samples(3)
    assert assert_same(b"")[1] == ("ReadError", "empty file")
    assert assert_same(bytes(1024)) == ([], None)
    assert assert_same(b"not a tar at all" * 64)[1] is not None


@pytest.mark.parametrize("kind", ["ours", "pax", "gnu"])
def test_a_tar_cut_at_any_length_reads_the_same(kind):
    raw = {
        "ours": ours(3),
        "pax": library_tar(tarfile.PAX_FORMAT, NAMES[:5]),
        "gnu": library_tar(tarfile.GNU_FORMAT, NAMES),
    }[kind]
    errors = set()
    near_blocks = {b + d for b in range(0, len(raw) + 1, 512) for d in (-1, 0, 1, 100, 137)}
    for cut in sorted({c for c in near_blocks if 0 <= c <= len(raw)} | set(range(0, len(raw), 53))):
        errors.add(assert_same(raw[:cut])[1])
        assert_same(raw[:cut], 1, 2)
    assert ("ReadError", "unexpected end of data") in errors  # the cuts did reach damage


def test_changed_bytes_read_the_same():
    """Random changes, most in headers (damaged checksums, sizes, types, names, zero blocks)."""
    rng = random.Random(7)
    bases = [
        ours(4),
        library_tar(tarfile.PAX_FORMAT, NAMES),
        library_tar(tarfile.GNU_FORMAT, NAMES),
    ]
    outcomes = set()
    for trial in range(1500):
        raw = bytearray(rng.choice(bases))
        headers = [o for o in range(0, len(raw), 512) if raw[o + 257 : o + 262] == b"ustar"]
        for _ in range(rng.randrange(1, 4)):
            if rng.random() < 0.8 and headers:
                where = rng.choice(headers) + rng.choice(
                    [0, 5, 99, 100, 124, 130, 135, 148, 150, 156, 257, 345, 400, rng.randrange(512)]
                )
            else:
                where = rng.randrange(len(raw))
            raw[where] = rng.choice(
                [0, 0x20, ord("0"), ord("7"), ord("x"), ord("L"), 0x80, 0xFF, rng.randrange(256)]
            )
        if trial % 10 == 0 and headers:  # the checksum made right again: other fields damaged
            head = rng.choice(headers)
            raw[head + 148 : head + 156] = b"        "
            raw[head + 148 : head + 156] = b"%06o\x00 " % sum(raw[head : head + 512])
        got, error = assert_same(bytes(raw))
        assert_same(bytes(raw), 1, 3)
        outcomes.add(error[0] if error else "ok")
    assert {"ok", "ReadError"} <= outcomes


def test_a_member_named_like_a_folder_and_a_v7_tar_read_the_same():
    raw = bytearray(ours(2))
    raw[0:100] = b"s000/".ljust(100, b"\x00")  # a v7 folder: type NUL, name ending in "/"
    raw[156] = 0
    raw[148:156] = b"        "
    raw[148:156] = b"%06o\x00 " % sum(raw[0:512])
    # A folder's size is not skipped: the member's data then reads as a damaged header
    assert assert_same(bytes(raw))[1] == ("ReadError", "invalid header")
    v7 = library_tar(tarfile.USTAR_FORMAT, ["k0.jpg", "k1.jpg"])
    v7 = bytearray(v7)
    for head in (0, 1024):
        v7[head + 257 : head + 265] = bytes(8)  # no magic, as a v7 tar
        v7[head + 148 : head + 156] = b"        "
        v7[head + 148 : head + 156] = b"%06o\x00 " % sum(v7[head : head + 512])
    assert len(assert_same(bytes(v7))[0]) == 2


def test_a_broken_extension_record_after_the_first_member_reads_the_same():
    """Past the first member tarfile ends the archive at a PAX record it cannot parse (and
    fails on one cut short); the fast path hands that header to tarfile and must agree."""
    raw = library_tar(tarfile.PAX_FORMAT, ["k0.jpg", "ключ.txt", "k2.jpg"])
    record = raw.index(b" path=")
    for damage in (b"x", b"00", b"9", b"\x00", b"99999"):  # "00": a zero length, refused
        broken = raw[: record - 2] + damage + raw[record - 2 + len(damage) :]
        got, error = assert_same(broken)
        assert [s["__key__"] for s in got][:1] == ["k0"]


def test_a_damaged_size_too_large_to_hold_fails_as_a_tar_error():
    """A base-256 size of 2**70 with a valid checksum: tarfile's reader failed (or, skipping
    it, read on forever); here a ReadError either way, never an OverflowError or a hang."""
    raw = bytearray(ours(3))
    second = next(o for o in range(512, len(raw), 512) if raw[o : o + 4] == b"s000")  # .txt
    raw[second + 124 : second + 136] = b"\x80" + (2**70).to_bytes(11, "big")
    raw[second + 148 : second + 156] = b"        "
    raw[second + 148 : second + 156] = b"%06o\x00 " % sum(raw[second : second + 512])
    for start in (0, 1):
        assert outcome(iter_tar_samples, bytes(raw), start)[1] == (
            "ReadError",
            "unexpected end of data",
        )


def test_a_first_name_that_looks_compressed_reads_the_same():
    for magic in (b"BZh91AY&SY", b"\x1f\x8b\x08", b"\xfd7zXZ"):
        raw = bytearray(ours(2))
        raw[0 : len(magic)] = magic
        raw[148:156] = b"        "
        raw[148:156] = b"%06o\x00 " % sum(raw[0:512])
        assert_same(bytes(raw))


@pytest.mark.parametrize("kind", ["ours", "pax"])
def test_a_tar_cut_inside_a_later_header_fails_instead_of_ending_quietly(kind):
    """tarfile takes a header cut short as the end of the archive: a shard cut there read as
    a shorter, valid one and the samples after the cut were lost without a count."""
    raw = ours(4) if kind == "ours" else library_tar(tarfile.PAX_FORMAT, NAMES[:5])
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        third = tar.getmembers()[2].offset  # a header past the first member
    for cut in (third + 1, third + 100, third + 511):
        quiet = outcome(lambda f, a, b: group_samples(plain_tarfile(f), a, b), raw[:cut])
        assert quiet[1] is None  # what tarfile does
        got, error = assert_same(raw[:cut])
        assert error == ("ReadError", "unexpected end of data") and got == quiet[0][:-1]
    assert assert_same(raw[:third])[1] is None  # cut between members: nothing says it was cut


def plain_tarfile(fileobj: Any) -> Iterator[tuple[str, Any]]:
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for member in tar:
            if member.isfile():
                yield member.name, tar.extractfile(member).read


def test_a_damaged_later_header_fails_instead_of_ending_quietly():
    """A header whose checksum no longer matches (one byte of its size changed), past the
    first member: tarfile ends the archive there, and samples s001-s003 were lost uncounted."""
    raw = bytearray(ours(4))
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tar:
        third = tar.getmembers()[2].offset
    raw[third + 130] ^= 0x01
    quiet = outcome(lambda f, a, b: group_samples(plain_tarfile(f), a, b), bytes(raw))
    assert quiet == ([samples(4)[0]], None)  # what tarfile does
    got, error = assert_same(bytes(raw))
    assert got == [] and error == ("ReadError", "bad checksum")


def test_a_key_written_twice_in_a_row_reads_as_two_samples():
    """Two samples back to back under one key: the second's members used to replace the
    first's (a mix of the two); now each is a sample, and a build counts the duplicate."""
    twice = [{"__key__": "k", "jpg": b"first", "txt": b"one"}, {"__key__": "k", "jpg": b"2nd"}]
    out = io.BytesIO()
    write_tar([*twice, {"__key__": "z", "txt": b"last"}], out)
    got, error = assert_same(out.getvalue())
    assert error is None
    assert got == [*twice, {"__key__": "z", "txt": b"last"}]

"""core/tario's tar writer: byte for byte what Python's tarfile writes, read back by tarfile."""

from __future__ import annotations

import io
import json
import random
import tarfile

import pytest
from mmcurate.core.tar_writer import member_header, sample_members, write_tar
from mmcurate.core.tario import iter_tar_samples


def tarfile_bytes(samples: list[dict], prefix: bytes = b"") -> tuple[bytes, list[tuple[int, int]]]:
    """The reference: the same members through tarfile (PAX format, mode 0o444, mtime 0),
    written after `prefix`."""
    out, spans = io.BytesIO(), []
    out.write(prefix)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for sample in samples:
            start = tar.offset
            for name, data in sample_members(sample):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o444, 0
                tar.addfile(info, io.BytesIO(data))
            spans.append((start, tar.offset - start))
    return out.getvalue(), spans


def random_samples(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        size = rng.choice([0, 1, 511, 512, 513, 1024, rng.randrange(100_000)])
        key = rng.choice([f"{i:09d}", "k" * 80, f"a-b_{i}", "ü" * 10, "x" * 120])
        sample = {"__key__": f"{key}{i}", "jpg": rng.randbytes(size)}
        if rng.random() < 0.7:
            sample["txt"] = "caption é " * rng.randrange(4)
        if rng.random() < 0.5:
            sample["json"] = json.dumps({"i": i})
        samples.append(sample)
    return samples


@pytest.mark.parametrize("n", [0, 1, 3, 40])
def test_write_tar_is_byte_identical_to_tarfile_and_spans_match(n):
    samples = random_samples(seed=n, n=n)
    out = io.BytesIO()
    spans = write_tar(samples, out)
    assert (out.getvalue(), spans) == tarfile_bytes(samples)
    assert len(out.getvalue()) % tarfile.RECORDSIZE == 0


def test_written_tar_reads_back_with_tarfile_and_our_reader():
    samples = random_samples(seed=7, n=25)
    out = io.BytesIO()
    spans = write_tar(samples, out)
    data = out.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    expected = {name: blob for s in samples for name, blob in sample_members(s)}
    assert members == expected
    assert [s["__key__"] for s in iter_tar_samples(io.BytesIO(data))] == [
        s["__key__"] for s in samples
    ]
    # Each span is a whole sample: copied out on its own, it is a readable tar.
    start, length = spans[3]
    alone = data[start : start + length] + b"\0" * 1024
    assert [s["__key__"] for s in iter_tar_samples(io.BytesIO(alone))] == [samples[3]["__key__"]]


def test_header_fields_of_a_plain_member():
    header = member_header("abc.jpg", 1234)
    assert len(header) == 512
    info = tarfile.TarInfo.frombuf(header, tarfile.ENCODING, "surrogateescape")
    assert (info.name, info.size, info.mode, info.mtime, info.type) == (
        "abc.jpg",
        1234,
        0o444,
        0,
        tarfile.REGTYPE,
    )
    assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")


def test_names_that_do_not_fit_ustar_get_a_pax_record():
    for name in ("é.txt", "n" * 101 + ".txt"):
        header = member_header(name, 5)
        assert header[156:157] == b"x"  # a PAX extended header comes first
        data = header + b"hello" + b"\0" * (507 + 1024)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert [(m.name, tar.extractfile(m).read()) for m in tar] == [(name, b"hello")]


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("n" * 96 + ".jpg", 0),  # exactly 100 bytes: the plain name field, no NUL after it
        ("n" * 97 + ".jpg", 1),  # 101: a PAX record
        ("a.txt", 8**11 - 1),  # the largest size the octal field holds
        ("a.txt", 8**11),  # one more: the size goes into a PAX record
        ("x/" + "y" * 98, 7),
        ("nul\x00.txt", 3),
    ],
)
def test_member_header_equals_tarfile_at_the_edges(name, size):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, 0
    assert member_header(name, size) == info.tobuf(
        tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"
    )


def test_spans_are_positions_in_the_file_as_with_tarfile():
    samples = random_samples(seed=3, n=4)
    out = io.BytesIO()
    out.write(b"abc")
    spans = write_tar(samples, out)
    assert spans[0][0] == 3 and (out.getvalue(), spans) == tarfile_bytes(samples, b"abc")

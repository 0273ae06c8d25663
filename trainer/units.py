"""Byte sizes as users write them in configs ("10GB", "512MiB"): one parser for every section
(train, eval, probe), in a leaf module so config models anywhere can use it."""

from __future__ import annotations

import re

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
MAX_SIZE = 2**63  # bytes (exclusive)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """`"10GB"` -> 10_000_000_000; decimal (KB, MB, ...) and binary (KiB, MiB, ...) units."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size like '10GB' or '512MiB': {text!r}")
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    # Why a bound: 400 digits parse as inf (int() of it raises OverflowError), and sizes past
    # 2**63 overflow the C types they end in (RLIMIT_AS, file offsets).
    if not size < MAX_SIZE:
        raise ValueError(f"too large a size: {text!r} (at most 9EB)")
    return int(size)

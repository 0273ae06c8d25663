"""Awkward names for key tests: a JPEG, a folder of oddly named files, tars written and walked."""

import io
import tarfile
from pathlib import Path

from PIL import Image


def jpeg(colour: str = "red", size: int = 24) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(out, "JPEG")
    return out.getvalue()


def raw_headers(data: bytes) -> list[tuple[str, bytes]]:
    """(name field, typeflag) of every header block, walking the tar by hand."""
    out, offset = [], 0
    while offset + 512 <= len(data) and data[offset : offset + 512].strip(b"\0"):
        block = data[offset : offset + 512]
        name = block[:100].rstrip(b"\0").decode("ascii")
        size = int(block[124:136].strip(b"\0 ") or b"0", 8)
        out.append((name, block[156:157]))
        offset += 512 + -(-size // 512) * 512
    return out


def make_awkward_folder(root: Path) -> dict[str, str]:
    """Image files with awkward names (and sidecar captions); returns rel path -> caption."""
    names = {
        "a.jpg": "stem a",
        "a.png": "stem a",  # one sidecar caption for both
        "a b.jpg": "space",
        "a_b.jpg": "underscore",
        "dir.x/k.jpg": "dotted folder",
        "dir_x/k.jpg": "the same readable form",
        ".hidden.jpg": "leading dot",
        "v1.2.final.jpg": "dots in the stem",
        "写真 草.jpg": "non-ASCII",
        "café.jpg": "accent",
        ("n" * 90) + ".jpg": "long",
        ("長" * 60) + ".jpg": "long non-ASCII (180 bytes)",
    }
    for rel, caption in names.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg())
        path.with_suffix(".txt").write_text(caption)
    return names


def write_input_tar(path: Path, members: list[tuple[str, bytes]], **options) -> None:
    with tarfile.open(path, "w", **options) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

"""Uneven shards of one-colour JPEGs with a manifest: for loader and trainer tests, benches."""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from pathlib import Path

from PIL import Image, ImageColor

UNEVEN = (1, 7, 1000, 16)  # 1,024 samples: 32 batches of 16 on each of 2 ranks, none left


COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]


def write_uneven_shards(folder: Path, sizes: tuple[int, ...] = UNEVEN, prefix: str = "k") -> Path:
    """Shards of the given sizes; sample i is a 72 px JPEG of one colour with its caption."""
    rng = random.Random(0)
    entries, index = [], 0
    for s, size in enumerate(sizes):
        path = folder / f"shard-{s:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for _ in range(size):
                colour = COLOURS[index % len(COLOURS)]
                rgb = tuple(min(c + rng.randint(0, 40), 255) for c in ImageColor.getrgb(colour))
                buf = io.BytesIO()
                Image.new("RGB", (72, 72), rgb).save(buf, "JPEG", quality=80)
                for ext, payload in (("jpg", buf.getvalue()), ("txt", f"a {colour} square")):
                    data = payload if isinstance(payload, bytes) else payload.encode()
                    info = tarfile.TarInfo(f"{prefix}{index:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                index += 1
        raw = path.read_bytes()
        entries.append(
            {
                "name": path.name,
                "samples": size,
                "bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
    doc = {"format": "mmcurate/1", "samples": index, "shards": entries}
    (folder / "manifest.json").write_text(json.dumps(doc))
    return folder / "manifest.json"

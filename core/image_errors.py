"""What decoding a damaged or hostile image file with Pillow raises: one list for the build's
stages (stages/lib/pixels.py) and the trainer's loaders (trainer/data/transform.py), so a file one
of them counts as undecodable never crashes the other."""

from __future__ import annotations

import struct

from PIL import Image

# Beyond OSError and ValueError, the documented ones, Pillow's plugins let struct, index and
# key errors of a malformed header through: a per-sample decode error, never a failed task.
PIL_DECODE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    IndexError,
    KeyError,
    TypeError,
    ZeroDivisionError,
    Image.DecompressionBombError,
)

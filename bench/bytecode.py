"""Bytecode before whole-command timings, for both sides of a ratio.

`pip install` of a wheel writes each module's .pyc; an editable install does not, and with
PYTHONDONTWRITEBYTECODE set (as on our bench machine) every command then compiles every
module it imports: ~0.3 s for `mmcurate build`, and part of the reference's start too (the
bare pool imports our stages and this folder's scripts). `make install` compiles the
package; the benches call `compile_all()` so a rerun after an edit times the same thing.
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "pipeline", "stages", "trainer")


def compile_all() -> None:
    for name in PACKAGES:
        compileall.compile_dir(ROOT / name, quiet=1)
    compileall.compile_dir(ROOT / "bench", maxlevels=0, quiet=1)  # the reference's scripts

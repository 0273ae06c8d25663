"""Bench: a timestamp at each phase of one `mmcurate build` (seconds since the interpreter was
up), to see where a small build's fixed cost goes.

Runs the real command (`pipeline.cli.main`) in this process with the build's phase functions
wrapped to print `TL <seconds> <point>` lines on stderr; nothing else changes.

    .venv/bin/python bench/build_timeline.py build <config.yaml> --no-progress
"""

from __future__ import annotations

import os
import sys
import time

T0 = time.perf_counter()


def mark(point: str) -> None:
    print(f"TL {time.perf_counter() - T0:7.3f} {point}", file=sys.stderr, flush=True)


def wrap(module: object, name: str) -> None:
    inner = getattr(module, name)

    def timed(*args: object, **kwargs: object) -> object:
        mark(f"{name} start")
        result = inner(*args, **kwargs)
        mark(f"{name} end")
        return result

    setattr(module, name, timed)


def main() -> None:
    mark("interpreter up")
    import mmcurate.pipeline.cli as cli

    mark("cli imported")
    import mmcurate.pipeline.config  # noqa: F401

    mark("config module imported")
    import mmcurate.pipeline.build as build
    import mmcurate.pipeline.phase_c as phase_c
    import mmcurate.pipeline.runtime.session as raysession

    mark("build imported")
    phases = ("preflight", "claim_output", "stage_sources", "phase_a", "signature_groups")
    for name in (*phases, "decide", "phase_c"):
        wrap(build, name)
    for name in ("publish", "write_report", "drop_work"):
        wrap(phase_c, name)
    wrap(raysession, "prestart")
    wrap(raysession.Runtime, "close")
    exit_now = os._exit

    def exit_marked(code: int) -> None:
        mark("os._exit")
        exit_now(code)

    os._exit = exit_marked
    sys.argv = ["mmcurate", *sys.argv[1:]]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()

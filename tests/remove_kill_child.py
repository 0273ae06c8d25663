"""`mmcurate remove` killed with SIGKILL at a chosen point: run as
`python tests/remove_kill_child.py MODULE:FUNCTION before|after N -- REMOVE-ARGS...`; the
process kills itself just before (or just after) the N-th call of that function."""

from __future__ import annotations

import importlib
import os
import signal
import sys


def killing(function, when: str, nth: int):  # noqa: ANN001, ANN201 - any function
    calls = [0]

    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        if when == "before" and calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        result = function(*args, **kwargs)
        if when == "after" and calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return wrapper


def main() -> int:
    target, when, nth, _, *args = sys.argv[1:]
    module_name, name = target.split(":")
    module = importlib.import_module(f"mmcurate.pipeline.maintain.{module_name}")
    setattr(module, name, killing(getattr(module, name), when, int(nth)))
    from mmcurate.pipeline.maintain.remove import main as remove_main

    return remove_main(args)


if __name__ == "__main__":
    sys.exit(main())

"""Run a function in a child process that can be abandoned: for decoders that hang or crash.

`Isolated().call(fn, args, timeout)` sends the call to a long-lived child Python (started on
first use, one per worker process) and waits at most `timeout` seconds. If the child does not
answer in time it is killed (`CallTimeout`) and the next call starts a fresh one; if it dies
(a crash in C code) that is `CallCrashed`; an exception inside `fn` comes back as `CallFailed`.
`fn` must be importable by module and name (it is pickled by reference). What `fn` reports as
done (core/progress.py) comes back before its answer, at most once a second, and is reported
again in the calling process.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from mmcurate.core import progress


class CallTimeout(Exception):
    pass


class CallCrashed(Exception):
    pass


class CallFailed(Exception):
    pass


class Isolated:
    """`preload`: modules the child imports when it starts, outside any call's time limit.

    Every request carries a number and the answer must carry the same one; any interruption
    between sending and receiving (a timeout, a crash, an exception in the caller) kills the
    child, so an answer can never be taken for a later call's.
    """

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.preload = preload
        self.sequence = 0

    def start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mmcurate.stages.lib.isolation",
                str(to_child_r),
                str(from_child_w),
            ],
            pass_fds=(to_child_r, from_child_w),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.conn = Connection(from_child_r, readable=True, writable=False)
        self.send = Connection(to_child_w, readable=False, writable=True)
        if self.preload:
            try:
                self.exchange(import_modules, (self.preload,), STARTUP_S)
            except CallTimeout:
                raise CallCrashed(f"decoder process did not start in {STARTUP_S}s") from None

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.conn.close()
            self.send.close()
        self.process = None

    def call(self, fn: Callable[..., Any], args: tuple, timeout: float) -> Any:
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self.start()
        status, value = self.exchange(fn, args, timeout)
        if status == "error":
            raise CallFailed(value)
        return value

    def exchange(self, fn: Callable[..., Any], args: tuple, timeout: float) -> tuple[str, Any]:
        """Send one numbered request and wait for its answer; on anything else, kill the child."""
        self.sequence += 1
        deadline = time.monotonic() + timeout
        try:
            self.send.send((self.sequence, fn, args))
            while True:  # progress messages, then the answer
                if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                    raise CallTimeout(f"no answer in {timeout:g}s")
                number, status, value = self.conn.recv()
                if number != self.sequence:
                    raise CallCrashed(f"answer {number} for request {self.sequence}")
                if status != PROGRESS:
                    return status, value
                progress.report_counts(value)
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as err:
            self.stop()
            raise CallCrashed(type(err).__name__) from None
        except BaseException:
            self.stop()
            raise


STARTUP_S = 120
PROGRESS = "progress"  # a message's status: counts done so far, not the answer


def import_modules(names: tuple[str, ...]) -> None:
    for name in names:
        importlib.import_module(name)


def serve(reader: Connection, writer: Connection) -> None:
    while True:
        try:
            number, fn, args = reader.recv()
        except EOFError:
            return
        sink = progress.Batched(lambda counts, n=number: writer.send((n, PROGRESS, counts)))
        try:
            with progress.channel(sink):
                value = fn(*args)
            writer.send((number, "ok", value))
        except Exception as err:  # noqa: BLE001  (any failure of the call goes back as data)
            writer.send((number, "error", f"{type(err).__name__}: {err}"))


if __name__ == "__main__":
    serve(
        Connection(int(sys.argv[1]), readable=True, writable=False),
        Connection(int(sys.argv[2]), readable=False, writable=True),
    )

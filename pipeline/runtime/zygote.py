"""A zygote: one process forked from the driver while it is still clean, that forks the local
pool's workers on request for the rest of the build.

Forking the driver itself later is unsafe: by then it may have started thread pools whose locks
a fork copies held. torch's OpenMP pool is the one seen here: the driver loads each model once
to check it, and every worker forked after that deadlocked in its first parallel region (a
clip_score build of 10 partitions never finished). A forkserver or spawn would be clean too,
but they start a fresh interpreter that imports everything again (seconds per build, measured
4-5 s here for mmcurate's modules) and re-run the user's `__main__`; a zygote's workers start
in milliseconds with the driver's imports already loaded, as plain forks did.

Each request carries one end of a fresh socket pair (SCM_RIGHTS); the worker forked for it
serves the pool on that socket and exits when it closes. The zygote reaps its children and
exits when the driver's end of its own socket closes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle


class Zygote:
    """The forking process; `fork_worker(serve)` returns (pid, driver's end of its socket)."""

    def __init__(self, serve: Callable[[Connection, list[Connection]], None]) -> None:
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()  # duplex: a Unix socket pair, which can carry fds
        self.process = context.Process(
            target=_zygote, args=(child, self.conn, serve), name="mmcurate-zygote", daemon=True
        )
        self.process.start()
        child.close()

    def fork_worker(self) -> tuple[int, Connection]:
        """A new worker process; raises OSError or EOFError when the zygote is gone."""
        ours, theirs = multiprocessing.Pipe()
        try:
            self.conn.send_bytes(b"fork")
            send_handle(self.conn, theirs.fileno(), self.process.pid)
            pid = int(self.conn.recv_bytes())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return pid, ours

    def close(self) -> None:
        self.conn.close()  # the zygote exits on EOF; its workers on their own sockets' EOF
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


def become_worker() -> None:
    """A worker is not the (daemonic) zygote it was forked from: multiprocessing refuses
    children to a daemonic process, and a task may start some."""
    me = multiprocessing.current_process()
    me._config["daemon"] = False  # no public way to clear it once a process has started
    me.name = "mmcurate-worker"


def _zygote(conn: Connection, driver_end: Connection, serve: Callable) -> None:
    """The zygote's loop: fork a worker per request until the driver's socket closes."""
    driver_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished workers are reaped by the kernel
    while True:
        try:
            conn.recv_bytes()
            fd = recv_handle(conn)
        except (EOFError, OSError):
            os._exit(0)  # the driver is gone or done
        pid = os.fork()
        if pid == 0:
            conn.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a worker's subprocesses need it
            become_worker()
            try:
                serve(Connection(fd), [])
            finally:
                os._exit(0)
        os.close(fd)
        try:
            conn.send_bytes(str(pid).encode())
        except OSError:
            os._exit(0)

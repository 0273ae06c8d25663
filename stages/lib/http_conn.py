"""The connections URL fetches use (stages/lib/http_fetch.py): each pinned to the addresses the
private-address guard vetted (so a name cannot resolve elsewhere between check and connect),
kept per origin for reuse by any fetching thread, and every socket read under the attempt's one
deadline."""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.host_limits import HostLimits
from mmcurate.stages.lib.resolver import Resolver


def time_left(deadline: float) -> float:
    """Seconds the attempt has left; TimeoutError (the `timeout` reason) once it has none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("attempt deadline passed")
    return left


def pinned_connector(
    addresses: tuple[str, ...] | None, deadline: float
) -> Callable[..., socket.socket]:
    """A `create_connection` for http.client that dials only the vetted addresses (None: the
    host's own, guard off), each dial and then the TLS handshake within the attempt's time (Host
    header and TLS server name stay the URL's host)."""

    def connect(address: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
        error: OSError | None = None
        for host in addresses if addresses is not None else (address[0],):
            try:
                sock = socket.create_connection(
                    (host, address[1]), min(timeout, time_left(deadline)), source
                )
            except OSError as err:  # the next address, while time is left
                error = err
                continue
            try:
                sock.settimeout(min(timeout, time_left(deadline)))  # TLS handshake: a total
            except TimeoutError:
                sock.close()
                raise
            return sock
        raise error or OSError("no address")

    return connect


class DeadlineReader(io.RawIOBase):
    """A response's socket reader that gives each recv at most the time the attempt has left.

    A per-recv timeout alone cannot bound an attempt: the status line and headers are read
    inside getresponse() as many small recvs, and a server dripping a byte a second never trips
    one. Shrinking the socket timeout before every recv bounds them all in the reading thread
    itself (TLS too: an ssl read takes the socket timeout as its deadline), where a watchdog
    thread shutting sockets down would be one more thread to run, and its timeouts would look
    like resets.
    """

    def __init__(self, raw: Any, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.raw, self.sock, self.deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self.sock.settimeout(time_left(self.deadline))
        return self.raw.readinto(buffer)

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self.raw.close()  # the socket's own reader: releases its hold on the socket
        super().close()


class DeadlineResponse(http.client.HTTPResponse):
    """An HTTPResponse every read of which (status line, headers, body) ends by `deadline`."""

    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(DeadlineReader(self.fp.detach(), sock, deadline))


class Connections:
    """Keep-alive connections, shared by the fetching threads: idle ones wait per origin (at
    most `idle_per_origin` each, `max_idle` in all) for the next request to that origin, and
    `hosts` (the per-host limits) says when a request may go. A connection is made only by a
    request holding one of its host's slots and finding none idle, so a host never has more
    connections from this task than `host_concurrency` (with the default idle bound).

    Plain `http.client` rather than a higher-level client: per request it costs about half
    the CPU, which matters when a core also decodes ~400 images/s.
    """

    def __init__(
        self, idle_per_origin: int = 8, max_idle: int = 1024, hosts: HostLimits | None = None
    ) -> None:
        self.idle_per_origin, self.max_idle = idle_per_origin, max_idle
        self.idle: OrderedDict[tuple[str, str, int], list[Any]] = OrderedDict()
        self.idle_count = 0
        self.lock = threading.Lock()
        self.tls = ssl.create_default_context()
        self.resolver = Resolver()
        self.hosts = hosts if hosts is not None else HostLimits(idle_per_origin)

    def take(
        self,
        scheme: str,
        host: str,
        port: int,
        policy: FetchPolicy,
        addresses: tuple[str, ...] | None,
        deadline: float,
    ) -> tuple[Any, bool]:
        """(connection, reused): an idle kept-alive one for this origin, else a new one (dialing
        only `addresses` when given), connected by `deadline`."""
        cached = self.pop_idle((scheme, host, port))
        if cached is not None:
            return cached, True
        if scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=policy.connect_timeout_s, context=self.tls
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=policy.connect_timeout_s)
        conn._create_connection = pinned_connector(addresses, deadline)  # http.client's hook
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        return conn, False

    def pop_idle(self, origin: tuple[str, str, int]) -> Any:
        """The origin's most recently used idle connection still open, or None."""
        with self.lock:
            waiting = self.idle.get(origin)
            while waiting:
                conn = waiting.pop()
                self.idle_count -= 1
                if conn.sock is not None:  # None: closed since it was kept
                    return conn
            return None

    def give(self, scheme: str, host: str, port: int, conn: Any) -> None:
        """Keep `conn` for the origin's next request; the oldest idle ones past the bounds
        are closed."""
        closing = []
        with self.lock:
            waiting = self.idle.setdefault((scheme, host, port), [])
            self.idle.move_to_end((scheme, host, port))
            waiting.append(conn)
            self.idle_count += 1
            if len(waiting) > self.idle_per_origin:
                closing.append(waiting.pop(0))
                self.idle_count -= 1
            while self.idle_count > self.max_idle:
                origin, oldest = next(iter(self.idle.items()))
                if not oldest:
                    del self.idle[origin]
                    continue
                closing.append(oldest.pop(0))
                self.idle_count -= 1
        for old in closing:
            old.close()

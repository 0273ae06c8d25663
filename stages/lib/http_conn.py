"""The connections URL fetches use (stages/lib/http_fetch.py): each pinned to the addresses the
private-address guard vetted (so a name cannot resolve elsewhere between check and connect),
kept per host for reuse, and every socket read under the attempt's one deadline."""

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
    """Keep-alive connections, a few per thread (web-scale lists rarely repeat a host much).

    Plain `http.client` rather than a higher-level client: per request it costs about half
    the CPU, which matters when a core also decodes ~400 images/s.
    """

    def __init__(self, per_thread: int = 8) -> None:
        self.per_thread = per_thread
        self.local = threading.local()
        self.tls = ssl.create_default_context()
        self.resolver = Resolver()

    def _cache(self) -> OrderedDict:
        if not hasattr(self.local, "conns"):
            self.local.conns = OrderedDict()
        return self.local.conns

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
        cached = self._cache().pop((scheme, host, port), None)
        if cached is not None and cached.sock is not None:  # None: closed since it was kept
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

    def give(self, scheme: str, host: str, port: int, conn: Any) -> None:
        cache = self._cache()
        cache[(scheme, host, port)] = conn
        while len(cache) > self.per_thread:
            cache.popitem(last=False)[1].close()

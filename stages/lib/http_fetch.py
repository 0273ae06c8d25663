"""Fetch one URL with bounded time, size and retries; every failure is a named reason.

Pure of Ray and of the stage machinery so it can be tested against local servers directly.
Redirects are followed by hand so that each hop is checked (scheme, private address).
An attempt has one deadline (`timeout_s`) for all of it: name lookups, connect, TLS, request,
status line and headers, every redirect hop and every body read. A 429 or 503 that says how long
to wait (Retry-After) is retried after that wait when it is at most `max_retry_after_s`, and not
retried at all when the server asks for longer.
"""

from __future__ import annotations

import email.utils
import functools
import http.client
import io
import random
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stages.lib.resolver import Resolver
from stages.lib.url_guard import Failed, Target, parse_url, redirect_target, vet_addresses

REDIRECTS = {301, 302, 303, 307, 308}
RETRYABLE = {429, 500, 502, 503, 504}
# Leading bytes of the image formats we accept -> the WebDataset column they go into.
SIGNATURES = (
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)


@dataclass(frozen=True)
class FetchPolicy:
    timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    retries: int = 2
    backoff_s: float = 0.5
    max_retry_after_s: float = 10.0
    max_bytes: int = 20_000_000
    max_redirects: int = 5
    max_url_chars: int = 8192  # longer URLs (and redirect targets) drop as `bad_url`
    user_agent: str = "mmcurate/0.1"
    allow_private_addresses: bool = False
    disallowed_directives: tuple[str, ...] = ("noai", "noimageai", "noindex", "noimageindex")


@dataclass
class Fetched:
    data: bytes | None = None
    column: str | None = None  # image column from the sniffed format
    reason: str | None = None  # drop reason when data is None
    status: int | None = None
    attempts: int = 0


def sniff(data: bytes) -> str | None:
    """The image column for these bytes, or None when they are not a known image format."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((col for magic, col in SIGNATURES if data.startswith(magic)), None)


def check_url(url: object, policy: FetchPolicy) -> tuple[str, ...] | None:
    """Refuse bad URLs and schemes and (guard on) private targets; returns the vetted
    addresses, which the connection must then use, so a second DNS answer cannot point it
    elsewhere."""
    return vet_addresses(parse_url(url, policy.max_url_chars), policy.allow_private_addresses)


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


def robots_optout(values: list[str], policy: FetchPolicy) -> bool:
    """X-Robots-Tag opt-outs, general (`noai`) or aimed at us (`mmcurate: noai`)."""
    for value in values:
        for part in value.lower().split(","):
            agent, _, directive = part.rpartition(":")
            if agent.strip() not in ("", "*", "mmcurate"):
                continue
            if directive.strip() in policy.disallowed_directives:
                return True
    return False


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


def read_body(response: http.client.HTTPResponse, policy: FetchPolicy) -> bytes:
    """The whole body (the response's reader keeps the deadline); IncompleteRead (a
    `connection_error`) when the connection closes before the announced Content-Length."""
    length = response.getheader("Content-Length")
    if length and length.isdigit() and int(length) > policy.max_bytes:
        raise Failed("too_large")
    chunks, size = [], 0
    while True:
        chunk = response.read1(1 << 16)
        if not chunk:
            if response.length:  # read1 answers b"" at EOF, however much was announced
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            return b"".join(chunks)
        size += len(chunk)
        if size > policy.max_bytes:
            raise Failed("too_large")
        chunks.append(chunk)


@dataclass(frozen=True)
class Reply:
    status: int
    location: str | None  # a redirect's target, as sent
    body: bytes
    retry_after_s: float | None = None  # the server's Retry-After, in seconds from now


def exchange(
    conns: Connections,
    target: Target,
    policy: FetchPolicy,
    addresses: tuple[str, ...] | None = None,
    deadline: float | None = None,
) -> Reply:
    """One request, done by `deadline` (default: `timeout_s` from now); a stale kept-alive
    connection is retried once on a fresh one."""
    deadline = time.monotonic() + policy.timeout_s if deadline is None else deadline
    origin = target.origin
    headers = {"User-Agent": policy.user_agent, "Accept": "image/*,*/*;q=0.8"}
    for _ in range(2):
        conn, reused = conns.take(*origin, policy, addresses, deadline)
        conn.response_class = functools.partial(DeadlineResponse, deadline=deadline)
        try:
            conn.sock.settimeout(time_left(deadline))  # sending the request
            conn.request("GET", target.path, headers=headers)
            response = conn.getresponse()
        except (
            http.client.RemoteDisconnected,
            http.client.ImproperConnectionState,
            BrokenPipeError,
            ConnectionResetError,
        ):
            conn.close()
            if reused:
                continue
            raise
        except BaseException:
            conn.close()
            raise
        try:
            return finish(response, policy, conns, origin, conn)
        except BaseException:
            conn.close()
            raise
    raise Failed("connection_error", retry=True)


def finish(
    response: http.client.HTTPResponse,
    policy: FetchPolicy,
    conns: Connections,
    origin: tuple,
    conn: Any,
) -> Reply:
    """Status, redirect target, body (read only for a 200 that did not opt out), Retry-After."""
    location = response.getheader("Location") if response.status in REDIRECTS else None
    if location is not None or response.status != 200:
        body = response.read(64 << 10)  # small error pages; a big one just closes the conn
    elif robots_optout(response.headers.get_all("X-Robots-Tag") or [], policy):
        raise Failed("robots_optout")
    else:
        body = read_body(response, policy)
    # read before the connection is given back: nothing may fail after that
    wait = retry_after(response.getheader("Retry-After")) if response.status != 200 else None
    fully_read = response.isclosed() or response.length == 0
    if fully_read and not response.will_close:
        response.close()  # releases the response; the socket stays open for the next one
        conns.give(*origin, conn)
    else:
        conn.close()
    return Reply(response.status, location, body, wait)


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds from now: delta-seconds or an HTTP date; None when absent or not
    understood (then the usual backoff applies)."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():  # not '²', which isdigit() also takes
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT
        return None
    return max(0.0, when.timestamp() - time.time())


def attempt(conns: Connections, url: object, policy: FetchPolicy) -> tuple[bytes, int]:
    """One attempt, following redirects (each hop vetted again), all within one `timeout_s`;
    returns (body, status) or raises Failed."""
    target, seen = parse_url(url, policy.max_url_chars), set()
    deadline = time.monotonic() + policy.timeout_s

    def resolve(host: str, port: int) -> tuple[str, ...]:
        return conns.resolver.addresses(host, port, deadline)

    for _ in range(policy.max_redirects + 1):
        if target.url in seen:  # a loop: no point asking again (we send no cookies)
            break
        seen.add(target.url)
        try:
            addresses = vet_addresses(target, policy.allow_private_addresses, resolve)
            reply = exchange(conns, target, policy, addresses, deadline)
        except TimeoutError:
            raise Failed("timeout") from None
        except ssl.SSLError:
            raise Failed("ssl_error") from None
        except socket.gaierror:
            raise Failed("dns_error") from None
        except (http.client.InvalidURL, UnicodeError, ValueError):
            raise Failed("bad_url") from None
        except (http.client.HTTPException, OSError):
            raise Failed("connection_error", retry=True) from None
        if reply.location is not None:
            target = redirect_target(target, reply.location, policy.max_url_chars)
            continue
        if reply.status != 200:
            retry = reply.status in RETRYABLE
            raise Failed(f"http_{reply.status}", retry, reply.status, reply.retry_after_s)
        return reply.body, reply.status
    raise Failed("too_many_redirects")


def fetch(conns: Connections, url: object, policy: FetchPolicy) -> Fetched:
    """Fetch `url` (any value: a non-string is `bad_url`): retries (exponential backoff, full
    jitter) only where they may help."""
    for tries in range(1, policy.retries + 2):
        try:
            data, status = attempt(conns, url, policy)
        except Failed as failure:
            pause = retry_pause(failure, tries, policy)
            if pause is not None:
                time.sleep(pause)
                continue
            return Fetched(reason=failure.reason, status=failure.status, attempts=tries)
        column = sniff(data)
        if column is None:
            return Fetched(reason="not_image", status=status, attempts=tries)
        return Fetched(data=data, column=column, status=status, attempts=tries)
    raise AssertionError("unreachable")


def retry_pause(failure: Failed, tries: int, policy: FetchPolicy) -> float | None:
    """Seconds to wait before attempt `tries + 1`, or None when not to retry: the failure cannot
    be helped by trying again, the retries are spent, or the server asked (Retry-After) for a
    longer wait than `max_retry_after_s`. Otherwise the longer of the server's wait and the
    jittered exponential backoff."""
    if not failure.retry or tries > policy.retries:
        return None
    backoff = random.uniform(0, policy.backoff_s * 2 ** (tries - 1))
    if failure.wait_s is None:
        return backoff
    if failure.wait_s > policy.max_retry_after_s:
        return None
    return max(failure.wait_s, backoff)

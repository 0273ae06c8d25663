"""Fetch one URL with bounded time, size and retries; every failure is a named reason.

Pure of Ray and of the stage machinery so it can be tested against local servers directly.
Redirects are followed by hand so that each hop is checked (scheme, private address).
"""

from __future__ import annotations

import http.client
import random
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def pinned_connector(addresses: tuple[str, ...]) -> Callable[..., socket.socket]:
    """A `create_connection` for http.client that dials only the vetted addresses (Host header
    and TLS server name stay the URL's host)."""

    def connect(address: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
        error: OSError | None = None
        for ip in addresses:
            try:
                return socket.create_connection((ip, address[1]), timeout, source)
            except OSError as err:
                error = err
        raise error or OSError("no address")

    return connect


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
        addresses: tuple[str, ...] | None = None,
    ) -> tuple[Any, bool]:
        """(connection, reused): an idle kept-alive one for this origin, else a new one (dialing
        only `addresses` when given)."""
        cached = self._cache().pop((scheme, host, port), None)
        if cached is not None:
            return cached, True
        if scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=policy.connect_timeout_s, context=self.tls
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=policy.connect_timeout_s)
        if addresses is not None:
            conn._create_connection = pinned_connector(addresses)  # http.client's own hook
        conn.connect()
        conn.sock.settimeout(policy.timeout_s)  # connect has its own limit; reads get this one
        return conn, False

    def give(self, scheme: str, host: str, port: int, conn: Any) -> None:
        cache = self._cache()
        cache[(scheme, host, port)] = conn
        while len(cache) > self.per_thread:
            cache.popitem(last=False)[1].close()


def read_body(response: http.client.HTTPResponse, policy: FetchPolicy, deadline: float) -> bytes:
    length = response.getheader("Content-Length")
    if length and length.isdigit() and int(length) > policy.max_bytes:
        raise Failed("too_large")
    chunks, size = [], 0
    while True:
        chunk = response.read1(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > policy.max_bytes:
            raise Failed("too_large")
        if time.monotonic() > deadline:
            raise Failed("timeout")
        chunks.append(chunk)


def exchange(
    conns: Connections,
    target: Target,
    policy: FetchPolicy,
    addresses: tuple[str, ...] | None = None,
) -> tuple[int, str | None, bytes]:
    """One request (a stale kept-alive connection is retried once on a fresh one)."""
    origin = target.origin
    headers = {"User-Agent": policy.user_agent, "Accept": "image/*,*/*;q=0.8"}
    for _ in range(2):
        conn, reused = conns.take(*origin, policy, addresses)
        try:
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
        try:
            return finish(
                response, policy, time.monotonic() + policy.timeout_s, conns, origin, conn
            )
        except BaseException:
            conn.close()
            raise
    raise Failed("connection_error", retry=True)


def finish(
    response: http.client.HTTPResponse,
    policy: FetchPolicy,
    deadline: float,
    conns: Connections,
    origin: tuple,
    conn: Any,
) -> tuple[int, str | None, bytes]:
    """Status, redirect target and body (read only for a 200 that did not opt out)."""
    location = response.getheader("Location") if response.status in REDIRECTS else None
    if location is not None or response.status != 200:
        body = response.read(64 << 10)  # small error pages; a big one just closes the conn
    elif robots_optout(response.headers.get_all("X-Robots-Tag") or [], policy):
        raise Failed("robots_optout")
    else:
        body = read_body(response, policy, deadline)
    fully_read = response.isclosed() or response.length == 0
    if fully_read and not response.will_close:
        response.close()  # releases the response; the socket stays open for the next one
        conns.give(*origin, conn)
    else:
        conn.close()
    return response.status, location, body


def attempt(conns: Connections, url: object, policy: FetchPolicy) -> tuple[bytes, int]:
    """One attempt, following redirects (each hop vetted again); returns (body, status) or
    raises Failed."""
    target, seen = parse_url(url, policy.max_url_chars), set()
    for _ in range(policy.max_redirects + 1):
        if target.url in seen:  # a loop: no point asking again (we send no cookies)
            break
        seen.add(target.url)
        addresses = vet_addresses(target, policy.allow_private_addresses)
        try:
            status, location, body = exchange(conns, target, policy, addresses)
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
        if location is not None:
            target = redirect_target(target, location, policy.max_url_chars)
            continue
        if status != 200:
            raise Failed(f"http_{status}", retry=status in RETRYABLE, status=status)
        return body, status
    raise Failed("too_many_redirects")


def fetch(conns: Connections, url: object, policy: FetchPolicy) -> Fetched:
    """Fetch `url` (any value: a non-string is `bad_url`): retries (exponential backoff, full
    jitter) only where they may help."""
    for tries in range(1, policy.retries + 2):
        try:
            data, status = attempt(conns, url, policy)
        except Failed as failure:
            if failure.retry and tries <= policy.retries:
                time.sleep(random.uniform(0, policy.backoff_s * 2 ** (tries - 1)))
                continue
            return Fetched(reason=failure.reason, status=failure.status, attempts=tries)
        column = sniff(data)
        if column is None:
            return Fetched(reason="not_image", status=status, attempts=tries)
        return Fetched(data=data, column=column, status=status, attempts=tries)
    raise AssertionError("unreachable")

"""Fetch one URL with bounded time, size and retries; every failure is a named reason.

Pure of Ray and of the stage machinery so it can be tested against local servers directly.
Redirects are followed by hand so that each hop is checked (scheme, private address).
"""

from __future__ import annotations

import ipaddress
import random
import socket
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

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


class Failed(Exception):
    """A fetch attempt ended with a named reason; `retry` says whether trying again may help."""

    def __init__(self, reason: str, retry: bool = False, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.retry, self.status = reason, retry, status


def sniff(data: bytes) -> str | None:
    """The image column for these bytes, or None when they are not a known image format."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((col for magic, col in SIGNATURES if data.startswith(magic)), None)


def check_address(host: str, port: int) -> None:
    """Refuse hosts that resolve to loopback, private, link-local or reserved addresses."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise Failed("dns_error") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global:
            raise Failed("private_address")


def check_url(url: str, policy: FetchPolicy) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Failed("bad_scheme")
    if not parts.hostname:
        raise Failed("bad_url")
    if not policy.allow_private_addresses:
        check_address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


def robots_optout(headers: urllib3.HTTPHeaderDict, policy: FetchPolicy) -> bool:
    """X-Robots-Tag opt-outs, general (`noai`) or aimed at us (`mmcurate: noai`)."""
    for value in headers.getlist("X-Robots-Tag"):
        for part in value.lower().split(","):
            agent, _, directive = part.rpartition(":")
            if agent.strip() not in ("", "*", "mmcurate"):
                continue
            if directive.strip() in policy.disallowed_directives:
                return True
    return False


def read_body(response: urllib3.BaseHTTPResponse, policy: FetchPolicy, deadline: float) -> bytes:
    length = response.headers.get("Content-Length")
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


def attempt(pool: urllib3.PoolManager, url: str, policy: FetchPolicy) -> tuple[bytes, int]:
    """One attempt, following redirects; returns (body, status) or raises Failed."""
    deadline = time.monotonic() + policy.timeout_s
    timeout = urllib3.Timeout(connect=policy.connect_timeout_s, read=policy.timeout_s)
    for _ in range(policy.max_redirects + 1):
        check_url(url, policy)
        try:
            response = pool.request(
                "GET",
                url,
                preload_content=False,
                redirect=False,
                retries=False,
                timeout=timeout,
                headers={"User-Agent": policy.user_agent},
            )
        except NewConnectionError:  # before timeouts: urllib3 derives it from ConnectTimeoutError
            raise Failed("connection_error", retry=True) from None
        except (Urllib3Timeout, TimeoutError):
            raise Failed("timeout") from None
        except (ProtocolError, HTTPError, OSError):
            raise Failed("connection_error", retry=True) from None
        reusable = False  # only a fully read response may go back to the pool
        try:
            if response.status in REDIRECTS and response.headers.get("Location"):
                url = urljoin(url, response.headers["Location"])
                response.drain_conn()
                reusable = True
                continue
            body = checked_body(response, policy, deadline)
            reusable = True
            return body, response.status
        except (Urllib3Timeout, TimeoutError):
            raise Failed("timeout") from None
        except (ProtocolError, HTTPError, OSError):
            raise Failed("connection_error", retry=True) from None
        finally:
            if not reusable:
                response.close()
            response.release_conn()
    raise Failed("too_many_redirects")


def checked_body(response: urllib3.BaseHTTPResponse, policy: FetchPolicy, deadline: float) -> bytes:
    if response.status != 200:
        raise Failed(
            f"http_{response.status}", retry=response.status in RETRYABLE, status=response.status
        )
    if robots_optout(response.headers, policy):
        raise Failed("robots_optout")
    return read_body(response, policy, deadline)


def fetch(pool: urllib3.PoolManager, url: str, policy: FetchPolicy) -> Fetched:
    """Fetch `url`: retries (exponential backoff, full jitter) only where it may help."""
    for tries in range(1, policy.retries + 2):
        try:
            data, status = attempt(pool, url, policy)
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

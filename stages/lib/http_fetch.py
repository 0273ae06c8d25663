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
import hashlib
import http.client
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mmcurate.core.spill import Media, MemoryBudget, Spilled, SpillingBuffer, release
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections, DeadlineResponse, time_left
from mmcurate.stages.lib.url_guard import Failed, Target, parse_url, redirect_target, vet_addresses

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


@dataclass
class Fetched:
    data: Media | None = None  # bytes, or a Spilled file for a body past the spill limits
    column: str | None = None  # image column from the sniffed format
    reason: str | None = None  # drop reason when data is None
    status: int | None = None
    attempts: int = 0
    sha256: str | None = None  # of the body, hashed as it arrived
    final_url: str | None = None  # after redirects
    signals: dict[str, Any] = field(default_factory=dict)  # opt-out signals seen (the json's)
    fetched_at: str | None = None  # UTC, ISO 8601 (set by the download stage)


@dataclass(frozen=True)
class SpillTo:
    """Where bodies go that must not stay in memory: a body above `spill_bytes`, or one that
    finds the `budget` (the bytes a chunk may hold, shared by the fetching threads) spent, is
    streamed to a new file of `folder` and comes back as a Spilled value. `folder` may be a
    function giving it (the task's), called only once a body goes to disk: a stage called
    outside a build makes no folder it does not need."""

    folder: str | Callable[[], str]
    spill_bytes: int | None
    budget: MemoryBudget


@dataclass(frozen=True)
class Body:
    data: Media
    sha256: str


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


def robots_optout(values: list[str], policy: FetchPolicy) -> bool:
    """X-Robots-Tag opt-outs, general (`noai`) or aimed at us (`mmcurate: noai`)."""
    for value in values:
        for part in value.lower().split(","):
            agent, _, directive = part.rpartition(":")
            if agent.strip() not in ("", "*", policy.agent):
                continue
            if directive.strip() in policy.disallowed_directives:
                return True
    return False


def head(data: Media, size: int = 16) -> bytes:
    """The first bytes of a body (enough to sniff), without reading a spilled one whole."""
    if isinstance(data, Spilled):
        with data.open() as f:
            return f.read(size)
    return data[:size]


def read_body(
    response: http.client.HTTPResponse, policy: FetchPolicy, spill: SpillTo | None = None
) -> Body:
    """The whole body and its sha256 (the response's reader keeps the deadline): in memory,
    or with `spill` streamed to disk past its limits; IncompleteRead (a `connection_error`)
    when the connection closes before the announced Content-Length."""
    length = response.getheader("Content-Length")
    announced = int(length) if length and length.isascii() and length.isdigit() else None
    if announced is not None and announced > policy.max_bytes:
        raise Failed("too_large")
    if spill is None:
        buffer = SpillingBuffer("", None, MemoryBudget(None))
    else:
        buffer = SpillingBuffer(spill.folder, spill.spill_bytes, spill.budget, announced)
    digest = hashlib.sha256()
    try:
        while chunk := response.read1(1 << 16):
            if buffer.size + len(chunk) > policy.max_bytes:
                raise Failed("too_large")
            digest.update(chunk)
            buffer.write(chunk)
        if response.length:  # read1 answers b"" at EOF, however much was announced
            raise http.client.IncompleteRead(b"", response.length)
        return Body(buffer.value(), digest.hexdigest())
    except BaseException:
        buffer.discard()
        raise


@dataclass(frozen=True)
class Reply:
    status: int
    location: str | None  # a redirect's target, as sent
    body: Media
    retry_after_s: float | None = None  # the server's Retry-After, in seconds from now
    sha256: str | None = None  # of a 200's body
    signals: dict[str, Any] = field(default_factory=dict)  # opt-out headers seen on a 200
    final_url: str | None = None  # the URL that answered (set by `attempt`)


def exchange(
    conns: Connections,
    target: Target,
    policy: FetchPolicy,
    addresses: tuple[str, ...] | None = None,
    deadline: float | None = None,
    spill: SpillTo | None = None,
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
            return finish(response, policy, conns, origin, conn, spill)
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
    spill: SpillTo | None = None,
) -> Reply:
    """Status, redirect target, body (read only for a 200 that did not opt out), Retry-After."""
    location = response.getheader("Location") if response.status in REDIRECTS else None
    digest, signals = None, {}
    if location is not None or response.status != 200:
        body: Media = response.read(64 << 10)  # small error pages; a big one closes the conn
    else:
        signals = header_signals(response, policy)  # raises Failed for an opt-out
        read = read_body(response, policy, spill)
        body, digest = read.data, read.sha256
    # read before the connection is given back: nothing may fail after that
    wait = retry_after(response.getheader("Retry-After")) if response.status != 200 else None
    fully_read = response.isclosed() or response.length == 0
    if fully_read and not response.will_close:
        response.close()  # releases the response; the socket stays open for the next one
        conns.give(*origin, conn)
    else:
        conn.close()
    return Reply(response.status, location, body, wait, digest, signals)


def header_signals(response: http.client.HTTPResponse, policy: FetchPolicy) -> dict[str, Any]:
    """The opt-out headers of a 200 (for the sample's json); Failed (`robots_optout`,
    `tdm_optout`) when one that is honoured reserves the image. The body is then not read."""
    signals: dict[str, Any] = {}
    tags = response.headers.get_all("X-Robots-Tag") or []
    if tags:
        signals["x_robots_tag"] = tags
        if policy.x_robots_tag and robots_optout(tags, policy):
            raise Failed("robots_optout")
    tdm = response.getheader("tdm-reservation")
    if tdm is not None:
        signals["tdm_reservation"] = tdm.strip()
        if policy.tdm_rep and tdm.strip() == "1":
            raise Failed("tdm_optout")
    return signals


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


def attempt(
    conns: Connections, url: object, policy: FetchPolicy, spill: SpillTo | None = None
) -> Reply:
    """One attempt, following redirects (each hop vetted again), all within one `timeout_s`;
    returns the 200's reply or raises Failed."""
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
            with conns.hosts.slot(target.host, target.port) as waited:
                deadline += waited  # a queue at a busy host is not this URL's timeout
                reply = exchange(conns, target, policy, addresses, deadline, spill)
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
            if reply.status in (429, 503):  # every thread holds off the host, not just this one
                wait = policy.backoff_s if reply.retry_after_s is None else reply.retry_after_s
                conns.hosts.back_off(target.host, target.port, min(wait, policy.max_retry_after_s))
            retry = reply.status in RETRYABLE
            raise Failed(f"http_{reply.status}", retry, reply.status, reply.retry_after_s)
        return replace(reply, final_url=target.url)
    raise Failed("too_many_redirects")


def fetch(
    conns: Connections, url: object, policy: FetchPolicy, spill: SpillTo | None = None
) -> Fetched:
    """Fetch `url` (any value: a non-string is `bad_url`): retries (exponential backoff, full
    jitter) only where they may help. With `spill`, a big body comes back as a Spilled file
    (SpillError where the folder cannot take it: the machine's fault, not the URL's)."""
    for tries in range(1, policy.retries + 2):
        try:
            reply = attempt(conns, url, policy, spill)
        except Failed as failure:
            pause = retry_pause(failure, tries, policy)
            if pause is not None:
                time.sleep(pause)
                continue
            return Fetched(reason=failure.reason, status=failure.status, attempts=tries)
        column = sniff(head(reply.body))
        if column is None:
            release([reply.body])
            return Fetched(reason="not_image", status=reply.status, attempts=tries)
        return Fetched(
            data=reply.body,
            column=column,
            status=reply.status,
            attempts=tries,
            sha256=reply.sha256,
            final_url=reply.final_url,
            signals=reply.signals,
        )
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

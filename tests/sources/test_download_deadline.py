"""Hostile servers against the fetcher: `timeout_s` bounds a whole attempt (connect, TLS,
headers, every redirect hop, every body), and a body cut short of its Content-Length is a
`connection_error`, retried like one.

The servers answer on 127.0.0.1 only. A dripping server sends a byte every DRIP_GAP_S for
DRIP_S, far past the 1 s `timeout_s` the tests use; each test only checks that the fetch ends
well inside 3 x timeout_s (a generous bound: before the fix each ran for the whole drip).
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from mmcurate.stages.download import Download, DownloadOptions
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import fetch

from tests.http_corpus import Served, photo_bytes

TIMEOUT_S = 1.0
BOUND_S = 3 * TIMEOUT_S
DRIP_S = 8.0
DRIP_GAP_S = 0.2
HOP_S = 0.6  # under timeout_s: every hop alone is in time, four of them are not
IMAGE = photo_bytes()
POLICY = FetchPolicy(
    allow_private_addresses=True, timeout_s=TIMEOUT_S, connect_timeout_s=DRIP_S, backoff_s=0.01
)


class Hostile(Served, socketserver.ThreadingTCPServer):
    daemon_threads = allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), HostileHandler)
        self.hits: Counter[str] = Counter()
        self.release = threading.Event()  # ends the drips when the test is over

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class HostileHandler(socketserver.StreamRequestHandler):
    """One request per connection, answered by the route named by the path's first part."""

    server: Hostile

    def handle(self) -> None:
        line = self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b""):
            pass
        path = line.split()[1].decode() if len(line.split()) == 3 else "/"
        self.server.hits[path] += 1
        route = ROUTES.get(path.split("/")[1], image)
        try:
            route(self, path)
        except OSError:
            pass  # the client hung up: what a timeout does

    def send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def drip(self, data: bytes) -> None:
        """`data` a byte at a time, one every DRIP_GAP_S, for at most DRIP_S."""
        for i in range(int(DRIP_S / DRIP_GAP_S)):
            self.send(data[i % len(data) : i % len(data) + 1])
            if self.server.release.wait(DRIP_GAP_S):
                return


def head(status: str, length: int, *extra: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {length}", "Connection: close", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def image(handler: HostileHandler, path: str) -> None:
    handler.send(head("200 OK", len(IMAGE), "Content-Type: image/jpeg") + IMAGE)


def drip_headers(handler: HostileHandler, path: str) -> None:
    handler.send(b"HTTP/1.1 200 OK\r\nX-Drip: ")
    handler.drip(b"a")  # then a whole image, had the client waited
    handler.send(b"\r\n" + head("200 OK", len(IMAGE)).split(b"\r\n", 1)[1] + IMAGE)


def drip_404(handler: HostileHandler, path: str) -> None:
    handler.send(head("404 Not Found", 100_000))
    handler.drip(b"x")


def drip_redirect(handler: HostileHandler, path: str) -> None:
    handler.send(head("302 Found", 100_000, "Location: /image"))
    handler.drip(b"x")


def drip_body(handler: HostileHandler, path: str) -> None:
    handler.send(head("200 OK", 100_000) + IMAGE[:3])
    handler.drip(b"\0")


def slow_hop(handler: HostileHandler, path: str) -> None:
    """/slow_hop/N waits HOP_S, then redirects to /slow_hop/N-1; /slow_hop/0 is the image."""
    if handler.server.release.wait(HOP_S):
        return
    left = int(path.rsplit("/", 1)[1])
    location = f"/slow_hop/{left - 1}" if left else "/image"
    handler.send(head("302 Found", 0, f"Location: {location}"))


def truncated(handler: HostileHandler, path: str) -> None:
    """Content-Length says the whole image, half of it comes, then the connection closes;
    /truncated/once sends it whole from the second request on."""
    if path.endswith("/once") and handler.server.hits[path] > 1:
        return image(handler, path)
    handler.send(head("200 OK", len(IMAGE), "Content-Type: image/jpeg") + IMAGE[: len(IMAGE) // 2])


ROUTES: dict[str, Callable[[HostileHandler, str], None]] = {
    "image": image,
    "drip_headers": drip_headers,
    "drip_404": drip_404,
    "drip_redirect": drip_redirect,
    "drip_body": drip_body,
    "slow_hop": slow_hop,
    "truncated": truncated,
}


@pytest.fixture
def hostile():
    server = Hostile().start()
    yield server
    server.stop()


def timed_fetch(url: str, policy: FetchPolicy = POLICY):
    start = time.monotonic()
    result = fetch(Connections(), url, policy)
    return result, time.monotonic() - start


def test_the_server_serves_a_good_image(hostile):
    result, _ = timed_fetch(f"{hostile.base}/image")
    assert result.reason is None and result.data == IMAGE


@pytest.mark.parametrize(
    "path",
    [
        "/drip_headers",  # the status line and headers are many small reads
        "/drip_404",  # an error page's body
        "/drip_redirect",  # a redirect's body
        "/drip_body",  # the image's own body
        "/slow_hop/4",  # every hop in time, the attempt not: one deadline for all hops
    ],
)
def test_a_dripping_server_cannot_hold_an_attempt_past_timeout_s(hostile, path):
    result, elapsed = timed_fetch(hostile.base + path)
    assert result.reason == "timeout" and result.data is None
    assert elapsed < BOUND_S, f"{path}: {elapsed:.1f} s with timeout_s={TIMEOUT_S}"
    assert result.attempts == 1 and hostile.hits[path] == 1  # timeouts are not retried


def test_a_silent_tls_server_is_bounded_by_timeout_s_not_connect_timeout_s():
    """The TLS handshake belongs to the attempt: a listener that never answers the
    ClientHello holds it for timeout_s, though connect_timeout_s (DRIP_S) is longer."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never accepted
        url = f"https://127.0.0.1:{silent.getsockname()[1]}/x.jpg"
        result, elapsed = timed_fetch(url)
    assert result.reason == "timeout"
    assert elapsed < BOUND_S, f"{elapsed:.1f} s with timeout_s={TIMEOUT_S}"


def test_a_body_cut_short_of_its_content_length_is_a_connection_error(hostile):
    policy = FetchPolicy(allow_private_addresses=True, retries=2, backoff_s=0.01)
    result, _ = timed_fetch(f"{hostile.base}/truncated", policy)
    assert result.reason == "connection_error" and result.data is None
    assert result.attempts == 3 and hostile.hits["/truncated"] == 3  # retried like one


def test_a_body_cut_short_once_is_fetched_whole_on_the_retry(hostile):
    policy = FetchPolicy(allow_private_addresses=True, retries=2, backoff_s=0.01)
    result, _ = timed_fetch(f"{hostile.base}/truncated/once", policy)
    assert result.reason is None and result.data == IMAGE and result.attempts == 2


def test_the_download_stage_names_the_reasons(hostile):
    """Through the stage: a dripping server and a truncated body are drops with the stage's
    reasons and img2dataset's status fields, beside a good image, all in one batch."""
    stage = Download(
        DownloadOptions(
            timeout_s=TIMEOUT_S, retries=1, backoff_s=0.01, allow_private_addresses=True
        )
    )
    stage.setup()
    paths = ["/drip_headers", "/truncated", "/image"]
    start = time.monotonic()
    batch, reasons = stage.process(
        {"__key__": ["a", "b", "c"], "url": [hostile.base + p for p in paths]}
    )
    elapsed = time.monotonic() - start
    stage.executor.shutdown()
    assert reasons == ["timeout", "connection_error", None]
    assert batch["jpg"][:2] == [None, None] and batch["jpg"][2] == IMAGE
    assert [s.count('"failed_to_download"') for s in batch["json"]] == [1, 1, 0]
    assert elapsed < BOUND_S + 1, f"{elapsed:.1f} s with timeout_s={TIMEOUT_S}"

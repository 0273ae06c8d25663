"""Two parts of a download attempt that used to escape the fetcher's rules: a server's
Retry-After (429/503) was ignored, and the name lookup ran outside `timeout_s`, unbounded
and repeated for every URL of a host.

Lookups are routed through a `Resolver` whose lookup function a test may replace: the resolver
threads, cache and deadline are the real ones; only what "the network" answers is chosen, so
names resolve to loopback and a hung resolver can be made without touching the system's.
"""

from __future__ import annotations

import email.utils
import socket
import threading
import time

import pytest
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import fetch, retry_after, retry_pause
from mmcurate.stages.lib.resolver import Resolver
from mmcurate.stages.lib.url_guard import Failed

from tests.http_corpus import Corpus, photo_bytes

IMAGE = photo_bytes()
POLICY = FetchPolicy(allow_private_addresses=True, retries=2, backoff_s=0.01, timeout_s=1.0)


@pytest.fixture()
def corpus():
    server = Corpus().start()
    server.serve("/img/good", IMAGE)
    yield server
    server.stop()


class Lookups:
    """A lookup function answering loopback for names under `.test`, failing others, and
    counting calls; `hang` makes every call wait until the test releases it."""

    def __init__(self, hang: bool = False) -> None:
        self.calls: list[str] = []
        self.hang, self.release = hang, threading.Event()

    def __call__(self, host: str, port: int, **kwargs: object) -> list[tuple]:
        self.calls.append(host)
        if self.hang:
            self.release.wait(30)
        if not host.endswith(".test"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


def pool_with(lookups: Lookups) -> Connections:
    conns = Connections()
    conns.resolver = Resolver(lookup=lookups)
    return conns


# --- Retry-After ---------------------------------------------------------------------------


def http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.mark.parametrize(
    "value,low,high", [("0", 0, 0), ("7", 7, 7), (" 12 ", 12, 12), (-60, 0, 0), (90, 80, 90)]
)
def test_retry_after_reads_seconds_and_http_dates(value, low, high):
    """Numbers are seconds from now: an HTTP date made when the test runs."""
    text = http_date(value) if isinstance(value, int) else value
    assert low <= retry_after(text) <= high


@pytest.mark.parametrize(
    "value", [None, "", "soon", "-5", "1.5", "Mon, 99 Foo 2026 00:00:00", "²", "1³"]
)
def test_retry_after_that_is_not_understood_is_ignored(value):
    assert retry_after(value) is None


def test_the_pause_before_a_retry_honours_the_servers_wait():
    policy = FetchPolicy(retries=2, backoff_s=0.01, max_retry_after_s=5)
    assert retry_pause(Failed("http_429", True, 429, wait_s=3.0), 1, policy) == 3.0
    assert retry_pause(Failed("http_429", True, 429, wait_s=6.0), 1, policy) is None
    assert 0 <= retry_pause(Failed("http_503", True, 503), 1, policy) <= 0.01
    assert retry_pause(Failed("http_503", True, 503, wait_s=1.0), 3, policy) is None  # spent
    assert retry_pause(Failed("http_404", False, 404, wait_s=0.0), 1, policy) is None


def test_a_short_retry_after_is_waited_out_and_the_image_fetched(corpus):
    url = corpus.busy("/busy/short", "0", times=2)
    result = fetch(Connections(), url, POLICY)
    assert result.reason is None and result.data == IMAGE and result.attempts == 3


def test_a_retry_after_in_the_past_is_retried_at_once(corpus):
    url = corpus.busy("/busy/dated", http_date(-3600))
    result = fetch(Connections(), url, POLICY)
    assert result.data == IMAGE and corpus.hits["/busy/dated"] == 2


def test_a_retry_after_not_understood_is_retried_and_the_connection_kept_sound(corpus):
    """Bug: `Retry-After: ²` (isdigit() says yes, float() says no) raised after the kept-alive
    connection had been handed back and then closed: the URL dropped as `bad_url` untried,
    and the next URL on that connection failed as `fetch_error`."""
    conns = Connections()
    url = corpus.busy("/busy/sup", "²", times=5)
    result = fetch(conns, url, POLICY)
    assert result.reason == "http_429" and result.attempts == 3
    good = fetch(conns, f"{corpus.base}/img/good", POLICY)
    assert good.reason is None and good.data == IMAGE


@pytest.mark.parametrize("value", ["3600", "date"])
def test_a_server_asking_for_a_long_wait_is_not_asked_again(corpus, value):
    """Retrying early would be impolite and waiting an hour would hold the thread: the URL
    drops as `http_429` after one request."""
    value = http_date(3600) if value == "date" else value
    url = corpus.busy(f"/busy/long{len(value)}", value, times=5)
    result = fetch(Connections(), url, POLICY)
    assert result.reason == "http_429" and result.attempts == 1
    assert corpus.hits[f"/busy/long{len(value)}"] == 1


# --- name lookups --------------------------------------------------------------------------


def test_a_hung_name_lookup_is_a_timeout_within_the_attempt(corpus):
    """Before, getaddrinfo ran with no limit: this fetch waited for the resolver (here, until
    the test released it) and then reported whatever the lookup said."""
    lookups = Lookups(hang=True)
    url = f"http://slow.test:{corpus.server_address[1]}/img/good"
    try:
        result = fetch(
            pool_with(lookups),
            url,
            FetchPolicy(allow_private_addresses=True, retries=0, timeout_s=0.5),
        )
    finally:
        lookups.release.set()
    assert result.reason == "timeout" and result.data is None
    assert corpus.connections == 0


@pytest.mark.parametrize("guard", [False, True])
def test_names_are_looked_up_once_per_host_and_the_answer_is_used(corpus, guard):
    """Guard off, the connection dials the resolver's answer (Host header: the URL's name);
    guard on, the same answer (loopback) is refused. Either way one lookup serves every URL of
    the host, and a failed lookup is not repeated for the next URL either."""
    lookups = Lookups()
    conns = pool_with(lookups)
    policy = FetchPolicy(allow_private_addresses=not guard, retries=0, timeout_s=2.0)
    port = corpus.server_address[1]
    results = [fetch(conns, f"http://cdn.test:{port}/img/good", policy) for _ in range(3)]
    dead = [fetch(conns, f"http://gone.example:{port}/img/{i}", policy) for i in range(3)]
    expected = "private_address" if guard else None
    assert [r.reason for r in results] == [expected] * 3
    assert [r.reason for r in dead] == ["dns_error"] * 3
    assert sorted(lookups.calls) == ["cdn.test", "gone.example"]
    assert corpus.hits["/img/good"] == (0 if guard else 3)


def test_concurrent_lookups_of_one_name_share_one_query():
    lookups = Lookups(hang=True)
    resolver = Resolver(lookup=lookups)
    answers: list[tuple[str, ...]] = []
    deadline = time.monotonic() + 10
    threads = [
        threading.Thread(target=lambda: answers.append(resolver.addresses("a.test", 80, deadline)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    lookups.release.set()
    for thread in threads:
        thread.join()
    assert answers == [("127.0.0.1",)] * 8 and lookups.calls == ["a.test"]


def test_an_answer_is_asked_again_after_its_time_to_live():
    lookups = Lookups()
    resolver = Resolver(lookup=lookups, ttl_s=0.0)
    deadline = time.monotonic() + 10
    for _ in range(2):
        assert resolver.addresses("b.test", 80, deadline) == ("127.0.0.1",)
    assert lookups.calls == ["b.test", "b.test"]


def test_names_that_hang_never_hold_up_the_lookup_of_another():
    """Hung lookups each hold a resolver thread past their deadline; a fixed pool of 16 was
    used up by 16 of them, and every other name then timed out behind them."""
    slow = Lookups(hang=True)

    def lookup(host: str, port: int, **kwargs: object) -> list[tuple]:
        if host.startswith("slow"):
            return slow(host, port, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    resolver = Resolver(lookup=lookup)
    try:
        for i in range(40):
            with pytest.raises(TimeoutError):
                resolver.addresses(f"slow{i}.test", 80, time.monotonic() + 0.01)
        assert resolver.addresses("fast.test", 80, time.monotonic() + 10) == ("127.0.0.1",)
    finally:
        slow.release.set()

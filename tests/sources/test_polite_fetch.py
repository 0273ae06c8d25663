"""Polite fetching in `download`: per-host concurrency (counted by the servers), a 429's
Retry-After, a host that keeps failing paused for the rest of the partition."""

from __future__ import annotations

import threading

import pytest
from mmcurate.stages.download import Download, DownloadOptions
from mmcurate.stages.lib.host_limits import HostLimits, interleaved, transient

from tests.host_server import Route, Site, sites, stop_all
from tests.http_corpus import photo_bytes

IMAGE = photo_bytes(size=(64, 48))
HOSTS, PER_HOST, CONCURRENCY = 50, 6, 2


def stage_for(**options) -> Download:
    base = {"allow_private_addresses": True, "backoff_s": 0.01, "optout_timeout_s": 2}
    stage = Download(DownloadOptions(**(base | options)))
    stage.setup()
    return stage


def busy_and_flaky(path: str, number: int) -> Route | None:
    """Every 7th request on a host: 429 with Retry-After 0 or 1; every 10th (offset): 500."""
    if number % 7 == 0:
        return Route(429, b"slow down", {"Retry-After": str(int(number % 14 == 0))})
    if number % 10 == 3:
        return Route(500, b"oops")
    return None


def test_fifty_busy_flaky_hosts_never_see_more_than_the_concurrency():
    """50 loopback hosts answer 429 with Retry-After and fail 10% of requests; 32 threads
    fetch 6 images from each. No host ever handles more than `host_concurrency` requests at
    once (the servers count), and at least 95% of the images arrive."""
    servers = sites(HOSTS)
    try:
        urls = []
        for server in servers:
            server.chaos = busy_and_flaky
            urls += [server.route(f"/img/{i}.jpg", Route(200, IMAGE)) for i in range(PER_HOST)]
        stage = stage_for(threads=32, host_concurrency=CONCURRENCY, retries=3)
        keys = [str(i) for i in range(len(urls))]
        _, reasons = stage.process({"__key__": keys, "url": urls})
        stage.executor.shutdown()
    finally:
        stop_all(servers)
    assert max(server.peak for server in servers) <= CONCURRENCY
    arrived = reasons.count(None)
    assert arrived >= 0.95 * len(urls), {r: reasons.count(r) for r in set(reasons)}


def test_a_host_that_keeps_failing_is_paused_for_the_rest_of_the_partition():
    site, good = Site().start(), Site().start()
    try:
        site.chaos = lambda path, number: None if path == "/robots.txt" else Route(500, b"down")
        urls = [site.base + f"/img/{i}.jpg" for i in range(12)]
        urls.append(good.route("/img/ok.jpg", Route(200, IMAGE)))
        stage = stage_for(threads=1, retries=0, host_pause_after=3)
        keys = [str(i) for i in range(len(urls))]
        _, first = stage.process({"__key__": keys, "url": urls, "__part__": [0] * len(urls)})
        asked = sum(n for path, n in site.hits.items() if path.startswith("/img/"))
        _, again = stage.process({"__key__": keys, "url": urls, "__part__": [0] * len(urls)})
        _, next_part = stage.process({"__key__": keys, "url": urls, "__part__": [1] * len(urls)})
        stage.executor.shutdown()
    finally:
        site.stop()
        good.stop()
    assert first == ["http_500"] * 3 + ["host_paused"] * 9 + [None]
    assert asked == 3  # paused samples send nothing
    assert again == ["host_paused"] * 12 + [None]  # the rest of the partition
    assert next_part == first  # a new partition tries the host again


def test_a_retry_after_holds_the_host_for_every_thread():
    """A host that answers 429 (Retry-After: 1) to any request arriving less than a second
    after its last 429: a client that makes all its threads wait gets exactly one."""
    site = Site().start()
    last_429 = [float("-inf")]
    lock = threading.Lock()

    def busy_once(path: str, number: int) -> Route | None:
        import time

        if not path.startswith("/img/"):
            return None
        with lock:
            now = time.monotonic()
            if number == 4 or now - last_429[0] < 1.0:
                last_429[0] = now
                return Route(429, b"wait", {"Retry-After": "1"})
        return None

    try:
        site.chaos = busy_once
        urls = [site.route(f"/img/{i}.jpg", Route(200, IMAGE)) for i in range(8)]
        stage = stage_for(threads=4, host_concurrency=1, retries=2)
        _, reasons = stage.process({"__key__": [str(i) for i in range(8)], "url": urls})
        stage.executor.shutdown()
    finally:
        site.stop()
    assert reasons == [None] * 8
    assert sum(n for path, n in site.hits.items() if path.startswith("/img/")) == 9


def test_slots_bound_concurrent_holders_per_host():
    limits = HostLimits(concurrency=3)
    inside = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}
    lock = threading.Lock()
    start = threading.Barrier(16)

    def work(host: str) -> None:
        start.wait()
        for _ in range(20):
            with limits.slot(host, 80):
                with lock:
                    inside[host] += 1
                    peak[host] = max(peak[host], inside[host])
                threading.Event().wait(0.001)
                with lock:
                    inside[host] -= 1

    threads = [threading.Thread(target=work, args=("ab"[i % 2],)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak["a"] <= 3 and peak["b"] <= 3
    assert limits.requests() == {"a:80": 160, "b:80": 160}


@pytest.mark.parametrize(
    "reason,expected",
    [
        ("timeout", True),
        ("connection_error", True),
        ("http_429", True),
        ("http_503", True),
        ("http_500", True),
        ("robots_txt_unreachable", True),
        ("http_404", False),
        ("robots_txt_optout", False),
        ("not_image", False),
        (None, False),
    ],
)
def test_which_failures_count_towards_a_pause(reason, expected):
    assert transient(reason) is expected


def test_urls_are_fetched_taking_hosts_in_turn():
    urls = ["http://a/1", "http://A/2", "https://b:8/1", None, "http://a/3?x", "http://c?q/1"]
    assert interleaved(urls) == [0, 2, 3, 5, 1, 4]
    assert interleaved([]) == []


def test_the_report_lists_optouts_per_host_and_the_top_failing_hosts():
    from mmcurate.pipeline.report.hosts import host_section

    def row(host: str, reason: str | None, stage: str | None = "download") -> dict:
        return {"url": f"http://{host}/x.jpg", "drop_reason": reason, "drop_stage": stage}

    rows = [row("a:1", "http_500")] * 3 + [row("b:2", "timeout"), row("b:2", None, None)]
    rows += [row("c:3", "robots_txt_optout"), row("c:3", "tdm_optout")]
    rows += [row("d:4", "decode_error", "decode_image"), {"url": None, "drop_reason": None}]
    page = host_section(rows)
    optouts, failing = page.split("failing hosts")
    assert "<td>c:3</td><td>2</td><td>2</td>" in optouts and "a:1" not in optouts
    assert failing.index("a:1") < failing.index("b:2")  # most failures first
    assert "<td>b:2</td><td>2</td><td>1</td><td>timeout=1</td>" in failing
    assert "d:4" not in page  # another stage's drop is not the host's failure
    assert host_section([row("e:5", None, None)]) == ""

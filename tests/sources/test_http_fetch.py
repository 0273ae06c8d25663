"""The fetcher on its own: sniffing, robots opt-outs, the address guard, retries."""

import pytest
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import Failed, check_url, fetch, robots_optout, sniff

from tests.http_corpus import Corpus, photo_bytes


@pytest.fixture
def corpus():
    server = Corpus().start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "data,column",
    [
        (b"\xff\xd8\xff\xe0rest", "jpg"),
        (b"\x89PNG\r\n\x1a\nrest", "png"),
        (b"GIF89a..", "gif"),
        (b"RIFF\0\0\0\0WEBPVP8 ", "webp"),
        (b"II*\0....", "tiff"),
        (b"<html>", None),
        (b"", None),
    ],
)
def test_sniff(data, column):
    assert sniff(data) == column


@pytest.mark.parametrize(
    "header,opted_out",
    [
        ("noai", True),
        ("noindex, nofollow", True),
        ("NoImageAI", True),
        ("nofollow", False),
        ("otherbot: noai", False),
        ("mmcurate: noai", True),
        ("*: noimageai", True),
    ],
)
def test_robots_directives(header, opted_out):
    assert robots_optout([header], FetchPolicy()) is opted_out


@pytest.mark.parametrize(
    "url,reason",
    [
        ("http://127.0.0.1:9/x", "private_address"),
        ("http://[::1]:9/x", "private_address"),
        ("http://localhost:9/x", "private_address"),
        ("gopher://127.0.0.1/x", "bad_scheme"),
        ("data:image/png;base64,AAAA", "bad_scheme"),
        ("http:///nohost", "bad_url"),
    ],
)
def test_guard_refuses_before_connecting(url, reason):
    with pytest.raises(Failed) as failure:
        check_url(url, FetchPolicy(allow_private_addresses=False))
    assert failure.value.reason == reason


def test_guard_off_allows_loopback():
    check_url("http://127.0.0.1:9/x", FetchPolicy(allow_private_addresses=True))


def test_retries_only_where_they_can_help(corpus):
    corpus.serve("/img/good", photo_bytes())
    pool = Connections()
    policy = FetchPolicy(allow_private_addresses=True, retries=3, backoff_s=0.01)
    assert fetch(pool, f"{corpus.base}/status/410", policy).reason == "http_410"
    assert corpus.hits["/status/410"] == 1
    assert fetch(pool, f"{corpus.base}/status/502", policy).reason == "http_502"
    assert corpus.hits["/status/502"] == 4
    result = fetch(pool, f"{corpus.base}/flaky/429", policy)
    assert result.reason is None and result.attempts == 2 and result.column == "jpg"


def test_byte_cap_without_content_length(corpus):
    body = photo_bytes("astronaut", "PNG", size=(600, 600))
    corpus.serve("/big.png", body, "image/png")
    url = f"{corpus.base}/nolength/big.png"  # the cap must hold while streaming
    policy = FetchPolicy(allow_private_addresses=True, max_bytes=len(body) - 1)
    assert fetch(Connections(), url, policy).reason == "too_large"
    policy = FetchPolicy(allow_private_addresses=True, max_bytes=len(body))
    assert fetch(Connections(), url, policy).data == body


def test_connections_dial_only_the_vetted_addresses(corpus):
    """After the guard vets a host's addresses, the socket goes to those and nowhere else:
    `pinned.invalid` never resolves, yet the request reaches the loopback server, with the
    URL's host in the Host header (so a second DNS answer could not redirect it)."""
    from mmcurate.stages.lib.http_fetch import exchange
    from mmcurate.stages.lib.url_guard import parse_url

    corpus.serve("/img/good", photo_bytes())
    target = parse_url(f"http://pinned.invalid:{corpus.server_address[1]}/img/good")
    policy = FetchPolicy(allow_private_addresses=True)
    reply = exchange(Connections(), target, policy, addresses=("127.0.0.1",))
    assert reply.status == 200 and reply.body == corpus.files["/img/good"][0]
    with pytest.raises(OSError):  # no vetted address: nothing is dialled
        exchange(Connections(), target, policy, addresses=())
    assert corpus.connections == 1


def test_tls_to_a_plain_http_server_is_ssl_error(corpus):
    corpus.serve("/img/good", photo_bytes())
    url = f"https://127.0.0.1:{corpus.server_address[1]}/img/good"
    result = fetch(Connections(), url, FetchPolicy(allow_private_addresses=True, retries=0))
    assert result.reason == "ssl_error"

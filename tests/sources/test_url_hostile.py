"""Hostile URLs and redirects: each is a named drop reason, never an exception, and with the
guard on no spelling of a loopback/private address gets a connection.

Safety: sockets here only ever reach 127.0.0.0/8 or ::1. Addresses elsewhere (NAT64, 6to4,
Teredo, metadata endpoints) are only classified or parsed: with the guard off nothing is
resolved, and with it on an IP literal is judged without DNS and refused before any dial.
"""

from ipaddress import ip_address

import pytest
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import Failed, check_url, fetch
from mmcurate.stages.lib.url_guard import (
    embedded_ipv4,
    is_public_address,
    literal_address,
    parse_url,
    redirect_target,
    vet_addresses,
)

from tests.http_corpus import Corpus, photo_bytes

GUARD_OFF = FetchPolicy(allow_private_addresses=True, retries=0, timeout_s=5)
GUARD_ON = FetchPolicy(allow_private_addresses=False, retries=0, timeout_s=5)


@pytest.fixture
def corpus():
    server = Corpus().start()
    server.serve("/img/good", photo_bytes())
    yield server
    server.stop()


def reason_of(url: object, policy: FetchPolicy = GUARD_OFF) -> str:
    """The parse/guard verdict; with the guard off nothing is resolved or dialled."""
    with pytest.raises(Failed) as failure:
        check_url(url, policy)
    return failure.value.reason


@pytest.mark.parametrize(
    "url,reason",
    [
        ("http://[::1/x.jpg", "bad_url"),  # unbalanced bracket: urlsplit's ValueError
        ("http://[notanip]/x.jpg", "bad_url"),
        ("http://[127.0.0.1]/x.jpg", "bad_url"),  # IPv4 in brackets
        ("http://[fe80::1%25%0d%0a]/x", "bad_url"),  # a zone id smuggling CR LF
        ("http://::1/x.jpg", "bad_url"),  # IPv6 without brackets
        ("http://127.0.0.1:99999/x", "bad_url"),
        ("http://127.0.0.1:65536/x", "bad_url"),
        ("http://127.0.0.1:0/x", "bad_url"),
        ("http://127.0.0.1:-1/x", "bad_url"),
        ("http://127.0.0.1:abc/x", "bad_url"),
        ("http://127.0.0.1:８０/x", "bad_url"),  # fullwidth digits: int() would take them
        ("http://127.0.0.1:80:81/x", "bad_url"),
        ("http://127.0.0.1:" + "9" * 40 + "/x", "bad_url"),
        ("http://user:pw@127.0.0.1/x", "bad_url"),
        ("http://127.0.0.1@127.0.0.2/x", "bad_url"),
        ("http://a.example\\@127.0.0.1/x", "bad_url"),  # parsers split this differently
        ("http://127.0.0.1/x\x00.jpg", "bad_url"),
        ("http://127.0.0.1/x.jpg\r\nX-Injected: 1", "bad_url"),
        ("http://127.0.0.1/a\tb", "bad_url"),
        ("http://127.0.0.1/\x7f", "bad_url"),
        ("http://127.0.0.1/\x85", "bad_url"),  # C1 control
        ("http://127.0.0.1/a\ud800b.jpg", "bad_url"),  # lone surrogate: not encodable
        ("http://127.0.0.1/" + "a" * 9000, "bad_url"),
        ("http://xn--zz.example/x", "bad_url"),  # broken punycode
        ("http://xn--a.example/x", "bad_url"),
        ("http://a..b.example/x", "bad_url"),  # empty label
        ("http://" + "a" * 64 + ".example/x", "bad_url"),  # label over 63
        ("http://" + "abcdefghi." * 26 + "example/x", "bad_url"),  # name over 253
        ("http://exa mple.example/x", "bad_url"),
        ("http://a<b.example/x", "bad_url"),
        ("http://%65xample.example/x", "bad_url"),
        ("http://a\uff20b.example/x", "bad_url"),  # fullwidth @: NFKC trick
        ("http:///nohost", "bad_url"),
        ("http:/x.jpg", "bad_url"),
        ("http://./x.jpg", "bad_url"),
        ("http://:80/x.jpg", "bad_url"),
        (None, "bad_url"),
        (12345, "bad_url"),
        (b"http://127.0.0.1/x.jpg", "bad_url"),
        (["http://127.0.0.1/x.jpg"], "bad_url"),
        ("", "no_url"),
        (" \t\n ", "no_url"),
        ("file:///etc/passwd", "bad_scheme"),
        ("ftp://127.0.0.1/x.jpg", "bad_scheme"),
        ("gopher://127.0.0.1/x", "bad_scheme"),
        ("data:image/png;base64,AAAA", "bad_scheme"),
        ("javascript:alert(1)", "bad_scheme"),
        ("JaVaScRiPt:alert(1)", "bad_scheme"),
        ("mailto:a@b.example", "bad_scheme"),
        ("//127.0.0.1/x.jpg", "bad_scheme"),  # scheme-relative: no base to resolve against
        ("127.0.0.1/x.jpg", "bad_scheme"),
    ],
)
def test_unusable_urls_are_named_reasons(url, reason):
    assert reason_of(url) == reason
    assert fetch(Connections(), url, GUARD_OFF).reason == reason  # nor any exception


@pytest.mark.parametrize(
    "url,host,port,path",
    [
        ("  http://127.0.0.1/x.jpg \n", "127.0.0.1", 80, "/x.jpg"),  # trimmed like browsers do
        ("HTTPS://127.0.0.1:/x.jpg", "127.0.0.1", 443, "/x.jpg"),
        ("http://[::1]:8080/a b?q=é#frag", "::1", 8080, "/a%20b?q=%C3%A9"),
        ("http://[fe80::1%25eth0]:81/x", "fe80::1%eth0", 81, "/x"),
        ("http://Bücher.Example/x", "xn--bcher-kva.example", 80, "/x"),
        ("http://xn--bcher-kva.example./x", "xn--bcher-kva.example.", 80, "/x"),
        ("http://under_score.example", "under_score.example", 80, "/"),
    ],
)
def test_unusual_but_valid_urls_parse(url, host, port, path):
    target = parse_url(url)
    assert (target.host, target.port, target.path) == (host, port, path)


REFUSED = [
    # refused before this change, and still
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "0.0.0.0", "255.255.255.255", "240.0.0.1", "::1", "::", "fe80::1", "fc00::1", "fd00::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
    # multicast: Python calls it global
    "224.0.0.1", "239.255.255.250", "ff02::1", "ff0e::1",
    # IPv6 forms that embed a non-global IPv4 (Python calls most of them global)
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b::c0a8:101",
    "64:ff9b:1::7f00:1", "64:ff9b:1::808:808", "64:ff9b:1:ffff::1",  # local-use NAT64: all
    "::127.0.0.1", "::10.0.0.1", "::169.254.169.254",  # IPv4-compatible
    "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe", "::ffff:0:a00:1",  # SIIT
    "2002:7f00:1::", "2002:a9fe:a9fe::1", "2002:c0a8:101:1::1", "2002:a00:1::",  # 6to4
    "2001:0:808:808:0:0:80ff:fffe",  # Teredo, client 127.0.0.1 (stored XOR-ed)
    "2001:0:7f00:1:0:0:f7f7:f7f7",  # Teredo, server 127.0.0.1, client 8.8.8.8
    "2001:0:808:808:0:0:5601:5601",  # Teredo, client 169.254.169.254
]  # fmt: skip
ALLOWED = ["8.8.8.8", "2001:4860:4860::8888", "64:ff9b::808:808", "2002:808:808::1"]


@pytest.mark.parametrize("address", REFUSED)
def test_guard_refuses_non_public_and_embedded_forms(address):
    assert not is_public_address(ip_address(address))
    host = f"[{address}]" if ":" in address else address
    assert reason_of(f"http://{host}:9/x.jpg", GUARD_ON) == "private_address"  # no DNS, no dial


@pytest.mark.parametrize("address", ALLOWED)
def test_guard_allows_public_and_their_embedded_forms(address):
    assert is_public_address(ip_address(address))  # classification only: nothing is dialled


@pytest.mark.parametrize(
    "address,embedded",
    [
        ("64:ff9b::7f00:1", ["127.0.0.1"]),
        ("::127.0.0.1", ["127.0.0.1"]),
        ("::ffff:127.0.0.1", ["127.0.0.1"]),
        ("::ffff:0:7f00:1", ["127.0.0.1"]),
        ("2002:7f00:1::", ["127.0.0.1"]),
        ("2001:0:808:808:0:0:80ff:fffe", ["8.8.8.8", "127.0.0.1"]),
        ("2001:4860::1", []),
    ],
)
def test_embedded_ipv4_is_found(address, embedded):
    assert [str(a) for a in embedded_ipv4(ip_address(address))] == embedded


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0x7f.1", "127.1", "0177.0.0.1"])
def test_legacy_ipv4_spellings_are_judged_without_dns(host):
    assert str(literal_address(host)) == "127.0.0.1"  # what the resolver would make of it
    assert reason_of(f"http://{host}:9/x", GUARD_ON) == "private_address"


BASE = parse_url("http://images.example/a/b.jpg")  # only parsed, never resolved or dialled


@pytest.mark.parametrize(
    "location,result",
    [
        ("/c.jpg", "http://images.example/c.jpg"),
        ("c.jpg", "http://images.example/a/c.jpg"),
        ("../c.jpg", "http://images.example/c.jpg"),
        ("?size=2", "http://images.example/a/b.jpg?size=2"),
        ("//cdn.example/c.jpg", "http://cdn.example/c.jpg"),
        ("  /c.jpg  ", "http://images.example/c.jpg"),
        ("/caf\u00c3\u00a9.jpg", "http://images.example/café.jpg"),  # UTF-8 read as latin-1
        ("", "bad_redirect"),
        ("   ", "bad_redirect"),
        ("http://[::1/x", "bad_redirect"),
        ("http://images.example:99999/x", "bad_redirect"),
        ("http://images.example:port/x", "bad_redirect"),
        ("http://user:pw@images.example/x", "bad_redirect"),
        ("http://images.example/a\x01b", "bad_redirect"),
        ("/a\tb", "bad_redirect"),
        ("http://xn--zz.example/x", "bad_redirect"),
        ("/" + "a" * 9000, "bad_redirect"),
        ("ftp://images.example/x", "bad_scheme"),
        ("file:///etc/passwd", "bad_scheme"),
        ("javascript:alert(1)", "bad_scheme"),
        ("data:image/png;base64,AAAA", "bad_scheme"),
    ],
)
def test_redirect_targets(location, result):
    if result.startswith("http://"):
        assert redirect_target(BASE, location).url == result
    else:
        with pytest.raises(Failed) as failure:
            redirect_target(BASE, location)
        assert failure.value.reason == result


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.1/x",
        "http://[::1]/x",
        "http://localhost/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/x",
        "http://[64:ff9b::a9fe:a9fe]/x",
        "http://[2002:a9fe:a9fe::]/x",
        "http://2852039166/x",  # 169.254.169.254 in decimal
        "http://0x7f.1/x",
    ],
)
def test_redirect_to_a_private_address_is_refused(location):
    """Each hop goes through the same guard as the first URL (attempt: redirect_target then
    vet_addresses); a public first hop cannot be served here, so the hop is checked alone."""
    with pytest.raises(Failed) as failure:
        vet_addresses(redirect_target(BASE, location), allow_private=False)
    assert failure.value.reason == "private_address"

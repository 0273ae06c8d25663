"""URL parsing and the private-address guard for the fetcher.

A URL list is untrusted input: every way a URL (or a redirect's Location) can be unusable ends
as a `Failed` with a reason (`no_url`, `bad_url`, `bad_scheme`, `private_address`), never as a
ValueError out of urllib, because one bad row must not stop a web-scale build. Parsing is done
once, here, into a `Target` that the connection uses as is (nothing re-parses the URL later).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from urllib.parse import SplitResult, quote, unquote, urljoin, urlsplit

SCHEMES = {"http": 80, "https": 443}
SAFE_PATH = "/%;:@&=+$,!~*'()[]"
C0_AND_SPACE = "".join(map(chr, range(0x21)))
# C0, DEL, C1 and lone surrogates (not encodable): never valid in a URL
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
HOST_LABEL = re.compile(r"[a-z0-9_-]{1,63}")  # after IDNA encoding (underscores occur in the wild)
ZONE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # IPv6 zone (interface) names
LEGACY_IPV4 = re.compile(r"[0-9a-fx.]+")  # 2130706433, 0x7f.1, 0177.0.0.1, 127.1: inet_aton forms
# IPv6 ranges whose low 32 bits are an IPv4 address the packets end up at.
LOW32_IPV4 = tuple(
    ip_network(net)
    for net in (
        "::/96",  # IPv4-compatible (deprecated): ::127.0.0.1
        "::ffff:0:0:0/96",  # SIIT IPv4-translated: ::ffff:0:7f00:1
        "64:ff9b::/96",  # NAT64 well-known prefix: 64:ff9b::7f00:1
    )
)
# Local-use NAT64 (RFC 8215): the operator picks the prefix length, so where the IPv4 address
# sits is unknowable here; the whole range is refused.
LOCAL_NAT64 = ip_network("64:ff9b:1::/48")


class Failed(Exception):
    """A fetch attempt ended with a named reason; `retry` says whether trying again may help."""

    def __init__(
        self,
        reason: str,
        retry: bool = False,
        status: int | None = None,
        wait_s: float | None = None,  # how long the server asked us to wait (Retry-After)
    ) -> None:
        super().__init__(reason)
        self.reason, self.retry, self.status, self.wait_s = reason, retry, status, wait_s


@dataclass(frozen=True)
class Target:
    """A vetted http(s) URL, split the way the connection needs it."""

    url: str  # as given, trimmed: the base that relative redirects resolve against
    scheme: str
    host: str  # ASCII (IDNA-encoded) name, or an IP literal without brackets
    port: int
    path: str  # request target: path and query, percent-encoded

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port


def parse_url(url: object, max_chars: int = 8192) -> Target:
    """The `Target` of an http(s) URL, or Failed: `no_url` (empty), `bad_scheme`, `bad_url`."""
    if not isinstance(url, str):
        raise Failed("bad_url")
    url = url.strip(C0_AND_SPACE)  # common in scraped lists; browsers trim it (WHATWG URL)
    if not url:
        raise Failed("no_url")
    if len(url) > max_chars or CONTROL.search(url):
        raise Failed("bad_url")
    try:
        parts = urlsplit(url)
    except ValueError:  # unbalanced brackets, bad IPv6 literal, NFKC tricks in the netloc
        raise Failed("bad_url") from None
    if parts.scheme not in SCHEMES:
        raise Failed("bad_scheme")
    host, port = split_authority(parts.netloc, SCHEMES[parts.scheme])
    return Target(url, parts.scheme, host, port, request_target(parts))


def split_authority(netloc: str, default_port: int) -> tuple[str, int]:
    """(host, port) of `host[:port]`; userinfo is refused: credentials have no place in a URL
    list, and `good@evil` style authorities are where URL parsers disagree."""
    if "@" in netloc:
        raise Failed("bad_url")
    if netloc.startswith("["):
        literal, closed, tail = netloc[1:].partition("]")
        if not closed:
            raise Failed("bad_url")
        host = ipv6_literal(unquote(literal))
    else:
        host, colon, port_text = netloc.partition(":")
        tail = colon + port_text
        host = ascii_hostname(host)
    if tail in ("", ":"):
        return host, default_port
    digits = tail[1:]
    if not (tail[0] == ":" and digits.isascii() and digits.isdigit() and len(digits) <= 5):
        raise Failed("bad_url")
    if not 0 < int(digits) < 65536:
        raise Failed("bad_url")
    return host, int(digits)


def ipv6_literal(text: str) -> str:
    """A bracketed host: an IPv6 address, with at most a plain zone name (`%25eth0`)."""
    address, percent, zone = text.partition("%")
    if percent and not ZONE.fullmatch(zone):
        raise Failed("bad_url")
    try:
        if isinstance(ip_address(address), IPv6Address):
            return text
    except ValueError:
        pass
    raise Failed("bad_url")


def ascii_hostname(name: str) -> str:
    """The IDNA (ASCII) form of a host name; `bad_url` when it is not a valid one."""
    name = name.lower()
    if not name.strip("."):
        raise Failed("bad_url")
    try:
        encoded = name.encode("idna").decode("ascii")
        encoded.encode("ascii").decode("idna")  # round trip: catches broken xn-- labels
    except UnicodeError:
        raise Failed("bad_url") from None
    labels = encoded.removesuffix(".").split(".")
    if len(encoded) > 253 or not all(HOST_LABEL.fullmatch(label) for label in labels):
        raise Failed("bad_url")
    return encoded


def request_target(parts: SplitResult) -> str:
    """Path and query, percent-encoding what http.client refuses (spaces, non-ASCII)."""
    target = quote(parts.path or "/", safe=SAFE_PATH)
    return f"{target}?{quote(parts.query, safe=SAFE_PATH)}" if parts.query else target


def redirect_target(current: Target, location: str, max_chars: int = 8192) -> Target:
    """Where a redirect leads: relative Locations resolve against the current URL; a broken
    one is `bad_redirect` (the server's fault, not the list's); a bad scheme stays `bad_scheme`."""
    try:  # http.client reads headers as latin-1; servers and browsers mean UTF-8
        location = location.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    location = location.strip(C0_AND_SPACE)
    try:
        if not location or CONTROL.search(location):  # urljoin would drop some silently
            raise Failed("bad_url")
        return parse_url(urljoin_checked(current.url, location), max_chars)
    except Failed as failure:
        if failure.reason in ("bad_url", "no_url"):
            raise Failed("bad_redirect") from None
        raise


def urljoin_checked(base: str, location: str) -> str:
    try:
        return urljoin(base, location)
    except ValueError:
        raise Failed("bad_url") from None


def embedded_ipv4(ip: IPv6Address) -> list[IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, SIIT, NAT64, 6to4,
    Teredo server and client); traffic to it is delivered to those."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.teredo is not None:  # the client address is stored XOR-ed; ipaddress undoes that
        return list(ip.teredo)
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if any(ip in net for net in LOW32_IPV4):
        return [IPv4Address(int(ip) & 0xFFFFFFFF)]
    return []


def is_public_address(ip: IPv4Address | IPv6Address) -> bool:
    """Whether the guard lets a connection go to `ip`. Python's `is_global` alone is not
    enough: it passes multicast and IPv6 forms that embed a loopback or private IPv4."""
    if ip.is_multicast or not ip.is_global:
        return False
    if isinstance(ip, IPv6Address):
        if ip in LOCAL_NAT64:
            return False
        return all(is_public_address(v4) for v4 in embedded_ipv4(ip))
    return True


def literal_address(host: str) -> IPv4Address | IPv6Address | None:
    """The address a host names without DNS: an IP literal, or a legacy IPv4 spelling that the
    resolver would read as one (decimal, hex, octal, short forms)."""
    try:
        return ip_address(host.split("%")[0])
    except ValueError:
        pass
    if LEGACY_IPV4.fullmatch(host):
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def vet_addresses(
    target: Target,
    allow_private: bool,
    resolve: Callable[[str, int], tuple[str, ...]] | None = None,
) -> tuple[str, ...]:
    """The addresses the connection may dial, looked up by `resolve` (default: `lookup`)
    unless the host is an address; `private_address` when the guard is on and any of them is
    not public, so a second DNS answer cannot point the connection elsewhere."""
    literal = literal_address(target.host)
    if literal is not None:
        addresses: tuple[str, ...] = (target.host if ":" in target.host else str(literal),)
    else:
        addresses = (resolve or lookup)(target.host, target.port)
    if allow_private:
        return addresses
    for text in addresses:
        if not is_public_address(ip_address(text.split("%")[0])):
            raise Failed("private_address")
    return addresses


def lookup(host: str, port: int) -> tuple[str, ...]:
    """The host's addresses, with no time limit (the fetcher uses a `Resolver` instead)."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise Failed("dns_error") from None
    return tuple(dict.fromkeys(info[4][0] for info in infos))

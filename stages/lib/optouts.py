"""The host-wide opt-out files `download` honours: robots.txt, /.well-known/tdmrep.json (W3C
TDMRep) and ai.txt (Spawning), each fetched once per origin per worker (the stage instance a
worker keeps across its partitions), shared by the fetching threads and kept for `ttl_s`.

What a file's fetch ends in decides for its URLs:
- robots.txt (RFC 9309): a 200 is parsed (a malformed one loses only its broken lines); a 4xx,
  more than `max_redirects` redirects or a broken redirect mean no robots.txt (allowed); a 5xx
  or a 429 after its retries mean unreachable, which disallows (`robots_txt_unreachable`, as
  RFC 9309 asks) unless `robots_unreachable: allow`. A host that cannot be reached at all
  (timeout, connection refused or lost, TLS failure) is unreachable too, but its samples drop
  under the network's reason (`timeout`, `connection_error`, `ssl_error`), which is what their
  images would have failed with and what a retry of transient failures looks for; one whose
  name does not resolve, or that the address guard refuses, drops as `dns_error` /
  `private_address` whatever `robots_unreachable` says.
- tdmrep.json and ai.txt are optional files: anything but a parsable 200 is no signal.
Drop reasons: `robots_txt_optout`, `robots_txt_unreachable`, `tdm_optout`, `ai_txt_optout`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import attempt, retry_pause
from mmcurate.stages.lib.optout_rules import (
    RuleSet,
    TdmRule,
    parse_robots,
    parse_tdmrep,
    tdm_reserved,
)
from mmcurate.stages.lib.url_guard import Failed, Target

ROBOTS, TDMREP, AI_TXT = "/robots.txt", "/.well-known/tdmrep.json", "/ai.txt"
FILE_BYTES = 2 << 20  # RFC 9309 asks for at least 500 KiB; larger: as a 5xx (too_large)
HOST_REASONS = ("dns_error", "private_address")  # the host's, not the file's
NETWORK_REASONS = ("timeout", "connection_error", "ssl_error")  # the host is unreachable
ABSENT = ("too_many_redirects", "bad_redirect", "bad_scheme", "bad_url")
TYPED = {"jpg": ("jpg", "jpeg"), "tiff": ("tiff", "tif")}  # ai.txt names types by extension


@dataclass(frozen=True)
class HostFile:
    state: str  # found | absent | unreachable | (host reasons: dns_error, private_address)
    rules: Any = None  # found: a RuleSet, or tdmrep.json's rules (None: malformed)


@dataclass(frozen=True)
class OptOutOptions:
    robots_txt: bool = True
    robots_unreachable: str = "disallow"  # or "allow"
    tdm_rep: bool = True
    ai_txt: bool = True
    timeout_s: float = 5.0  # one attempt at one file
    ttl_s: float = 86_400.0  # RFC 9309: a robots.txt may be cached up to a day
    max_origins: int = 10_000


class OptOuts:
    """`before(target, signals)` and `after(target, column, signals)`: a drop reason or None,
    the signals seen written into `signals` (what the sample's json lists)."""

    def __init__(self, options: OptOutOptions, conns: Connections, policy: FetchPolicy) -> None:
        self.options, self.conns = options, conns
        self.policy = replace(
            policy,
            timeout_s=options.timeout_s,
            max_bytes=FILE_BYTES,
            x_robots_tag=False,  # headers of the files themselves say nothing about images
            tdm_rep=False,
        )
        self.files: OrderedDict[tuple, tuple[float, Future]] = OrderedDict()
        self.lock = threading.Lock()

    def before(self, target: Target, signals: dict[str, Any]) -> str | None:
        """robots.txt, then tdmrep.json, then ai.txt on the URL's path (before any request for
        the image: a reserved image is never downloaded)."""
        opts = self.options
        if opts.robots_txt:
            reason = self.robots(target, signals)
            if reason is not None:
                return reason
        if opts.tdm_rep and self.tdm(target, signals):
            return "tdm_optout"
        if opts.ai_txt and not self.ai_allows(target, (target.path,), signals):
            return "ai_txt_optout"
        return None

    def after(
        self, target: Target, final: Target, column: str, signals: dict[str, Any]
    ) -> str | None:
        """Once the image is in: the final URL's host's files when a redirect left the origin,
        and ai.txt's rules for the image's type (`Disallow: *.jpg` covers a JPEG whose URL has
        no extension)."""
        if final.origin != target.origin:
            moved: dict[str, Any] = {}
            reason = self.before(final, moved)
            signals.update({f"final_{name}": value for name, value in moved.items()})
            if reason is not None:
                return reason
        if self.options.ai_txt and not self.ai_allows(final, typed_paths(final.path, column), {}):
            signals["ai_txt"] = "disallowed"
            return "ai_txt_optout"
        return None

    def robots(self, target: Target, signals: dict[str, Any]) -> str | None:
        got = self.file(target, ROBOTS)
        if got.state in HOST_REASONS:
            return got.state
        if got.state == "unreachable" or got.state in NETWORK_REASONS:
            signals["robots_txt"] = "unreachable"
            if self.options.robots_unreachable != "disallow":
                return None
            return "robots_txt_unreachable" if got.state == "unreachable" else got.state
        if got.state == "absent":
            signals["robots_txt"] = "absent"
            return None
        allowed = got.rules.allows(target.path)
        signals["robots_txt"] = "allowed" if allowed else "disallowed"
        return None if allowed else "robots_txt_optout"

    def tdm(self, target: Target, signals: dict[str, Any]) -> bool:
        got = self.file(target, TDMREP)
        if got.state != "found":
            return False
        rules: tuple[TdmRule, ...] | None = got.rules
        if rules is None:
            signals["tdmrep_json"] = "malformed"
            return False
        rule = tdm_reserved(rules, target.path)
        if rule is None:
            signals["tdmrep_json"] = "no_rule"
            return False
        signals["tdmrep_json"] = "reserved" if rule.reserved else "not_reserved"
        if rule.policy:
            signals["tdm_policy"] = rule.policy
        return rule.reserved

    def ai_allows(self, target: Target, paths: tuple[str, ...], signals: dict[str, Any]) -> bool:
        got = self.file(target, AI_TXT)
        if got.state != "found":
            return True
        rules: RuleSet = got.rules
        allowed = all(rules.allows(path) for path in paths)
        signals["ai_txt"] = "allowed" if allowed else "disallowed"
        return allowed

    def file(self, target: Target, name: str) -> HostFile:
        """The origin's copy of `name`: cached, fetched by the first thread that asks (the
        others wait for that one fetch)."""
        key, now = (target.origin, name), time.monotonic()
        with self.lock:
            cached = self.files.get(key)
            mine = cached is None or cached[0] <= now
            if mine:
                future: Future = Future()
                self.files[key] = (now + self.options.ttl_s, future)
                while len(self.files) > 3 * self.options.max_origins:
                    self.files.popitem(last=False)
            else:
                future = cached[1]
            self.files.move_to_end(key)
        if mine:
            try:
                future.set_result(self.fetch_file(origin_url(target) + name, name))
            except BaseException as error:  # a bug: every waiter sees it (fetch_error)
                future.set_exception(error)
        return future.result()

    def fetch_file(self, url: str, name: str) -> HostFile:
        """One file, retried as images are (a 429/503's Retry-After honoured), parsed."""
        tries = 0
        while True:
            tries += 1
            try:
                reply = attempt(self.conns, url, self.policy)
            except Failed as failure:
                pause = retry_pause(failure, tries, self.policy)
                if pause is not None:
                    time.sleep(pause)
                    continue
                return HostFile(failure_state(failure))
            text = bytes(reply.body).decode("utf-8", "replace")
            if name == TDMREP:
                return HostFile("found", parse_tdmrep(text))
            return HostFile("found", parse_robots(text, self.policy.agent))


def failure_state(failure: Failed) -> str:
    """What a file's failed fetch means (see the module's notes)."""
    if failure.reason in HOST_REASONS or failure.reason in NETWORK_REASONS:
        return failure.reason
    if failure.reason in ABSENT:
        return "absent"
    status = failure.status
    if status is not None and 400 <= status < 500 and status != 429:
        return "absent"
    if status is not None and status < 400:  # 204, a 3xx without Location: nothing there
        return "absent"
    return "unreachable"


def origin_url(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = {"http": 80, "https": 443}[target.scheme]
    port = "" if target.port == default else f":{target.port}"
    return f"{target.scheme}://{host}{port}"


def typed_paths(path: str, column: str) -> tuple[str, ...]:
    """`path` as a file of the image's type: itself when its name already ends in one of the
    type's extensions, else with each appended (before any query)."""
    name, mark, query = path.partition("?")
    extensions = TYPED.get(column, (column,))
    if name.lower().endswith(tuple(f".{ext}" for ext in extensions)):
        return (path,)
    return tuple(f"{name}.{ext}{mark}{query}" for ext in extensions)

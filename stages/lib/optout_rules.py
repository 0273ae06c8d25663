"""Parsing of the opt-out files and headers `download` honours, pure of any fetching.

robots.txt and ai.txt share one reader (RFC 9309 rules; ai.txt is written in the same
syntax): groups of `User-agent` lines with their `Allow`/`Disallow` rules, `*` and `$` in
paths, the longest matching rule deciding and `Allow` winning a tie. Written here rather than
taken from urllib.robotparser, which has no wildcards and lets the first matching rule win:
`Disallow: /*.jpg$`, the usual way a site keeps its images out, would not be understood.

tdmrep.json (W3C TDMRep) is a JSON array of `{"location", "tdm-reservation", "tdm-policy"}`;
its locations are path patterns in the same syntax, and the first matching rule applies.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from urllib.parse import unquote

MAX_RULES = 10_000  # per file: a hostile file cannot make matching slow


@dataclass(frozen=True)
class Rule:
    allow: bool
    pattern: str


@dataclass(frozen=True)
class RuleSet:
    """The rules of the groups that apply to one agent (empty: everything allowed)."""

    rules: tuple[Rule, ...] = ()

    def allows(self, path: str) -> bool:
        """Whether `path` (path and query of a URL) may be fetched."""
        path = normal_path(path)
        if path == "/robots.txt":
            return True
        best: Rule | None = None
        for rule in self.rules:
            if not matches(rule.pattern, path):
                continue
            longer = best is None or len(rule.pattern) > len(best.pattern)
            if longer or (len(rule.pattern) == len(best.pattern) and rule.allow):
                best = rule
        return best is None or best.allow


def normal_path(path: str) -> str:
    """Percent-decoded (so `%7E` and `~` compare equal), never empty."""
    path = unquote(path or "/")
    return path if path.startswith("/") else "/" + path


@functools.lru_cache(maxsize=4096)
def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A robots path pattern as a regex anchored at the path's start: `*` any run of
    characters, a final `$` the path's end; everything else literal (a prefix match)."""
    anchored = pattern.endswith("$")
    body = pattern[:-1] if anchored else pattern
    regex = ".*".join(re.escape(part) for part in body.split("*"))
    return re.compile(regex + (r"\Z" if anchored else ""), re.DOTALL)


def matches(pattern: str, path: str) -> bool:
    return pattern_regex(pattern).match(path) is not None


def product_token(user_agent: str) -> str:
    """`mmcurate` of `mmcurate/0.1 (+https://...)`: what robots groups name."""
    token = user_agent.strip().split("/")[0].split()
    return token[0].lower() if token else ""


def parse_robots(text: str, agent: str) -> RuleSet:
    """The rules for `agent` (a product token): those of every group naming it, else those of
    every `*` group, else none. Lines that are not `key: value` are skipped (a malformed file
    loses only its broken lines), as are keys other than user-agent, allow and disallow."""
    groups: list[tuple[set[str], list[Rule]]] = []
    in_agents = False  # the previous line was a user-agent line: agents stack into one group
    for raw in text.lstrip("\ufeff").splitlines():
        key, colon, value = raw.split("#", 1)[0].partition(":")
        key, value = key.strip().lower(), value.strip()
        if not colon:
            continue
        if key in ("user-agent", "useragent"):
            if not in_agents:
                groups.append((set(), []))
            groups[-1][0].add(value.lower())
            in_agents = True
        elif key in ("allow", "disallow") and groups:
            in_agents = False
            if value:  # an empty Disallow allows everything: no rule
                pattern = value if value.startswith(("/", "*")) else "/" + value
                groups[-1][1].append(Rule(key == "allow", normal_path(pattern)))
        elif groups:
            in_agents = False  # crawl-delay, sitemap, ...: ends a run of user-agent lines
    named = [rules for agents, rules in groups if agent and agent in agents]
    chosen = named or [rules for agents, rules in groups if "*" in agents]
    return RuleSet(tuple(rule for rules in chosen for rule in rules)[:MAX_RULES])


@dataclass(frozen=True)
class TdmRule:
    location: str
    reserved: bool
    policy: str | None


def parse_tdmrep(text: str) -> tuple[TdmRule, ...] | None:
    """The rules of a tdmrep.json, in order; None when the file is not such a JSON array
    (malformed: no signal). Entries without a usable location or reservation are skipped."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, list):
        return None
    rules = []
    for entry in data[:MAX_RULES]:
        if not isinstance(entry, dict) or not isinstance(entry.get("location"), str):
            continue
        reserved = tdm_flag(entry.get("tdm-reservation"))
        if reserved is None:
            continue
        policy = entry.get("tdm-policy")
        location = entry["location"].strip() or "/"
        location = location if location.startswith(("/", "*")) else "/" + location
        rules.append(
            TdmRule(normal_path(location), reserved, policy if isinstance(policy, str) else None)
        )
    return tuple(rules)


def tdm_flag(value: object) -> bool | None:
    """TDMRep's reservation value (1 or 0, as a number or a string); None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value in (0, 1):
        return value == 1
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return value.strip() == "1"
    return None


def tdm_reserved(rules: tuple[TdmRule, ...], path: str) -> TdmRule | None:
    """The first rule whose location matches `path`, or None."""
    path = normal_path(path)
    return next((rule for rule in rules if matches(rule.location, path)), None)

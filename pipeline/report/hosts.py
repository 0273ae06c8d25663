"""The report's host section: per host of a URL list, the samples the `download` stage dropped
for an opt-out and for a failure, the hosts with the most of them first (drawn from the same
signature rows as the rest of the page: the first group's, at most REPORT_ROWS)."""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from urllib.parse import urlsplit

OPT_OUTS = frozenset(
    {"robots_txt_optout", "robots_txt_unreachable", "tdm_optout", "ai_txt_optout", "robots_optout"}
)
TOP_HOSTS = 20


def host_of(url: object) -> str | None:
    if not isinstance(url, str):
        return None
    try:
        return urlsplit(url.strip()).netloc.lower() or None
    except ValueError:
        return None


def host_counts(rows: list[dict]) -> dict[str, dict[str, Counter]]:
    """host -> {"samples": n, "optout": reasons, "failed": reasons} for the download drops."""
    hosts: dict[str, dict[str, Counter]] = defaultdict(
        lambda: {"samples": Counter(), "optout": Counter(), "failed": Counter()}
    )
    for row in rows:
        host = host_of(row.get("url"))
        if host is None:
            continue
        counts = hosts[host]
        counts["samples"]["n"] += 1
        stage, reason = row.get("drop_stage") or "", row.get("drop_reason")
        if reason is None or stage.rpartition(":")[2] != "download":
            continue
        counts["optout" if reason in OPT_OUTS else "failed"][reason] += 1
    return hosts


def table(hosts: dict[str, dict[str, Counter]], kind: str, title: str) -> str:
    ranked = sorted(
        (h for h, c in hosts.items() if c[kind]), key=lambda h: (-sum(hosts[h][kind].values()), h)
    )
    if not ranked:
        return ""
    cells = "".join(
        f"<tr><td>{html.escape(h)}</td><td>{hosts[h]['samples']['n']}</td>"
        f"<td>{sum(hosts[h][kind].values())}</td>"
        f"<td>{html.escape(', '.join(f'{r}={n}' for r, n in hosts[h][kind].most_common()))}</td>"
        "</tr>"
        for h in ranked[:TOP_HOSTS]
    )
    head = "<tr><th>host</th><th>samples</th><th>dropped</th><th>by reason</th></tr>"
    return f"<h3>{title}</h3><table>{head}{cells}</table>"


def host_section(rows: list[dict]) -> str:
    """Opt-outs per host and the top failing hosts; empty when the source had no URLs."""
    hosts = host_counts(rows)
    parts = table(hosts, "optout", "Opt-outs per host") + table(
        hosts, "failed", f"Top {TOP_HOSTS} failing hosts"
    )
    return f"<h2>Hosts</h2>{parts}" if parts else ""

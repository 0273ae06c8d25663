"""The limits of one URL fetch (the `download` stage's options): time, size, retries,
redirects, the private-address guard and the opt-outs a response's headers carry (the host-wide
files are stages/lib/optouts.py's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FetchPolicy:
    timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    retries: int = 2
    backoff_s: float = 0.5
    max_retry_after_s: float = 10.0
    max_bytes: int = 20_000_000
    max_redirects: int = 5
    max_url_chars: int = 8192  # longer URLs (and redirect targets) drop as `bad_url`
    user_agent: str = "mmcurate/0.1"
    allow_private_addresses: bool = False
    disallowed_directives: tuple[str, ...] = ("noai", "noimageai", "noindex", "noimageindex")
    x_robots_tag: bool = True  # honour X-Robots-Tag (the directives above): `robots_optout`
    tdm_rep: bool = True  # honour a `tdm-reservation: 1` response header: `tdm_optout`
    agent: str = "mmcurate"  # the product token opt-outs aimed at us name

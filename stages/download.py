"""download: fetch each sample's `url` concurrently inside the task (threads, keep-alive).

Failures are drop reasons: `http_404`, `http_500` (after retries), `timeout`, `too_large`,
`not_image`, `bad_url`, `bad_scheme`, `bad_redirect`, `private_address`,
`dns_error`, `ssl_error`, `connection_error` (a body cut short included), `too_many_redirects`,
`no_url`, and `fetch_error` for anything unforeseen (logged): one URL never stops the build.
Opt-outs, each honoured unless turned off: `robots_txt_optout` and `robots_txt_unreachable`
(robots.txt), `tdm_optout` (TDMRep: the `tdm-reservation` header or tdmrep.json),
`ai_txt_optout` (ai.txt), `robots_optout` (X-Robots-Tag); stages/lib/optouts.py says how each
file's failures count. Politeness (stages/lib/host_limits.py): per-host concurrency and rate,
a host's 429/503 Retry-After held by every thread, and `host_paused` for the samples of a host
that kept failing, for the rest of the partition.

Each fetched sample's json records its provenance: `url`, `http_status`, `final_url` (after
redirects) and `optout` (the opt-out signals seen and what they said); when it was fetched
(UTC) goes into the `fetched_at` column (signatures/), and into the json only with
`fetched_at_in_json`, as it would make a rebuild's shards differ byte for byte.

Memory: a call holds at most the source's `chunk_bytes` of bodies in memory (the fetching
threads share that budget) and no body above `spill_bytes`; the rest streams to the task's
spill folder as it arrives and flows on as Spilled files (core/spill.py), so a URL list's
task keeps to the same bound as the other sources (docs/scale.md).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

from mmcurate.core.formats import IMAGE_COLUMNS, meta_json, sample_meta
from mmcurate.core.spill import MemoryBudget, SpillError, release, task_folder, task_limits
from mmcurate.stages.base import Columns, Stage, StageOptions, register
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.host_limits import HostLimits, interleaved
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import Fetched, SpillTo, fetch
from mmcurate.stages.lib.optout_rules import product_token
from mmcurate.stages.lib.optouts import OptOutOptions, OptOuts
from mmcurate.stages.lib.url_guard import Failed, Target, parse_url
from pydantic import Field

log = logging.getLogger(__name__)


class DownloadOptions(StageOptions):
    timeout_s: float = Field(
        10.0,
        gt=0,
        description="Time limit for one attempt: connect, headers, every redirect, the body.",
    )
    connect_timeout_s: float = Field(5.0, gt=0)
    retries: int = Field(2, ge=0, description="Extra attempts after 429/5xx/connection errors.")
    backoff_s: float = Field(0.5, ge=0, description="Base of the exponential backoff (jittered).")
    max_retry_after_s: float = Field(
        10.0,
        ge=0,
        description="Longest Retry-After honoured; a 429/503 asking for longer is not retried.",
    )
    max_bytes: int = Field(20_000_000, gt=0, description="Larger bodies drop as `too_large`.")
    max_redirects: int = Field(5, ge=0)
    max_url_chars: int = Field(
        8192, gt=0, description="Longer URLs and redirect targets drop as `bad_url`."
    )
    threads: int = Field(32, gt=0, description="Concurrent downloads per task.")
    user_agent: str = "mmcurate/0.1 (+https://github.com/mmcurate/mmcurate)"
    allow_private_addresses: bool = Field(
        False, description="Allow loopback/private targets (off by default: SSRF guard)."
    )
    disallowed_directives: tuple[str, ...] = Field(
        ("noai", "noimageai", "noindex", "noimageindex"),
        description="X-Robots-Tag values that opt an image out.",
    )
    x_robots_tag: bool = Field(True, description="Honour X-Robots-Tag: `robots_optout`.")
    robots_txt: bool = Field(True, description="Honour robots.txt: `robots_txt_optout`.")
    robots_unreachable: Literal["disallow", "allow"] = Field(
        "disallow",
        description="A robots.txt answering 5xx, 429 or not at all: disallow (RFC 9309; "
        "`robots_txt_unreachable`) or allow.",
    )
    robots_agent: str | None = Field(
        None,
        description="Product token robots.txt groups and X-Robots-Tag name us by "
        "(default: the first word of user_agent).",
    )
    tdm_rep: bool = Field(True, description="Honour TDMRep (header and tdmrep.json): `tdm_optout`.")
    ai_txt: bool = Field(True, description="Honour ai.txt: `ai_txt_optout`.")
    optout_timeout_s: float = Field(
        5.0, gt=0, description="Time limit for one attempt at robots.txt, tdmrep.json, ai.txt."
    )
    host_concurrency: int = Field(
        8, ge=1, description="Requests (and connections) in flight per host, per task."
    )
    host_requests_per_s: float = Field(
        0.0, ge=0, description="Request starts per second per host, per task (0: no limit)."
    )
    fetched_at_in_json: bool = Field(
        False,
        description="Also write `fetched_at` into <key>.json (shards then differ between two "
        "builds of one list).",
    )
    host_pause_after: int = Field(
        10,
        ge=0,
        description="Samples of a host failing in a row (timeouts, connection errors, 429, "
        "5xx) that pause it for the rest of the partition: `host_paused` (0: never).",
    )


POLICY_FIELDS = {f.name for f in fields(FetchPolicy)} - {"agent"}


@register
class Download(Stage):
    name = "download"
    Options = DownloadOptions
    io_bound = True

    def setup(self) -> None:
        opts: DownloadOptions = self.options
        agent = (opts.robots_agent or product_token(opts.user_agent)).lower()
        self.policy = FetchPolicy(**opts.model_dump(include=POLICY_FIELDS), agent=agent)
        hosts = HostLimits(opts.host_concurrency, opts.host_requests_per_s)
        self.conns = Connections(opts.host_concurrency, hosts=hosts)
        optout_options = OptOutOptions(
            robots_txt=opts.robots_txt,
            robots_unreachable=opts.robots_unreachable,
            tdm_rep=opts.tdm_rep,
            ai_txt=opts.ai_txt,
            timeout_s=opts.optout_timeout_s,
        )
        self.optouts = OptOuts(optout_options, self.conns, self.policy)
        self.executor = ThreadPoolExecutor(opts.threads, thread_name_prefix="download")
        self.partition: object = None

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        part = (batch.get("__part__") or [None])[0]
        if part != self.partition:  # a host paused in one partition is tried in the next
            self.conns.hosts.new_partition()
            self.partition = part
        urls = batch.get("url") or [None] * size
        spill_bytes, chunk_bytes = task_limits()
        spill = SpillTo(task_folder, spill_bytes, MemoryBudget(chunk_bytes))
        order = interleaved(urls)  # hosts in turn: a list grouped by host keeps threads busy
        fetched = self.executor.map(partial(self.fetch_one, spill=spill), [urls[i] for i in order])
        results: list[Fetched | None] = [None] * size
        for index, result in zip(order, fetched, strict=True):
            results[index] = result
        for col in IMAGE_COLUMNS:
            batch[col] = [r.data if r and r.column == col else None for r in results]
        metas = batch.get("json") or [None] * size
        timed = self.options.fetched_at_in_json
        batch["json"] = [
            add_status(meta, r, url, timed)
            for meta, r, url in zip(metas, results, urls, strict=True)
        ]
        batch["fetched_at"] = [r.fetched_at if r else None for r in results]
        return batch, [r.reason if r else "no_url" for r in results]

    def fetch_one(self, url: Any, spill: SpillTo | None = None) -> Fetched | None:
        """One row's fetch; None when it has no URL. Whatever goes wrong with one URL becomes
        that row's drop reason; only a spill folder that cannot take a body (the machine's
        fault) fails the task."""
        try:
            if url is None or (isinstance(url, str | bytes) and not url.strip()):
                return None
            return self.polite_fetch(url, spill)
        except SpillError:
            raise
        except Exception:  # a bug or an http.client corner we do not know: drop, log, go on
            log.warning("download of %.200r failed unexpectedly", url, exc_info=True)
            return Fetched(reason="fetch_error")

    def polite_fetch(self, url: Any, spill: SpillTo | None) -> Fetched:
        """The host's pause first; then its opt-outs and the image (`checked_fetch`), whose
        outcome counts towards the host's pause."""
        try:
            target = parse_url(url, self.policy.max_url_chars)
        except Failed as failure:
            return Fetched(reason=failure.reason)
        hosts = self.conns.hosts
        if hosts.paused(target.host, target.port):
            return Fetched(reason="host_paused", fetched_at=utc_now())
        result = self.checked_fetch(target, url, spill)
        hosts.record(target.host, target.port, result.reason, self.options.host_pause_after)
        return result

    def checked_fetch(self, target: Target, url: str, spill: SpillTo | None) -> Fetched:
        """The opt-out files first (a reserved image is never requested), then the image,
        then what can only be judged on it (ai.txt by type, a redirect's new host)."""
        signals: dict[str, Any] = {}
        reason = self.optouts.before(target, signals)
        if reason is not None:
            return Fetched(reason=reason, signals=signals, fetched_at=utc_now())
        result = fetch(self.conns, url, self.policy, spill)
        result.fetched_at = utc_now()
        result.signals = signals | result.signals
        if result.reason is None and result.column is not None:
            final = parse_url(result.final_url or url, self.policy.max_url_chars)
            reason = self.optouts.after(target, final, result.column, result.signals)
            if reason is not None:
                release([result.data])
                result.data, result.column, result.reason = None, None, reason
        return result


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def add_status(
    meta: str | bytes | None, result: Fetched | None, url: Any = None, timed: bool = False
) -> str:
    """img2dataset's per-sample fields (status, http status, error, sha256 of the bytes) and
    the provenance: url, final URL, the opt-out signals seen (and with `timed` the time)."""
    fields = sample_meta(meta)
    if result is not None:
        fields.update(
            status="success" if result.reason is None else "failed_to_download",
            http_status=result.status,
            error_message=result.reason,
        )
        if timed and result.fetched_at is not None:
            fields["fetched_at"] = result.fetched_at
        if isinstance(url, str):
            fields.setdefault("url", url)
        if result.final_url is not None:
            fields["final_url"] = result.final_url
        if result.signals:
            fields["optout"] = result.signals
        if result.sha256 is not None:  # of the downloaded bytes, as img2dataset's compute_hash
            fields["sha256"] = result.sha256
    return meta_json(fields, sort_keys=True, ensure_ascii=False)

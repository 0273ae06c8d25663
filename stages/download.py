"""download: fetch each sample's `url` concurrently inside the task (threads, keep-alive).

Failures are drop reasons: `http_404`, `http_500` (after retries), `timeout`, `too_large`,
`not_image`, `robots_optout`, `bad_url`, `bad_scheme`, `bad_redirect`, `private_address`,
`dns_error`, `ssl_error`, `connection_error` (a body cut short included), `too_many_redirects`,
`no_url`, and `fetch_error` for anything unforeseen (logged): one URL never stops the build.

Memory: a call holds at most the source's `chunk_bytes` of bodies in memory (the fetching
threads share that budget) and no body above `spill_bytes`; the rest streams to the task's
spill folder as it arrives and flows on as Spilled files (core/spill.py), so a URL list's
task keeps to the same bound as the other sources (docs/scale.md).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from mmcurate.core.formats import meta_json
from mmcurate.core.spill import MemoryBudget, SpillError, task_folder, task_limits
from mmcurate.stages.base import IMAGE_COLUMNS, Columns, Stage, StageOptions, register, sample_meta
from mmcurate.stages.lib.fetch_policy import FetchPolicy
from mmcurate.stages.lib.http_conn import Connections
from mmcurate.stages.lib.http_fetch import Fetched, SpillTo, fetch
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


@register
class Download(Stage):
    name = "download"
    Options = DownloadOptions
    io_bound = True

    def setup(self) -> None:
        opts: DownloadOptions = self.options
        self.policy = FetchPolicy(**opts.model_dump(exclude={"threads"}))
        self.conns = Connections()
        self.executor = ThreadPoolExecutor(opts.threads, thread_name_prefix="download")

    def process(self, batch: Columns) -> tuple[Columns, list[str | None]]:
        size = len(batch["__key__"])
        urls = batch.get("url") or [None] * size
        spill_bytes, chunk_bytes = task_limits()
        spill = SpillTo(task_folder, spill_bytes, MemoryBudget(chunk_bytes))
        results = list(self.executor.map(partial(self.fetch_one, spill=spill), urls))
        for col in IMAGE_COLUMNS:
            batch[col] = [r.data if r and r.column == col else None for r in results]
        metas = batch.get("json") or [None] * size
        batch["json"] = [add_status(meta, r) for meta, r in zip(metas, results, strict=True)]
        return batch, [r.reason if r else "no_url" for r in results]

    def fetch_one(self, url: Any, spill: SpillTo | None = None) -> Fetched | None:
        """One row's fetch; None when it has no URL. Whatever goes wrong with one URL becomes
        that row's drop reason; only a spill folder that cannot take a body (the machine's
        fault) fails the task."""
        try:
            if url is None or (isinstance(url, str | bytes) and not url.strip()):
                return None
            return fetch(self.conns, url, self.policy, spill)
        except SpillError:
            raise
        except Exception:  # a bug or an http.client corner we do not know: drop, log, go on
            log.warning("download of %.200r failed unexpectedly", url, exc_info=True)
            return Fetched(reason="fetch_error")


def add_status(meta: str | bytes | None, result: Fetched | None) -> str:
    """img2dataset's per-sample fields: status, http status, error, sha256 of the bytes."""
    fields = sample_meta(meta)
    if result is not None:
        fields.update(
            status="success" if result.reason is None else "failed_to_download",
            http_status=result.status,
            error_message=result.reason,
        )
        if result.sha256 is not None:  # of the downloaded bytes, as img2dataset's compute_hash
            fields["sha256"] = result.sha256
    return meta_json(fields, sort_keys=True, ensure_ascii=False)

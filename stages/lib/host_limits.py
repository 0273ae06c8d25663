"""Polite fetching: what one task asks of each host (`host:port`).

- at most `host_concurrency` requests in flight (a request holds its slot from sending to the
  last byte of the reply read; the connections too: see http_conn.Connections);
- request starts at least 1 / `host_requests_per_s` apart (0: no rate limit);
- after a 429 or 503, no request to the host before its Retry-After (at most
  `max_retry_after_s`; `backoff_s` when it gave none) is over, from any thread;
- `host_pause_after` samples in a row failing for transient reasons (timeouts, connection
  errors, 429, 5xx, after their retries) pause the host for the rest of the partition: its
  other samples drop as `host_paused` without a request.

The limits hold per task (a worker runs one partition at a time): a build with W workers may
send a host up to W times as much.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

MAX_HOSTS = 50_000  # idle hosts beyond this are forgotten (their state is then fresh)


def transient(reason: str | None) -> bool:
    """Whether a sample's failure may be the host's passing trouble (counts towards a pause,
    and is what a retry of failed samples would try again)."""
    if reason is None:
        return False
    if reason in ("timeout", "connection_error", "http_429", "robots_txt_unreachable"):
        return True
    return reason.startswith("http_5") and len(reason) == 8


@dataclass
class HostState:
    slots: threading.BoundedSemaphore
    holders: int = 0  # threads waiting for or holding a slot: such a state is never evicted
    next_start: float = 0.0  # monotonic time the next request may start (rate limit)
    not_before: float = 0.0  # monotonic time the host's Retry-After ends
    failures: int = 0  # samples failed in a row (transient reasons)
    paused: bool = False
    requests: int = 0  # started, for the bench and the tests


class HostLimits:
    """The per-host state of one stage instance (a worker), shared by its fetching threads."""

    def __init__(self, concurrency: int = 8, requests_per_s: float = 0.0) -> None:
        self.concurrency, self.requests_per_s = concurrency, requests_per_s
        self.lock = threading.Lock()
        self.hosts: OrderedDict[tuple[str, int], HostState] = OrderedDict()

    def state(self, host: str, port: int) -> HostState:
        """The host's state (made on first use); called under the lock."""
        key = (host, port)
        state = self.hosts.get(key)
        if state is None:
            state = self.hosts[key] = HostState(threading.BoundedSemaphore(self.concurrency))
            self.forget_idle()
        self.hosts.move_to_end(key)
        return state

    def forget_idle(self) -> None:
        """Bound the table: past MAX_HOSTS, the oldest hosts nobody waits on (and not paused)
        go, down to 90% of it (so the scan is paid once per many new hosts)."""
        extra = len(self.hosts) - MAX_HOSTS
        if extra <= 0:
            return
        idle = [k for k, s in self.hosts.items() if s.holders == 0 and not s.paused]
        for key in idle[: extra + MAX_HOSTS // 10]:
            del self.hosts[key]

    @contextmanager
    def slot(self, host: str, port: int) -> Iterator[float]:
        """Hold one of the host's request slots, started no sooner than its rate and any
        Retry-After allow; yields the seconds spent waiting (the caller's deadline moves by
        them: a queue at a busy host is not the URL's timeout)."""
        began = time.monotonic()
        with self.lock:
            state = self.state(host, port)
            state.holders += 1
        try:
            state.slots.acquire()
            try:
                self.wait_turn(state)
                yield time.monotonic() - began
            finally:
                state.slots.release()
        finally:
            with self.lock:
                state.holders -= 1

    def wait_turn(self, state: HostState) -> None:
        """Sleep until this request may start; reserves its start so the next one is spaced."""
        while True:
            with self.lock:
                now = time.monotonic()
                start = max(now, state.next_start, state.not_before)
                if start <= now:
                    interval = 1.0 / self.requests_per_s if self.requests_per_s > 0 else 0.0
                    state.next_start = now + interval
                    state.requests += 1
                    return
            time.sleep(start - now)  # then look again: a 429 may have pushed not_before

    def back_off(self, host: str, port: int, wait_s: float) -> None:
        """A 429/503 asked the host's clients to wait `wait_s` (already bounded)."""
        with self.lock:
            state = self.state(host, port)
            state.not_before = max(state.not_before, time.monotonic() + max(wait_s, 0.0))

    def record(self, host: str, port: int, reason: str | None, pause_after: int) -> None:
        """A sample's outcome: transient failures in a row pause the host (`pause_after`
        0: never); anything else (a success, a 404) resets the count."""
        with self.lock:
            state = self.state(host, port)
            if not transient(reason):
                state.failures = 0
                return
            state.failures += 1
            if pause_after and state.failures >= pause_after:
                state.paused = True

    def paused(self, host: str, port: int) -> bool:
        with self.lock:
            state = self.hosts.get((host, port))
            return state is not None and state.paused

    def new_partition(self) -> None:
        """Pauses and failure counts last for one partition; rate state stays."""
        with self.lock:
            for state in self.hosts.values():
                state.failures, state.paused = 0, False

    def requests(self) -> dict[str, int]:
        """Requests started per `host:port` (the bench's rates)."""
        with self.lock:
            return {f"{h}:{p}": s.requests for (h, p), s in self.hosts.items()}


def host_key(url: object) -> str:
    """A cheap grouping key for ordering (the authority as written; not the vetted host)."""
    if not isinstance(url, str):
        return ""
    rest = url.partition("://")[2]
    return rest.split("/", 1)[0].split("?", 1)[0].lower()


def interleaved(urls: list[object]) -> list[int]:
    """Positions of `urls` taking each host in turn (round robin, first appearance order):
    fetching threads then spread over hosts, where a list grouped by host would queue them all
    at one host's `host_concurrency` while the others wait."""
    groups: dict[str, list[int]] = {}
    for index, url in enumerate(urls):
        groups.setdefault(host_key(url), []).append(index)
    order: list[int] = []
    queues = [iter(group) for group in groups.values()]
    while queues:
        alive = []
        for queue in queues:
            index = next(queue, None)
            if index is not None:
                order.append(index)
                alive.append(queue)
        queues = alive
    return order

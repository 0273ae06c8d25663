"""Host name lookups for the fetcher: bounded by the attempt's deadline, shared and cached.

`getaddrinfo` takes no timeout: a slow or dead resolver held a download thread for as long as
the system's resolver retried (tens of seconds per name), outside `timeout_s`. Here each lookup
runs on a resolver thread (more start while none is idle, up to `max_threads`, so names that
hang never queue the others) and the fetching thread waits only for the time its attempt has
left. Answers (failures too) are kept for `ttl_s`: web-scale URL lists repeat hosts,
and a dead domain is asked about once, not once per URL. Concurrent lookups of one name share
one query.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from queue import SimpleQueue
from typing import Any

from mmcurate.stages.lib.url_guard import Failed

Lookup = Callable[..., list[tuple[Any, ...]]]


class Resolver:
    """`addresses(host, port, deadline)`: the host's addresses, in the resolver's order."""

    def __init__(
        self,
        lookup: Lookup = socket.getaddrinfo,
        ttl_s: float = 300.0,
        max_names: int = 10_000,
        max_threads: int = 256,
    ) -> None:
        self.lookup, self.ttl_s, self.max_names = lookup, ttl_s, max_names
        self.max_threads = max_threads
        self.jobs: SimpleQueue = SimpleQueue()
        self.threads = self.idle = 0  # started on demand: forks stay clean, few run idle
        self.answers: OrderedDict[tuple[str, int], tuple[float, Future]] = OrderedDict()
        self.lock = threading.Lock()

    def addresses(self, host: str, port: int, deadline: float) -> tuple[str, ...]:
        """The addresses, or Failed (`dns_error`); TimeoutError once `deadline` passes first."""
        future = self.query(host, port)
        left = deadline - time.monotonic()
        try:
            return future.result(timeout=max(left, 0.0))
        except FutureTimeout:
            raise TimeoutError("name lookup outlasted the attempt") from None
        except Failed as failure:  # a fresh one: the cached answer is raised in many threads
            raise Failed(failure.reason) from None

    def query(self, host: str, port: int) -> Future:
        """The cached or in-flight answer for (host, port), else a new lookup."""
        key, now = (host, port), time.monotonic()
        with self.lock:
            cached = self.answers.get(key)
            if cached is not None and cached[0] > now:
                self.answers.move_to_end(key)
                return cached[1]
            future: Future = Future()
            self.jobs.put((future, host, port))
            if self.idle == 0 and self.threads < self.max_threads:
                self.start_thread()
            self.answers[key] = (now + self.ttl_s, future)
            while len(self.answers) > self.max_names:
                self.answers.popitem(last=False)
            return future

    def start_thread(self) -> None:
        """One more lookup thread (called under the lock, when none is idle): a name that
        hangs in the resolver holds its thread, never the lookups of other names. Daemon
        threads, unlike an executor's: a hung lookup must not hold up the process's exit."""
        self.threads += 1
        threading.Thread(target=self.work, name=f"resolve-{self.threads}", daemon=True).start()

    def work(self) -> None:
        while True:
            with self.lock:
                self.idle += 1
            future, host, port = self.jobs.get()
            with self.lock:
                self.idle -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.ask(host, port))
            except BaseException as error:  # handed to every waiter
                future.set_exception(error)

    def ask(self, host: str, port: int) -> tuple[str, ...]:
        try:
            infos = self.lookup(host, port, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError, ValueError):  # gaierror, or a name the codec refuses
            raise Failed("dns_error") from None
        addresses = tuple(dict.fromkeys(info[4][0] for info in infos))
        if not addresses:
            raise Failed("dns_error")
        return addresses

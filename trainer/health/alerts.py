"""Webhook alerts (`alerts:` in the train config): one JSON POST per event, sent by rank 0
from a background thread so that a slow or failing webhook never holds up or stops training.

Each POST's body: `{"run", "step", "event", "message", "metrics", "time"}`; `event` is one of
`nonfinite` (a step skipped for a non-finite loss or gradient norm: the first of a streak),
`spike` (a loss spike that triggered health's action), `restore` (the last good checkpoint
reloaded), `data_stall` (a log window's data_wait_frac above alerts.stall_frac), `run_end`
(the run finished, stopped or failed; `metrics` holds its summary when it did not fail),
`gpu_temperature`, `gpu_ecc`, `gpu_throttle` (trainer/health/telemetry.py's rules), `restart`
(torchrun or Ray Train restarted the ranks after a lost one: trainer/resume.py).
Failed attempts (any error: no answer, an HTTP error, an answer that is not HTTP) are retried
`retries` times with backoff (0.5 s, doubling); then the event is dropped with a warning that
names the error's type only (the URL, whose path is a credential, is never logged).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger(__name__)
EVENTS = ("nonfinite", "spike", "restore", "data_stall", "run_end")
# trainer/health/telemetry.py's GPU rules, and an automatic restart after a lost rank
EVENTS += ("gpu_temperature", "gpu_ecc", "gpu_throttle", "restart")
FLUSH_S = 30.0  # longest wait at the end of a run for events still being sent


class Alerts:
    """Sends events to `url` (None: sends nothing) in order, from one daemon thread."""

    def __init__(self, url: str | None, run: str, timeout_s: float = 5.0, retries: int = 3):
        self.url, self.run, self.timeout_s, self.retries = url, run, timeout_s, retries
        self.sent = 0  # events delivered
        self.failed = 0  # events dropped after their last attempt
        self.pending: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        if url:
            self.thread = threading.Thread(target=self.deliver, name="alerts", daemon=True)
            self.thread.start()

    def send(
        self, event: str, step: int, message: str, metrics: dict[str, Any] | None = None
    ) -> None:
        """Queue one event (returns at once)."""
        if event not in EVENTS:
            raise ValueError(f"unknown alert event {event!r}")
        if self.thread is None:
            return
        body = {"run": self.run, "step": step, "event": event, "message": message}
        self.pending.put(body | {"metrics": jsonable(metrics or {}), "time": time.time()})

    def close(self, wait_s: float = FLUSH_S) -> None:
        """Send what is queued (waiting at most `wait_s`), then stop the thread."""
        if self.thread is not None:
            self.pending.put(None)
            self.thread.join(wait_s)
            self.thread = None

    def deliver(self) -> None:
        while (body := self.pending.get()) is not None:
            if self.post(body):
                self.sent += 1
            else:
                self.failed += 1

    def post(self, body: dict[str, Any]) -> bool:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "mmcurate-alerts"}
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(self.url, data=data, headers=headers)
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    if answer.status < 300:
                        return True
            except urllib.error.HTTPError as err:
                problem = f"HTTP {err.code}"
            except Exception as err:  # noqa: BLE001 (any failure: a bad answer, no answer)
                # Its type only: messages can hold the URL, whose path is a credential.
                problem = type(err).__name__
            else:
                problem = f"HTTP {answer.status}"
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        log.warning("alerts: %s event not delivered: %s", body["event"], problem)
        return False


def jsonable(metrics: dict[str, Any]) -> dict[str, Any]:
    """Plain JSON values (NaN and infinities as strings, which strict parsers accept)."""
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
            value = str(value)
        elif not isinstance(value, str | int | float | bool | type(None) | list | dict):
            value = str(value)
        out[name] = value
    return out

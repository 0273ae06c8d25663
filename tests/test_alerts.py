"""trainer/alerts.py against a real HTTP server on 127.0.0.1 started here: the documented
fields arrive, failures are retried a bounded number of times, a dead webhook never raises."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer.alerts import Alerts
from trainer.config import TrainConfig

FIELDS = {"run", "step", "event", "message", "metrics", "time"}


class Webhook:
    """A loopback HTTP server that records every POSTed JSON body; the first `fail`
    requests get HTTP 500."""

    def __init__(self, fail: int = 0) -> None:
        self.bodies: list[dict] = []
        self.requests = 0
        self.fail = fail
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests += 1
                if hook.requests <= hook.fail:
                    self.send_response(500)
                else:
                    hook.bodies.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self) -> list[str]:
        return [body["event"] for body in self.bodies]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    server = Webhook()
    yield server
    server.stop()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_events_arrive_with_the_documented_fields(webhook):
    alerts = Alerts(webhook.url, "run-a")
    alerts.send("nonfinite", 7, "step 7: non-finite loss", {"loss": float("nan"), "lr": 0.1})
    alerts.send("run_end", 9, "finished", {"steps": 9})
    alerts.close()
    assert webhook.events() == ["nonfinite", "run_end"]
    first = webhook.bodies[0]
    assert set(first) == FIELDS and first["run"] == "run-a" and first["step"] == 7
    assert first["metrics"] == {"loss": "nan", "lr": 0.1}  # strict JSON: no bare NaN
    assert alerts.sent == 2 and alerts.failed == 0


def test_a_failing_webhook_is_retried_a_bounded_number_of_times():
    server = Webhook(fail=2)
    try:
        alerts = Alerts(server.url, "run-b", timeout_s=2, retries=2)
        alerts.send("spike", 3, "spike")  # 500, 500, then delivered
        alerts.send("restore", 3, "restored")  # delivered at once
        alerts.close()
        assert server.requests == 4 and server.events() == ["spike", "restore"]
        assert alerts.sent == 2 and alerts.failed == 0
    finally:
        server.stop()


def test_an_unreachable_webhook_drops_the_event_and_never_raises():
    alerts = Alerts(f"http://127.0.0.1:{closed_port()}/hook", "run-c", timeout_s=1, retries=1)
    alerts.send("data_stall", 1, "stalled")
    alerts.close()
    assert alerts.sent == 0 and alerts.failed == 1


def test_the_webhook_url_is_a_secret_in_recorded_configs(tmp_path):
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "m.json"},
            "run": {"output": str(tmp_path)},
            "alerts": {"webhook": "https://hooks.example.com/services/T0/B0/abcdef"},
        }
    )
    assert cfg.redacted()["alerts"]["webhook"] == "https://hooks.example.com/***"
    with pytest.raises(ValueError, match="http"):
        TrainConfig.model_validate(
            {"data": {"manifest": "m"}, "run": {"output": "x"}, "alerts": {"webhook": "ftp://x"}}
        )

"""trainer/health/alerts.py against a real HTTP server on 127.0.0.1 started here: the documented
fields arrive, failures are retried a bounded number of times, a dead webhook never raises."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.health.alerts import Alerts
from mmcurate.trainer.launch import loop_config, worker_config

from tests.kit_alerts import FIELDS, Webhook


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


def test_an_answer_that_is_not_http_fails_one_event_and_later_ones_arrive(caplog):
    """http.client's BadStatusLine is no OSError: it must not end the sender's thread. The
    warning names the error's type, never the URL (its path is a credential)."""
    server = Webhook(garbage=1)
    try:
        alerts = Alerts(server.url, "run-d", timeout_s=2, retries=0)
        alerts.send("spike", 3, "spike")  # answered with garbage: dropped
        alerts.send("restore", 3, "restored")  # delivered
        alerts.send("run_end", 9, "finished")  # delivered
        alerts.close()
        assert server.requests == 3 and server.events() == ["restore", "run_end"]
        assert alerts.sent == 2 and alerts.failed == 1
    finally:
        server.stop()
    assert "spike event not delivered: BadStatusLine" in caplog.text
    assert "secret-token" not in caplog.text and "127.0.0.1" not in caplog.text


SECRET_HOOK = "https://hooks.example.com/services/T0/B0/secret-token"


@pytest.mark.parametrize(
    "webhook", [SECRET_HOOK.replace("B0/", "B0 /"), SECRET_HOOK + "\n", "ftp://x/secret-token"]
)
def test_a_bad_webhook_fails_config_with_one_line_without_the_url(webhook):
    tree = {"data": {"manifest": "m"}, "run": {"output": "x"}, "alerts": {"webhook": webhook}}
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig, tree)
    assert str(err.value) == "alerts.webhook: not an http(s) URL"


def test_ray_trains_loop_config_holds_no_secret_and_the_worker_gets_them_back(tmp_path):
    """launch.mode ray: Ray Train records train_loop_config, so the webhook URL and the
    storage options reach the workers through the worker function instead."""
    options = {"key": "access-key", "secret": "secret-key"}
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "m.json"},
            "run": {"output": str(tmp_path)},
            "alerts": {"webhook": SECRET_HOOK, "run_name": "r"},
            "storage_options": options,
        }
    )
    recorded = loop_config(cfg)
    assert "secret-token" not in json.dumps(recorded) and "secret-key" not in json.dumps(recorded)
    assert recorded["cfg"]["alerts"]["run_name"] == "r"
    rebuilt = worker_config(recorded, options, SECRET_HOOK)
    assert rebuilt == cfg

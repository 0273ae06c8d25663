"""trainer/health/telemetry.py with injected samplers (no GPU here): the alert rules fire exactly
when they say, to a real webhook on 127.0.0.1; readings are taken off the training thread and
reach metrics.jsonl as `gpu/<index>/<name>`; without NVML telemetry says so once."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from mmcurate.core.config_io import ConfigError, validate
from mmcurate.trainer.config import TelemetryConfig, TrainConfig
from mmcurate.trainer.health.alerts import Alerts
from mmcurate.trainer.health.telemetry import GpuReading, GpuRules, Telemetry, open_telemetry

from tests.kit_alerts import FIELDS, Webhook
from tests.kit_shards import write_uneven_shards
from tests.telemetry_samplers import READINGS_ENV, ScriptedSampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    server = Webhook()
    yield server
    server.stop()


def gpu(temp: float = 60.0, ecc: int = 0, reasons: tuple[str, ...] = (), index: int = 0):
    return GpuReading(index, temp, 300.0, 40 * 2**30, 80 * 2**30, ecc, reasons)


def test_temperature_alerts_once_per_streak_of_n_hot_samples():
    rules = GpuRules(TelemetryConfig(temperature_samples=3))  # > 85 C, 3 in a row
    temps = [86, 90, 70, 86, 87, 88, 89, 90, 85, 86, 86, 86]
    fired = [bool(rules.check([gpu(t)])) for t in temps]
    # 3rd hot in a row at index 5 and (85 C is not above 85) again at index 11; once each
    assert [i for i, f in enumerate(fired) if f] == [5, 11]


def test_the_temperature_rule_counts_each_gpu_on_its_own():
    rules = GpuRules(TelemetryConfig(temperature_samples=2))
    assert rules.check([gpu(90, index=0), gpu(50, index=1)]) == []
    events = rules.check([gpu(91, index=0), gpu(90, index=1)])
    assert events == [("gpu_temperature", "GPU 0: 91 C, above 85 C for 2 samples")]


def test_ecc_alerts_on_each_new_error_not_on_the_baseline():
    rules = GpuRules(TelemetryConfig())
    counts = [4, 4, 5, 5, 7, 7]  # the run starts with 4 (baseline), then +1, then +2
    events = [rules.check([gpu(ecc=c)]) for c in counts]
    assert [i for i, e in enumerate(events) if e] == [2, 4]
    assert events[4] == [
        ("gpu_ecc", "GPU 0: 2 new uncorrected ECC errors (7 since the driver loaded)")
    ]
    quiet = GpuRules(TelemetryConfig(alert_ecc=False))
    assert not any(quiet.check([gpu(ecc=c)]) for c in counts)


def test_throttle_alerts_when_a_listed_reason_starts():
    rules = GpuRules(TelemetryConfig())  # power capping is not listed by default
    samples = [
        (),
        ("sw_power_cap",),
        ("hw_slowdown",),
        ("hw_slowdown",),
        (),
        ("hw_slowdown", "hw_thermal_slowdown"),
    ]
    events = [rules.check([gpu(reasons=r)]) for r in samples]
    assert [i for i, e in enumerate(events) if e] == [2, 5]
    assert events[5] == [
        ("gpu_throttle", "GPU 0: clocks throttled (hw_slowdown, hw_thermal_slowdown)")
    ]


def test_sampled_alerts_reach_the_webhook_with_the_step(webhook):
    """Telemetry.sample, as its thread calls it: each rule's event arrives once, in order."""
    script = [
        [gpu(90)],
        [gpu(91, ecc=1)],
        [gpu(92, ecc=1, reasons=("hw_slowdown",))],
        [gpu(70, ecc=1)],
    ]
    alerts = Alerts(webhook.url, "gpu-run")
    telemetry = Telemetry(TelemetryConfig(temperature_samples=2), ScriptedSampler(script), alerts)
    for step in range(4):
        telemetry.step = step + 10
        telemetry.sample()
    alerts.close()
    assert webhook.events() == ["gpu_temperature", "gpu_ecc", "gpu_throttle"]
    assert [b["step"] for b in webhook.bodies] == [11, 11, 12]
    first = webhook.bodies[0]
    assert set(first) == FIELDS and first["run"] == "gpu-run"
    assert first["metrics"]["gpu/0/temperature_c"] == 91.0
    assert telemetry.fields()["gpu/0/temperature_c"] == 70.0  # the newest reading


def test_samples_are_taken_off_the_training_thread():
    sampler = ScriptedSampler([[gpu()]])
    sampler.wanted = 4
    telemetry = Telemetry(TelemetryConfig(every_s=0.01), sampler, Alerts(None, "r")).start()
    try:
        assert sampler.read_enough.wait(60)
    finally:
        telemetry.stop()
    assert sampler.threads[0] == "MainThread"  # start's first sample: the first row has it
    assert set(sampler.threads[1:]) == {"telemetry"}
    assert telemetry.thread is None and telemetry.samples == sampler.reads


def test_a_failing_sampler_is_counted_and_never_raises(caplog):
    from tests.telemetry_samplers import broken

    telemetry = Telemetry(TelemetryConfig(), broken(), Alerts(None, "r"))
    with caplog.at_level(logging.WARNING):
        telemetry.sample()
        telemetry.sample()
    assert telemetry.errors == 2 and telemetry.fields() == {}
    assert caplog.text.count("telemetry: a sample failed (OSError") == 1


def test_without_nvml_telemetry_is_unavailable_once(tmp_path, caplog):
    """This machine has no NVIDIA driver: the default (NVML) sampler reports it once."""
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "m"},
            "run": {"output": str(tmp_path)},
            "telemetry": {"enabled": True},
        }
    )
    with caplog.at_level(logging.WARNING):
        telemetry = open_telemetry(cfg, 0, 0, Alerts(None, "r"))
    if telemetry is not None:  # a machine with a GPU driver: real readings instead
        telemetry.stop()
        assert any(name.startswith("gpu/0/") for name in telemetry.fields())
        return
    assert caplog.text.count("telemetry: unavailable") == 1
    assert open_telemetry(cfg, 1, 1, Alerts(None, "r")) is None  # local rank 1 never samples


@pytest.mark.parametrize(
    ("section", "line"),
    [
        (
            {"alert_throttle": ["hw_slowdwn"]},
            "telemetry.alert_throttle: unknown throttle reason 'hw_slowdwn'",
        ),
        ({"sampler": "no_colon"}, "telemetry.sampler: expected 'module:callable'"),
        ({"every_s": 0}, "telemetry.every_s:"),
    ],
)
def test_a_bad_telemetry_section_fails_in_one_line(section, line):
    tree = {"data": {"manifest": "m"}, "run": {"output": "o"}, "telemetry": section}
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig, tree)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_a_sampler_that_does_not_import_fails_in_one_line(tmp_path):
    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": "m"},
            "run": {"output": str(tmp_path)},
            "telemetry": {"enabled": True, "sampler": "tests.no_such_module:make"},
        }
    )
    with pytest.raises(
        ConfigError, match="^telemetry.sampler: cannot load 'tests.no_such_module:make'"
    ):
        open_telemetry(cfg, 0, 0, Alerts(None, "r"))


def test_a_training_run_logs_readings_and_alerts(tmp_path, monkeypatch, webhook):
    """A real (tiny, CPU) run with the scripted sampler: every metrics row holds the GPUs'
    readings, the hot GPU's alert arrives once, before run_end."""
    from mmcurate.trainer.train import train

    hot = [
        {"index": 0, "temperature_c": 95.0, "power_w": 250.0, "ecc_errors": 0},
        {"index": 1, "temperature_c": 60.0, "power_w": 200.0, "ecc_errors": 0},
    ]
    monkeypatch.setenv(READINGS_ENV, json.dumps([hot]))
    (tmp_path / "shards").mkdir()
    manifest = write_uneven_shards(tmp_path / "shards", sizes=(24,))
    output = tmp_path / "run"
    tree = {
        "data": {"manifest": str(manifest), "batch_size": 8, "workers": 0},
        "run": {"output": str(output), "max_steps": 3, "log_every": 1},
        "alerts": {"webhook": webhook.url, "stall_frac": None},
        "telemetry": {
            "enabled": True,
            "every_s": 3600,
            "temperature_samples": 1,
            "sampler": "tests.telemetry_samplers:scripted",
        },
    }
    summary = train(TrainConfig.model_validate(tree))
    assert summary["steps"] == 3
    rows = [json.loads(line) for line in Path(output / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert all(r["gpu/0/temperature_c"] == 95.0 and r["gpu/1/power_w"] == 200.0 for r in rows)
    assert all(r["gpu/0/throttled"] == 0.0 for r in rows)
    assert webhook.events() == ["gpu_temperature", "run_end"]
    assert "GPU 0: 95 C" in webhook.bodies[0]["message"]

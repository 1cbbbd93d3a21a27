"""The [[upstreams]] config: defaults, and mistakes refused with the key named."""

from __future__ import annotations

from typing import Any

import pytest

from edgeserve.config.server import ConfigError, ServerConfig


def config(*upstreams: dict[str, Any]) -> dict[str, Any]:
    return {"models": {"digits-m": {"slo_ms": 20}}, "upstreams": list(upstreams)}


def test_an_upstream_with_defaults() -> None:
    (up,) = ServerConfig.from_dict(
        config({"url": "http://10.0.0.5:8000/", "models": {"digits-m": {}}})
    ).upstreams
    assert up.name == "10.0.0.5:8000" and up.url == "http://10.0.0.5:8000" and up.protocol == "oip-http"
    assert (up.timeout_ms, up.max_in_flight, up.binary, up.failures_to_open) == (200.0, 8, True, 3)
    model = up.models["digits-m"]
    assert (model.remote, model.input, model.output, model.service_ms) == ("digits-m", "x", "logits", None)
    assert ServerConfig.from_dict({"models": {"digits-m": {"slo_ms": 20}}}).upstreams == ()


def test_every_key_of_the_documented_example_is_read(tmp_path: Any) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(
        """
[models.digits-m]
slo_ms = 20

[[upstreams]]
name = "gpu-server"
url = "http://10.0.0.5:8000"
protocol = "oip-http"
timeout_ms = 150
max_in_flight = 4
max_batch = 16
binary = false
send_deadline = false
failures_to_open = 2
cooldown_s = 0.5
max_cooldown_s = 10
probe_interval_s = 1
[upstreams.models.digits-m]
remote = "digits"
input = "input-0"
output = "predict"
service_ms = 3
"""
    )
    (up,) = ServerConfig.from_toml(path).upstreams
    assert (up.name, up.timeout_ms, up.max_in_flight, up.max_batch, up.binary) == (
        "gpu-server",
        150,
        4,
        16,
        False,
    )
    assert up.send_deadline is False
    assert (up.failures_to_open, up.cooldown_s, up.max_cooldown_s, up.probe_interval_s) == (2, 0.5, 10, 1)
    model = up.models["digits-m"]
    assert (model.remote, model.input, model.output, model.service_ms) == ("digits", "input-0", "predict", 3)


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ({"models": {"digits-m": {}}}, "upstreams[0].url: missing"),
        ({"url": "10.0.0.5:8000", "models": {"digits-m": {}}}, "upstreams[0].url: must be an http URL"),
        ({"url": "http://h:99999", "models": {"digits-m": {}}}, "upstreams[0].url: bad port"),
        (
            {"url": "http://h:1", "protocol": "grpc", "models": {"digits-m": {}}},
            "upstreams[0].protocol: 'grpc'",
        ),
        ({"url": "http://h:1"}, "upstreams[0].models: missing"),
        (
            {"url": "http://h:1", "models": {"digits-x": {}}},
            "upstreams[0].models.digits-x: not a served model",
        ),
        (
            {"url": "http://h:1", "models": {"digits-m": {"outptu": "y"}}},
            "upstreams[0].models.digits-m.outptu",
        ),
        ({"url": "http://h:1", "timeout_ms": 0, "models": {"digits-m": {}}}, "upstreams[0].timeout_ms"),
        ({"url": "http://h:1", "name": "local", "models": {"digits-m": {}}}, "upstreams[0].name"),
        (
            {"url": "http://h:1", "cooldown_s": 5, "max_cooldown_s": 1, "models": {"digits-m": {}}},
            "upstreams[0].max_cooldown_s",
        ),
        (
            {"url": "http://h:1", "retries": 2, "models": {"digits-m": {}}},
            "upstreams[0].retries: unknown key",
        ),
    ],
)
def test_mistakes_name_the_key(upstream: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ServerConfig.from_dict(config(upstream))


def test_two_upstreams_may_not_share_a_name() -> None:
    up = {"url": "http://h:1", "name": "gpu", "models": {"digits-m": {}}}
    with pytest.raises(ConfigError, match=r"upstreams\[1\].name: 'gpu' is used twice"):
        ServerConfig.from_dict(config(up, up))

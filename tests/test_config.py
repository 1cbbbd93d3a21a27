"""Server configuration: TOML and dict forms agree, and every mistake names its key path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from edgeserve.runtime.config import (
    DEFAULT_MAX_QUEUE,
    BackendConfig,
    ConfigError,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)

DATA = Path(__file__).parent / "data"
DOCS = Path(__file__).parent.parent / "docs" / "runtime.md"


def _minimal(**extra: Any) -> dict[str, Any]:
    return {"models": {"digits-m": {"slo_ms": 50}}, **extra}


def test_example_toml_reads_into_the_documented_structure() -> None:
    config = ServerConfig.from_toml(DATA / "server.toml")
    assert config.repository == DATA / "engines"
    assert list(config.models) == ["digits-s", "digits-m"]  # file order is the scheduling order
    assert config.models["digits-s"] == ModelConfig(slo_ms=20.0, max_queue=32)
    assert config.models["digits-m"] == ModelConfig(slo_ms=50.0, max_queue=DEFAULT_MAX_QUEUE)
    assert config.backend == BackendConfig(name="onnxruntime", threads=1, providers=("cpu",), warmup=3)
    assert config.scheduler == SchedulerConfig(
        policy="stability-safe", quantile="p95", max_batch=8, urgency_clip=10.0, late_tasks="expire"
    )
    assert config.shutdown_timeout_s == 5.0


def test_the_toml_example_in_the_docs_is_valid(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks, f"{DOCS} has no ```toml example"
    (tmp_path / "serve.toml").write_text(blocks[0])
    config = ServerConfig.from_toml(tmp_path / "serve.toml")
    assert list(config.models) == ["digits-s", "digits-m"]
    assert config.repository == tmp_path / "engines"


def test_defaults_fill_everything_but_the_models() -> None:
    config = ServerConfig.from_dict(_minimal())
    assert config.repository == Path("engines")
    assert config.backend == BackendConfig()
    assert config.scheduler == SchedulerConfig()
    assert config.scheduler.late_tasks == "serve"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"models": {"digits-m": {"slo_ms": -1}}},
            "models.digits-m.slo_ms: must be a positive number, got -1",
        ),
        ({"models": {"digits-m": {"slo_ms": "fast"}}}, "models.digits-m.slo_ms: must be a positive number"),
        ({"models": {"digits-m": {}}}, "models.digits-m.slo_ms: missing"),
        ({"models": {"digits-m": {"slo_mss": 5, "slo_ms": 5}}}, "models.digits-m.slo_mss: unknown key"),
        (
            {"models": {"digits-m": {"slo_ms": 5, "max_queue": 0}}},
            "models.digits-m.max_queue: must be an integer",
        ),
        ({"models": {"digits-m": {"slo_ms": 5, "max_queue": 2.5}}}, "models.digits-m.max_queue"),
        ({"models": {}}, "models: must name at least one model"),
        ({}, "models: missing"),
        (_minimal(modles={}), "modles: unknown key"),
        (_minimal(backend={"name": "tensorflow"}), "backend.name: must be one of onnxruntime"),
        (_minimal(backend={"threads": 0}), "backend.threads: must be an integer >= 1, got 0"),
        (_minimal(backend={"threads": True}), "backend.threads"),
        (_minimal(backend={"providers": "cpu"}), "backend.providers: must be a list"),
        (_minimal(backend={"thread": 1}), "backend.thread: unknown key"),
        (_minimal(scheduler={"policy": "fastest"}), "scheduler.policy: must be one of"),
        (_minimal(scheduler={"late_tasks": "drop"}), "scheduler.late_tasks: must be one of serve, expire"),
        (_minimal(scheduler={"quantile": "p42"}), "scheduler.quantile"),
        (_minimal(scheduler={"urgency": "linear"}), "scheduler.urgency"),
        (_minimal(scheduler={"urgency_clip": 0}), "scheduler.urgency_clip: must be a positive number"),
        (_minimal(scheduler={"max_batch": 0}), "scheduler.max_batch"),
        (_minimal(scheduler=[1]), "scheduler: must be a table"),
        (_minimal(shutdown_timeout_s=0), "shutdown_timeout_s: must be a positive number"),
    ],
)
def test_invalid_config_fails_naming_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ServerConfig.from_dict(data)
    assert message in str(info.value)


def test_toml_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[models.digits-m]\nslo_ms = -3\n")
    with pytest.raises(
        ConfigError, match=r"serve\.toml: models\.digits-m\.slo_ms: must be a positive number"
    ):
        ServerConfig.from_toml(path)
    path.write_text("[models.digits-m\n")
    with pytest.raises(ConfigError, match=r"serve\.toml: not valid TOML"):
        ServerConfig.from_toml(path)
    with pytest.raises(ConfigError, match="config file not found"):
        ServerConfig.from_toml(tmp_path / "missing.toml")


def test_server_refuses_a_bad_config_before_loading_anything() -> None:
    from edgeserve import Server

    with pytest.raises(ConfigError, match=r"models\.digits-m\.slo_ms"):
        Server({"repository": "/nonexistent", "models": {"digits-m": {"slo_ms": 0}}})


def test_backend_precision_and_device_are_checked_and_kept() -> None:
    config = ServerConfig.from_dict(
        {
            "models": {"m": {"slo_ms": 50}},
            "backend": {"name": "torch", "device": "cuda:1", "precision": "fp16"},
        }
    )
    assert (config.backend.device, config.backend.precision) == ("cuda:1", "fp16")
    with pytest.raises(ConfigError, match=r"backend\.device"):
        ServerConfig.from_dict({"models": {"m": {"slo_ms": 50}}, "backend": {"device": "gpu0"}})
    with pytest.raises(ConfigError, match=r"backend\.precision"):
        ServerConfig.from_dict({"models": {"m": {"slo_ms": 50}}, "backend": {"precision": "int8"}})

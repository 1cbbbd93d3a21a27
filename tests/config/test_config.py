"""Server configuration: TOML and dict forms agree, and every mistake names its key path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from repo_paths import DATA, REPO

from edgeserve.config.server import (
    BackendConfig,
    ConfigError,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)

DOCS = REPO / "docs" / "runtime.md"


def _minimal(**extra: Any) -> dict[str, Any]:
    return {"models": {"digits-m": {"slo_ms": 50}}, **extra}


def test_example_toml_reads_into_the_documented_structure() -> None:
    config = ServerConfig.from_toml(DATA / "server.toml")
    assert config.repository == DATA / "engines"
    assert list(config.models) == ["digits-s", "digits-m"]  # file order is the scheduling order
    assert config.models["digits-s"] == ModelConfig(slo_ms=20.0, max_queue=32)
    assert config.models["digits-m"] == ModelConfig(slo_ms=50.0, max_queue=None)
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


def test_backend_inline_max_ms_defaults_to_one_and_takes_zero_but_not_negative() -> None:
    models = {"m": {"slo_ms": 50}}
    assert ServerConfig.from_dict({"models": models}).backend.inline_max_ms == 1.0
    assert (
        ServerConfig.from_dict({"models": models, "backend": {"inline_max_ms": 0}}).backend.inline_max_ms == 0
    )
    with pytest.raises(ConfigError, match=r"backend\.inline_max_ms"):
        ServerConfig.from_dict({"models": models, "backend": {"inline_max_ms": -1}})


def test_backend_idle_poll_us_defaults_to_200_and_takes_zero_but_not_negative_or_text() -> None:
    models = {"m": {"slo_ms": 50}}
    assert ServerConfig.from_dict({"models": models}).backend.idle_poll_us == 200.0
    backend = ServerConfig.from_dict({"models": models, "backend": {"idle_poll_us": 0}}).backend
    assert backend.idle_poll_us == 0
    for bad in (-1, "fast"):
        with pytest.raises(ConfigError, match=r"backend\.idle_poll_us"):
            ServerConfig.from_dict({"models": models, "backend": {"idle_poll_us": bad}})


def test_backend_loop_slice_us_defaults_to_100_and_takes_zero_or_the_kernels_range() -> None:
    models = {"m": {"slo_ms": 50}}
    assert ServerConfig.from_dict({"models": models}).backend.loop_slice_us == 100.0
    for good in (0, 100, 2500.5, 100_000):
        backend = ServerConfig.from_dict({"models": models, "backend": {"loop_slice_us": good}}).backend
        assert backend.loop_slice_us == good
    for bad in (-1, 50, 100_001, "short", True):
        with pytest.raises(ConfigError, match=r"backend\.loop_slice_us"):
            ServerConfig.from_dict({"models": models, "backend": {"loop_slice_us": bad}})


def test_backend_compose_exits_is_auto_true_or_false() -> None:
    models = {"m": {"slo_ms": 50}}

    def compose(value: Any) -> bool | None:
        return ServerConfig.from_dict(
            {"models": models, "backend": {"compose_exits": value}}
        ).backend.compose_exits

    assert ServerConfig.from_dict({"models": models}).backend.compose_exits is None
    assert (compose("auto"), compose(True), compose(False)) == (None, True, False)
    with pytest.raises(ConfigError, match=r'backend\.compose_exits: must be "auto", true or false'):
        compose("yes")


def test_listen_reply_margin_ms_defaults_to_half_a_millisecond_and_takes_zero_but_not_negative() -> None:
    models = {"m": {"slo_ms": 50}}
    assert ServerConfig.from_dict({"models": models}).listen.reply_margin_ms == 0.5
    listen = ServerConfig.from_dict({"models": models, "listen": {"reply_margin_ms": 0}}).listen
    assert listen.reply_margin_ms == 0
    for bad in (-1, "1", float("nan")):
        with pytest.raises(ConfigError, match=r"listen\.reply_margin_ms"):
            ServerConfig.from_dict({"models": models, "listen": {"reply_margin_ms": bad}})


def test_listen_and_preprocess_tables_read_into_their_dataclasses(tmp_path: Path) -> None:
    from edgeserve.config.server import ListenConfig, PreprocessConfig

    path = tmp_path / "serve.toml"
    path.write_text(
        "[models.digits-m]\nslo_ms = 10\n"
        '[models.digits-m.preprocess]\nresize = [28, 28]\nmean = [0.5]\nstd = [0.25]\nchannels = "gray"\n'
        '[listen]\nunix = "run/edgeserve.sock"\nunix_mode = "0600"\ntcp = ":7070"\ntoken = "t0k"\n'
        "max_frame_bytes = 65536\nmax_in_flight = 4\nmax_in_flight_total = 12\n"
    )
    config = ServerConfig.from_toml(path)
    assert config.listen == ListenConfig(
        unix=tmp_path / "run" / "edgeserve.sock",
        unix_mode=0o600,
        tcp=("127.0.0.1", 7070),
        token="t0k",
        max_frame_bytes=65536,
        max_in_flight=4,
        max_in_flight_total=12,
    )
    assert config.models["digits-m"].preprocess == PreprocessConfig(
        resize=(28, 28), mean=(0.5,), std=(0.25,), channels="gray"
    )
    default = ServerConfig.from_dict(_minimal())
    assert default.listen == ListenConfig() and default.models["digits-m"].preprocess is None


def test_the_in_flight_total_defaults_to_four_windows() -> None:
    from edgeserve.config.server import ListenConfig

    assert ListenConfig(max_in_flight=8).in_flight_total == 32
    assert ListenConfig(max_in_flight=64).in_flight_total == 256  # one client pipelining deep: not capped
    assert ListenConfig(max_in_flight=64, max_in_flight_total=40).in_flight_total == 40


def test_unset_windows_are_derived_from_the_servers_bound() -> None:
    from edgeserve.config.server import ListenConfig

    with pytest.raises(ValueError, match="resolved"):
        _ = ListenConfig().in_flight_total
    derived = ListenConfig().resolved(10, 900)
    assert (derived.max_in_flight, derived.in_flight_total) == (10, 900)
    assert ListenConfig(max_in_flight_total=4).resolved(10, 900).max_in_flight == 4
    assert ListenConfig(max_in_flight=8).resolved(10, 900) == ListenConfig(max_in_flight=8)  # explicit: kept


def test_the_http_limits_have_defaults_and_read_from_the_listen_table() -> None:
    from edgeserve.config.server import ListenConfig

    default = ServerConfig.from_dict(_minimal()).listen
    assert (default.http_max_connections, default.http_max_connections_per_listener) == (None, None)
    assert (default.http_header_timeout_s, default.http_body_timeout_s) == (10.0, 10.0)
    assert (default.http_body_min_rate, default.http_keepalive_timeout_s) == (256 * 1024, 75.0)
    assert default.decode_budget_bytes == 16 * default.max_frame_bytes  # http_decode_budget_bytes unset
    keys = {
        "http_max_connections": 100,
        "http_max_connections_per_listener": 80,
        "http_header_timeout_s": 2,
        "http_body_timeout_s": 3.5,
        "http_body_min_rate": 65536,
        "http_keepalive_timeout_s": 20,
        "http_decode_budget_bytes": 1 << 24,
    }
    listen = ServerConfig.from_dict(_minimal(listen=keys)).listen
    assert listen == ListenConfig(**{**keys, "http_header_timeout_s": 2.0, "http_keepalive_timeout_s": 20.0})
    assert listen.decode_budget_bytes == 1 << 24


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ({"http_max_connections": 0}, "listen.http_max_connections: must be an integer >= 1"),
        (
            {"http_max_connections_per_listener": 1.5},
            "listen.http_max_connections_per_listener: must be an integer",
        ),
        (
            {"http_max_connections": 10, "http_max_connections_per_listener": 20},
            "listen.http_max_connections_per_listener: 20 is more than listen.http_max_connections (10)",
        ),
        ({"http_header_timeout_s": 0}, "listen.http_header_timeout_s: must be a positive number"),
        ({"http_body_timeout_s": -1}, "listen.http_body_timeout_s: must be a positive number"),
        ({"http_keepalive_timeout_s": "75"}, "listen.http_keepalive_timeout_s: must be a positive number"),
        ({"http_body_min_rate": 0}, "listen.http_body_min_rate: must be an integer >= 1"),
        ({"http_decode_budget_bytes": 1000}, "listen.http_decode_budget_bytes: must be an integer >= 65536"),
        ({"http_timeout_s": 1}, "listen.http_timeout_s: unknown key"),
    ],
)
def test_invalid_http_limits_name_the_key(listen: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerConfig.from_dict(_minimal(listen=listen))


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ({"tcp": "7070"}, 'listen.tcp: must be "host:port"'),
        ({"tcp": "localhost:70000"}, "listen.tcp"),
        ({"unix_mode": "rw-rw----"}, "listen.unix_mode: must be an octal string"),
        ({"unix_mode": 660}, "listen.unix_mode"),
        ({"max_frame_bytes": 10}, "listen.max_frame_bytes: must be an integer >= 64"),
        ({"max_in_flight": 0}, "listen.max_in_flight"),
        ({"max_in_flight_total": 0}, "listen.max_in_flight_total: must be an integer >= 1"),
        ({"token": ""}, "listen.token: must be a non-empty string"),
        ({"port": 1}, "listen.port: unknown key"),
    ],
)
def test_invalid_listen_table_names_the_key(listen: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerConfig.from_dict(_minimal(listen=listen))


@pytest.mark.parametrize(
    ("preprocess", "message"),
    [
        ({"resize": [28]}, "models.digits-m.preprocess.resize: must be [height, width]"),
        ({"resize": [0, 28]}, "models.digits-m.preprocess.resize[0]"),
        ({"std": [0.0]}, "models.digits-m.preprocess.std: must be a number or a list of positive numbers"),
        ({"mean": [0.1, 0.2]}, "models.digits-m.preprocess.mean: must have 1 value or one per channel"),
        ({"channels": "yuv"}, "models.digits-m.preprocess.channels: must be one of rgb, bgr, gray"),
        ({"input": "nv12"}, "models.digits-m.preprocess.input"),
        ({"resise": [1, 1]}, "models.digits-m.preprocess.resise: unknown key"),
    ],
)
def test_invalid_preprocess_table_names_the_key(preprocess: dict[str, Any], message: str) -> None:
    data = {"models": {"digits-m": {"slo_ms": 5, "preprocess": preprocess}}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServerConfig.from_dict(data)

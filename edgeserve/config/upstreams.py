"""The `[[upstreams]]` tables of the server config: where work the box cannot serve in time may go.

Kept apart from server.py, which only calls `parse_upstreams`. Every mistake is a ConfigError that
names the key path (`upstreams[0].url: ...`), like the rest of the config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from edgeserve.config.checks import ConfigError, no_unknown, positive_int, positive_number, table

PROTOCOLS = ("oip-http",)  # Open Inference Protocol (KServe v2) over HTTP/1.1
DEFAULT_TIMEOUT_MS = 200.0
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_FAILURES_TO_OPEN = 3
DEFAULT_COOLDOWN_S = 1.0
DEFAULT_MAX_COOLDOWN_S = 30.0
DEFAULT_PROBE_INTERVAL_S = 2.0


@dataclass(frozen=True)
class UpstreamModel:
    """How the upstream serves one local model: its name there and its input/output tensor names.

    `service_ms`, when given, is the prior for the upstream's service time of one batch before any
    reply has measured it (default: the local profile's final-exit latency for that batch).
    """

    remote: str
    input: str = "x"
    output: str = "logits"
    service_ms: float | None = None


@dataclass(frozen=True)
class UpstreamConfig:
    """One upstream server. Breaker: `failures_to_open` consecutive failures open it for
    `cooldown_s` (doubling up to `max_cooldown_s` while probes keep failing)."""

    name: str
    url: str
    models: Mapping[str, UpstreamModel]
    protocol: str = "oip-http"
    timeout_ms: float = DEFAULT_TIMEOUT_MS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_batch: int | None = None  # None: the local scheduler's max batch
    binary: bool = True  # binary tensor extension for inputs (MLServer 1.7 wants false)
    send_deadline: bool = True  # send the batch's remaining budget as request parameter deadline_ms
    failures_to_open: int = DEFAULT_FAILURES_TO_OPEN
    cooldown_s: float = DEFAULT_COOLDOWN_S
    max_cooldown_s: float = DEFAULT_MAX_COOLDOWN_S
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    token: str | None = field(default=None, repr=False)  # sent as Authorization: Bearer <token>


def parse_upstreams(data: Any, models: Iterable[str]) -> tuple[UpstreamConfig, ...]:
    """The `upstreams` array of tables, checked against the served `models`; mistakes are ConfigErrors."""
    if not isinstance(data, list):
        raise ConfigError(f"upstreams: must be an array of tables ([[upstreams]]), got {type(data).__name__}")
    served = tuple(models)
    upstreams = tuple(_upstream(item, f"upstreams[{i}]", served) for i, item in enumerate(data))
    names = [u.name for u in upstreams]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"upstreams[{i}].name: {name!r} is used twice; give each upstream its own name")
    return upstreams


_KEYS = (
    "name",
    "url",
    "protocol",
    "timeout_ms",
    "max_in_flight",
    "max_batch",
    "binary",
    "send_deadline",
    "failures_to_open",
    "cooldown_s",
    "max_cooldown_s",
    "probe_interval_s",
    "token",
    "models",
)


def _upstream(data: Any, key: str, served: tuple[str, ...]) -> UpstreamConfig:
    data = table(data, key)
    no_unknown(data, _KEYS, key)
    if "url" not in data:
        raise ConfigError(f'{key}.url: missing; give the upstream\'s base URL, e.g. "http://10.0.0.5:8000"')
    url = _url(data["url"], f"{key}.url")
    protocol = data.get("protocol", "oip-http")
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"{key}.protocol: {protocol!r} is not supported; the only protocol is "
            f'"oip-http" (Open Inference Protocol over HTTP: Triton, KServe, MLServer, edgeserve)'
        )
    name = data.get("name", urlsplit(url).netloc)
    if not isinstance(name, str) or not name or name == "local":
        raise ConfigError(f'{key}.name: must be a non-empty string other than "local", got {name!r}')
    models_data = data.get("models")
    if not isinstance(models_data, Mapping) or not models_data:
        raise ConfigError(
            f"{key}.models: missing; add a [upstreams.models.<local model>] table per offloaded model"
        )
    models = {}
    for local, spec in models_data.items():
        if local not in served:
            raise ConfigError(f"{key}.models.{local}: not a served model (served: {', '.join(served)})")
        models[str(local)] = _model(spec, str(local), f"{key}.models.{local}")
    max_batch = data.get("max_batch")
    cooldown = positive_number(data.get("cooldown_s", DEFAULT_COOLDOWN_S), f"{key}.cooldown_s")
    max_cooldown = positive_number(
        data.get("max_cooldown_s", DEFAULT_MAX_COOLDOWN_S), f"{key}.max_cooldown_s"
    )
    if max_cooldown < cooldown:
        raise ConfigError(f"{key}.max_cooldown_s: must be >= cooldown_s ({cooldown}), got {max_cooldown}")
    token = data.get("token")
    if token is not None and (not isinstance(token, str) or not token):
        raise ConfigError(f"{key}.token: must be a non-empty string (the upstream's bearer token)")
    binary, send_deadline = data.get("binary", True), data.get("send_deadline", True)
    for k, flag in (("binary", binary), ("send_deadline", send_deadline)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{key}.{k}: must be true or false, got {flag!r}")
    return UpstreamConfig(
        name=name,
        url=url,
        models=models,
        protocol=protocol,
        timeout_ms=positive_number(data.get("timeout_ms", DEFAULT_TIMEOUT_MS), f"{key}.timeout_ms"),
        max_in_flight=positive_int(data.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT), f"{key}.max_in_flight"),
        max_batch=None if max_batch is None else positive_int(max_batch, f"{key}.max_batch"),
        binary=binary,
        send_deadline=send_deadline,
        failures_to_open=positive_int(
            data.get("failures_to_open", DEFAULT_FAILURES_TO_OPEN), f"{key}.failures_to_open"
        ),
        cooldown_s=cooldown,
        max_cooldown_s=max_cooldown,
        probe_interval_s=positive_number(
            data.get("probe_interval_s", DEFAULT_PROBE_INTERVAL_S), f"{key}.probe_interval_s"
        ),
        token=token,
    )


def _model(data: Any, local: str, key: str) -> UpstreamModel:
    data = table(data, key)
    no_unknown(data, ("remote", "input", "output", "service_ms"), key)
    names = {
        k: data.get(k, default) for k, default in (("remote", local), ("input", "x"), ("output", "logits"))
    }
    for k, value in names.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}.{k}: must be a non-empty string, got {value!r}")
    service = data.get("service_ms")
    return UpstreamModel(
        remote=names["remote"],
        input=names["input"],
        output=names["output"],
        service_ms=None if service is None else positive_number(service, f"{key}.service_ms"),
    )


def _url(value: Any, key: str) -> str:
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http",) or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(f'{key}: must be an http URL such as "http://10.0.0.5:8000", got {value!r}')
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(f"{key}: bad port in {value!r}") from None
    return value.rstrip("/")

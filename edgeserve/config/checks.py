"""The value checks every config parser shares, and the error they raise.

Each check names the key path at fault (`models.digits-m.slo_ms: ...`), so server.py and the
parsers of its sections (upstreams.py) report mistakes the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgeserve.errors import EdgeServeError


class ConfigError(EdgeServeError):
    """The server configuration is invalid; the message names the key path at fault."""


def table(data: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{key}: must be a table, got {type(data).__name__}")
    return data


def no_unknown(data: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(f"{where}: unknown key (allowed: {', '.join(allowed)})")


def positive_number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ConfigError(f"{key}: must be a positive number, got {value!r}")
    return float(value)


def positive_int(value: Any, key: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: must be an integer >= {minimum}, got {value!r}")
    return value


def choice(value: Any, key: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: must be a non-empty string, got {value!r}")
    return value


def non_negative_number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ConfigError(f"{key}: must be a number >= 0, got {value!r}")
    return float(value)

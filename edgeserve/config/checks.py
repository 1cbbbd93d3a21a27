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


IMAGE_DTYPES = ("float32", "float16", "float64", "uint8")


def image_layout(shape: tuple[int, ...]) -> str | None:
    """ "chw" or "hwc" for an image input of 1 or 3 channels (channels first when both could be),
    None for anything else."""
    if len(shape) != 3:
        return None
    if shape[0] in (1, 3):
        return "chw"
    return "hwc" if shape[2] in (1, 3) else None


def preprocess_problem(
    name: str, preprocess: Any, shape: tuple[int, ...], dtype: str = "float32", inputs: int = 1
) -> str | None:
    """Why `[models.<name>.preprocess]` cannot turn a camera frame into the input `shape`, or None.

    The same rules the request path applies (net/preprocess.py), checked once at start-up so a
    config that can never work is refused before it serves, naming the model and both shapes.
    """
    key = f"models.{name}.preprocess"
    layout = (
        None if len(shape) != 3 else ("chw" if shape[0] in (1, 3) else "hwc" if shape[2] in (1, 3) else None)
    )
    if inputs != 1 or layout is None or dtype not in ("float32", "float16", "float64", "uint8"):
        what = f"{inputs} inputs" if inputs != 1 else f"{dtype} input {list(shape)}"
        return (
            f"{key}: model {name!r} takes {what}, not one image ((1 or 3, H, W) or (H, W, 1 or 3), float "
            "or uint8); remove the preprocess table and send tensors"
        )
    channels, height, width = shape if layout == "chw" else (shape[2], shape[0], shape[1])
    if preprocess.resize is not None and tuple(preprocess.resize) != (height, width):
        h, w = preprocess.resize
        return (
            f"{key}.resize = [{h}, {w}] but model {name!r} takes input {list(shape)} "
            f"({height}x{width}): set resize = [{height}, {width}] or remove the key "
            "(it defaults to the model's)"
        )
    for field_name in ("mean", "std"):
        values = getattr(preprocess, field_name)
        if len(values) not in (1, channels):
            return (
                f"{key}.{field_name} has {len(values)} values but model {name!r} takes {channels} channel(s) "
                f"(input {list(shape)}): "
                + (
                    f"give 1 value or {channels}"
                    if channels != 1
                    else f"give 1 value, e.g. {field_name} = [{values[0]}]"
                )
            )
    return None


def check_preprocess(models: Mapping[str, Any], repository: Any) -> None:
    """ConfigError for the first model whose preprocess table cannot fit its exported input shape.

    Models not in the repository are skipped: loading them reports that, with its own fix.
    """
    from edgeserve.errors import EdgeServeError
    from edgeserve.repository import ModelRepository

    repo = ModelRepository(repository)
    for name, model in models.items():
        if getattr(model, "preprocess", None) is None or not repo.has_model(name):
            continue
        try:
            manifest = repo.load_manifest(name, verify=False)
        except EdgeServeError:
            continue
        first = manifest.inputs[0]
        problem = preprocess_problem(
            name, model.preprocess, tuple(first.shape), first.dtype, len(manifest.inputs)
        )
        if problem is not None:
            raise ConfigError(problem)


WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")


def port_clash(addresses: dict[str, tuple[str, int] | None]) -> str | None:
    """Two listeners of one config on the same port (and overlapping hosts): the second could
    never bind, and the error would blame another program. The sentence for the first pair, or None."""
    seen: list[tuple[str, str, int]] = []
    for key, address in addresses.items():
        if address is None or address[1] == 0:  # port 0: the OS picks a free one
            continue
        host, port = address
        for other_key, other_host, other_port in seen:
            shared = host == other_host or host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS
            if port == other_port and shared:
                return (
                    f'{key} "{host}:{port}" is the port of {other_key} "{other_host}:{other_port}" in the '
                    f"same config: two listeners cannot share a port; give {key} a port of its own "
                    f'(e.g. "{host}:{port + 1}")'
                )
        seen.append((key, host, port))
    return None

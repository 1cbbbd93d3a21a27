"""What a reload (SIGHUP) may change while serving, and what needs a restart.

Live: per-model slo_ms, max_queue and preprocess, the whole [scheduler] table, profiles (re-read
from the repository), shutdown_timeout_s and [logging]. Not live: the model set or its order
(sessions are loaded and the order is the scheduler's tie-break), [backend] and `repository`
(sessions and the fingerprint), [listen] and [metrics] (open sockets), and [upstreams] (connections
to other boxes). Those are refused with the key named; the server keeps its old config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from edgeserve.config.server import ConfigError, ServerConfig

RESTART = "restart the service to apply it: systemctl restart edgeserve"
LIVE_TOP_LEVEL = ("models", "scheduler", "shutdown_timeout_s", "logging")


class ReloadRefused(ConfigError):
    """The new config changes something that only a restart can apply; the old config keeps serving."""


def changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted key paths whose values differ between two configs (dataclasses and mappings)."""
    if is_dataclass(old) and is_dataclass(new) and type(old) is type(new):
        pairs = [(f.name, getattr(old, f.name), getattr(new, f.name)) for f in fields(old)]
    elif isinstance(old, Mapping) and isinstance(new, Mapping):
        pairs = [(str(k), old.get(k), new.get(k)) for k in dict.fromkeys([*old, *new])]
    else:
        return [] if old == new else [prefix or "(config)"]
    out: list[str] = []
    for name, a, b in pairs:
        key = f"{prefix}.{name}" if prefix else name
        if a is None or b is None or not (is_dataclass(a) or isinstance(a, Mapping)):
            if a != b:
                out.append(key)
        else:
            out.extend(changed_keys(a, b, key))
    return out


def check_reloadable(old: ServerConfig, new: ServerConfig) -> list[str]:
    """The changed keys if all of them can be applied live; ReloadRefused naming the others."""
    if tuple(old.models) != tuple(new.models):
        raise ReloadRefused(
            f"models: the served set changed from {list(old.models)} to {list(new.models)}; "
            f"loading or unloading models needs a restart; {RESTART}"
        )
    changed = changed_keys(old, new)
    frozen = [key for key in changed if key.split(".", 1)[0] not in LIVE_TOP_LEVEL]
    if frozen:
        raise ReloadRefused(f"{', '.join(frozen)}: cannot change while serving; {RESTART}")
    return changed

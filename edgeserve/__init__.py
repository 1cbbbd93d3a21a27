"""edgeserve: deadline-aware multi-DNN serving for one edge box.

The public names are loaded on first use (module __getattr__), so `import edgeserve` stays light:
it never imports onnxruntime, and command-line tools start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Server": "edgeserve.runtime.server",
    "BlockingServer": "edgeserve.runtime.blocking",
    "Result": "edgeserve.runtime.results",
    "Status": "edgeserve.runtime.results",
    "RequestFailed": "edgeserve.runtime.results",
    "ServerConfig": "edgeserve.config.server",
    "ModelConfig": "edgeserve.config.server",
    "BackendConfig": "edgeserve.config.server",
    "SchedulerConfig": "edgeserve.config.server",
    "ConfigError": "edgeserve.config.server",
    "EdgeServeError": "edgeserve.errors",
}

__all__ = [
    "BackendConfig",
    "BlockingServer",
    "ConfigError",
    "EdgeServeError",
    "ModelConfig",
    "RequestFailed",
    "Result",
    "SchedulerConfig",
    "Server",
    "ServerConfig",
    "Status",
    "__version__",
]

if TYPE_CHECKING:
    from edgeserve.config.server import (
        BackendConfig,
        ConfigError,
        ModelConfig,
        SchedulerConfig,
        ServerConfig,
    )
    from edgeserve.errors import EdgeServeError
    from edgeserve.runtime.blocking import BlockingServer
    from edgeserve.runtime.results import RequestFailed, Result, Status
    from edgeserve.runtime.server import Server


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

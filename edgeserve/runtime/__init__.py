"""The serving core: the Server (queues, scheduling, the executor thread), its backends and offload.

The fronts (net/, oip/, metrics/) and the service use only the names exported here; they are loaded
on first use, so importing one backend (e.g. `edgeserve-profile`) does not load the Server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Server": "edgeserve.runtime.server",
    "BackendFactory": "edgeserve.runtime.server",
    "default_backend": "edgeserve.runtime.server",
    "load_config": "edgeserve.runtime.server",
    "BlockingServer": "edgeserve.runtime.blocking",
    "Result": "edgeserve.runtime.results",
    "Status": "edgeserve.runtime.results",
    "RequestFailed": "edgeserve.runtime.results",
    "FrontendStats": "edgeserve.runtime.counters",
    "AnswerHolders": "edgeserve.runtime.answer_holders",
    "Sample": "edgeserve.runtime.validation",
    "RuntimeSettings": "edgeserve.runtime.settings",
}

__all__ = [
    "AnswerHolders",
    "BackendFactory",
    "BlockingServer",
    "FrontendStats",
    "RequestFailed",
    "Result",
    "RuntimeSettings",
    "Sample",
    "Server",
    "Status",
    "default_backend",
    "load_config",
]

if TYPE_CHECKING:
    from edgeserve.runtime.answer_holders import AnswerHolders
    from edgeserve.runtime.blocking import BlockingServer
    from edgeserve.runtime.counters import FrontendStats
    from edgeserve.runtime.results import RequestFailed, Result, Status
    from edgeserve.runtime.server import BackendFactory, Server, default_backend, load_config
    from edgeserve.runtime.settings import RuntimeSettings
    from edgeserve.runtime.validation import Sample


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeserve.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

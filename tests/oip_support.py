"""Helpers for the Open Inference Protocol tests: a served tiny repository with an HTTP listener."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from net_support import ServerThread, server_thread
from runtime_support import config_dict

from edgeserve.runtime.server import BackendFactory


def oip_config(root: Path, *, models: dict[str, Any] | None = None, **listen: Any) -> dict[str, Any]:
    """The tiny repository's config with only the HTTP frontend, on a port the OS picks."""
    config = config_dict(root)
    if models is not None:
        config["models"] = models
    return {**config, "listen": {"http": "127.0.0.1:0", **listen}}


def http_url(srv: ServerThread) -> str:
    return next(u for u in srv.net.urls if u.startswith("http://"))


@contextmanager
def oip_server(
    config: dict[str, Any], backend_factory: BackendFactory | None = None
) -> Iterator[tuple[ServerThread, str]]:
    """A started NetServer on its own loop thread and the http:// URL of its OIP frontend."""
    with server_thread(config, backend_factory) as srv:
        yield srv, http_url(srv)

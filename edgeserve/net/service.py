"""A Server behind its socket listeners: what `edgeserve serve` runs, usable in-process too.

    async with NetServer(config) as net:
        print(net.urls)          # ["unix:///run/edgeserve.sock", "tcp://127.0.0.1:7070"]
        await stop_event.wait()

Closing stops accepting first, then lets the Server answer what is in flight (Server.close),
writes those answers, closes the connections and removes the UNIX socket file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeserve.net.frontend import Frontend
from edgeserve.net.listeners import Listeners, open_listeners, require_listener
from edgeserve.runtime.config import ServerConfig
from edgeserve.runtime.server import BackendFactory, Server, load_config


class NetServer:
    """Server + Frontend + Listeners with one lifecycle."""

    def __init__(
        self,
        config: ServerConfig | Mapping[str, Any] | str | Path,
        *,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        self.config = load_config(config)
        self.server = Server(self.config, backend_factory=backend_factory)
        self.frontend = Frontend(self.server, self.config.listen)
        self.listeners: Listeners | None = None

    @property
    def urls(self) -> list[str]:
        return [] if self.listeners is None else list(self.listeners.urls)

    async def start(self) -> NetServer:
        require_listener(self.config.listen)
        await self.server.start()
        try:
            self.listeners = await open_listeners(self.frontend, self.config.listen)
        except BaseException:
            await self.server.close(0)
            raise
        return self

    async def close(self) -> None:
        if self.listeners is not None:
            await self.listeners.close()
        await self.server.close()
        await self.frontend.drain(timeout=2.0)  # the answers' tasks write before connections close
        self.frontend.close_all()
        if self.listeners is not None:
            await self.listeners.wait_closed()

    async def __aenter__(self) -> NetServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

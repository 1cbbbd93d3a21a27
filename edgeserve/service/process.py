"""A Server behind its socket listeners: what `edgeserve serve` runs, usable in-process too.

    async with NetServer(config) as net:
        print(net.urls)          # ["unix:///run/edgeserve.sock", "tcp://127.0.0.1:7070"]
        await stop_event.wait()

Closing stops accepting first, then lets the Server answer what is in flight (Server.close),
writes those answers, closes the connections and removes the UNIX socket file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeserve.config.access import warn_if_exposed
from edgeserve.config.checks import check_preprocess
from edgeserve.config.server import ServerConfig
from edgeserve.metrics.endpoint import MetricsEndpoint
from edgeserve.net.front_process import FrontProcess
from edgeserve.net.frontend import Frontend
from edgeserve.net.listeners import Listeners, open_listeners, require_listener
from edgeserve.net.settings import FrontSettings
from edgeserve.oip.connections import HttpGuard
from edgeserve.oip.frontend import OipFrontend
from edgeserve.oipgrpc.front import OipGrpcFront
from edgeserve.runtime import BackendFactory, RuntimeSettings, Server, load_config

# How long a stopping server waits for its connections to write the answers left in their buffers
# (a client that does not read them loses them then): what is left of shutdown_timeout_s + 1 s
# after the close, less CLOSE_MARGIN_S for the rest of the exit, within these bounds.
CLOSE_TIMEOUT_S = 0.5
CLOSE_MAX_S = 2.0
CLOSE_MARGIN_S = 0.5

_log = logging.getLogger(__name__)


class NetServer:
    """Server + Frontend + Listeners with one lifecycle."""

    def __init__(
        self,
        config: ServerConfig | Mapping[str, Any] | str | Path,
        *,
        backend_factory: BackendFactory | None = None,
        front_settings: FrontSettings | None = None,
        runtime_settings: RuntimeSettings | None = None,
    ) -> None:
        """`front_settings`, `runtime_settings`: tuning of the socket front (in this process) and of
        the core, for tests and experiments; the defaults are what `edgeserve serve` runs."""
        self.config = load_config(config)
        self.server = Server(self.config, backend_factory=backend_factory, settings=runtime_settings)
        listen = self.config.listen
        # The HTTP listeners (OIP front, metrics endpoint) share their caps, timeouts and counters.
        self.http_guard = HttpGuard(listen)
        # The Open Inference Protocol (HTTP) frontend, when [listen] http is set (docs/oip.md).
        self.oip = None if listen.http is None else OipFrontend(self.server, listen, self.http_guard)
        # The same protocol over gRPC, when [listen] grpc is set (docs/oip.md, "gRPC").
        self.grpc = (
            None if listen.grpc is None else OipGrpcFront(self.server, listen, lambda: self.http_guard.limits)
        )
        # The socket front: in a process of its own ([listen] front_process), else on this loop,
        # where it also sees the HTTP and gRPC fronts' clients when it holds a flood for the polite ones.
        peers = [front.stats for front in (self.oip, self.grpc) if front is not None]
        self.frontend: Frontend | FrontProcess = (
            FrontProcess(self.server)
            if listen.front_process
            else Frontend(self.server, listen, peers, settings=front_settings)
        )
        self.listeners: Listeners | None = None
        self._socket_urls: list[str] = []
        self.metrics: MetricsEndpoint | None = None  # started when [metrics] listen is set

    @property
    def urls(self) -> list[str]:
        urls = self._socket_urls + ([self.oip.url] if self.oip is not None and self.oip.url else [])
        return urls + ([f"grpc://{self.grpc.address}"] if self.grpc is not None and self.grpc.address else [])

    @property
    def metrics_url(self) -> str | None:
        """http://host:port/metrics once started with a [metrics] listen address, else None."""
        return None if self.metrics is None else self.metrics.url

    async def start(self) -> NetServer:
        require_listener(self.config.listen)
        # A camera preprocess table that cannot fit its model is refused before anything loads.
        check_preprocess(self.config.models, self.config.repository)
        await self.server.start()
        try:
            if self.config.metrics.listen is not None:
                stats = {"socket": self.frontend.stats}
                if self.oip is not None:
                    stats["http"] = self.oip.stats
                if self.grpc is not None:
                    stats["grpc"] = self.grpc.stats
                endpoint = MetricsEndpoint(
                    self.server,
                    self.config.metrics,
                    stats,
                    token=self.config.listen.token,
                    guard=self.http_guard,
                )
                self.metrics = await endpoint.start()
            if isinstance(self.frontend, FrontProcess):
                # The front process gets the windows the server derived (it cannot derive them).
                listen = self.config.listen.resolved(*self.server.window_bounds())
                self._socket_urls = await self.frontend.start(replace(self.config, listen=listen))
            else:
                self.listeners = await open_listeners(self.frontend, self.config.listen)
                self._socket_urls = list(self.listeners.urls)
            if self.config.listen.tcp is not None:  # the HTTP and metrics listeners warn for themselves
                host, port = self.config.listen.tcp
                warn_if_exposed(_log, "listen.tcp (socket protocol)", host, port, self.config.listen.token)
            if self.oip is not None:
                await self.oip.start()
            if self.grpc is not None:
                await self.grpc.start()
        except BaseException:
            if isinstance(self.frontend, FrontProcess):
                await self.frontend.abort()
            if self.listeners is not None:
                await self.listeners.close()
            if self.metrics is not None:
                await self.metrics.close()
            if self.oip is not None:
                await self.oip.close()
            if self.grpc is not None:
                await self.grpc.close()
            await self.server.close(0)
            raise
        return self

    @property
    def failure(self) -> str | None:
        """Why the socket front stopped on its own (its process exited), else None."""
        return self.frontend.failure if isinstance(self.frontend, FrontProcess) else None

    def on_failure(self, callback: Callable[[], object]) -> None:
        """Call `callback` if the socket front stops on its own (`edgeserve serve` then stops)."""
        if isinstance(self.frontend, FrontProcess):
            self.frontend.on_failure(callback)

    def reconfigured(self) -> None:
        """After a reload: the socket front learns the new models and SLOs."""
        self.config = self.server.config
        if isinstance(self.frontend, FrontProcess):
            self.frontend.configure(self.config)

    async def close(self) -> None:
        started = time.monotonic()
        if self.listeners is not None:
            await self.listeners.close()
        self.frontend.stop_reading()  # under load too: what was read is answered, nothing new is read
        if self.oip is not None:
            await self.oip.stop_accepting()
        if self.grpc is not None:
            await self.grpc.stop_accepting()
        await self.server.close()
        await self.frontend.drain(timeout=2.0)  # every accepted request is answered before connections close
        self.frontend.close_all()
        left = started + self.config.shutdown_timeout_s + 1.0 - CLOSE_MARGIN_S - time.monotonic()
        # The answers buffered go out first, to a slow reader too while the stop's promise allows.
        await self.frontend.wait_closed(timeout=min(max(CLOSE_TIMEOUT_S, left), CLOSE_MAX_S))
        if self.listeners is not None:
            await self.listeners.wait_closed()
        if self.oip is not None:  # after Server.close: every in-flight HTTP request has its answer
            await self.oip.close()
        if self.grpc is not None:  # likewise; an idle open stream is cancelled after its grace
            await self.grpc.close()
        if self.metrics is not None:  # last, so a scrape during shutdown still answers
            await self.metrics.close()

    async def __aenter__(self) -> NetServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

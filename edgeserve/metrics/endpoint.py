"""The Prometheus scrape endpoint: an aiohttp app on `[metrics] listen` serving GET `path`.

It runs on the Server's event loop, because the counters are loop-only: each scrape renders one
consistent snapshot without locks. Any other path answers 404.

With a `token` (NetServer passes `[listen] token`) every request needs `Authorization: Bearer
<token>` (401 with `WWW-Authenticate: Bearer` otherwise; Prometheus sends it with
`authorization: {credentials: ...}` in the scrape config). Bound to a non-loopback address without
a token it logs a warning at start.

Every error answer is `{"error": ...}` as application/json, as on the OIP front (401, an unknown
path's 404, a wrong method's 405). With a `guard` (NetServer passes the one its OIP front uses:
edgeserve.oip.connections.HttpGuard) its connections count against the HTTP caps and timeouts under
the listener "metrics", an unparsable request is a JSON 400 too, and the guard's counters are
exported (edgeserve_http_*).

The exposition is prometheus_client's, on a registry of the endpoint's own: OpenMetrics when the
scrape's Accept asks for `application/openmetrics-text`, the text format 0.0.4 otherwise. The
snapshot and the families are taken on the loop; the accelerators are read (edgeserve.metrics.
accelerators, cached for a second) and the body is encoded in a worker thread, off the loop.

    async with MetricsEndpoint(server, MetricsConfig(("127.0.0.1", 8002))) as endpoint:
        print(endpoint.url)   # http://127.0.0.1:8002/metrics
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from edgeserve.config.access import bearer_ok, warn_if_exposed
from edgeserve.config.server import MetricsConfig
from edgeserve.errors import listen_failure
from edgeserve.metrics import process
from edgeserve.metrics.accelerators import Accelerators
from edgeserve.metrics.catalog import FrontendCounters, HttpCounters, collect
from edgeserve.metrics.exposition import Family, encode, registry_of
from edgeserve.wire.http_errors import error_response, http_exception_response

if TYPE_CHECKING:
    from edgeserve.runtime import Server

_log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LISTENER = "metrics"  # this endpoint's name among the HTTP listeners of a guard


class HttpGuardPort(HttpCounters, Protocol):
    """What the endpoint needs of the HTTP listeners' guard: a runner under its limits, its counters."""

    def runner(self, app: web.Application, listener: str, **kwargs: Any) -> web.AppRunner: ...


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 404/405 as {"error": ...} JSON, like every other answer of the HTTP fronts."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http_exception_response(exc)


class MetricsEndpoint:
    """Serve `server`'s counters (and the frontends', labelled by name) for Prometheus to scrape.

    `frontend_stats`: one frontend's counters (labelled "socket") or {name: counters}; the objects
    are read at every scrape, so pass the live ones. `token`: the bearer token scrapes must present
    (None: anyone who reaches the port may scrape). `guard`: the HTTP listeners' limits to serve
    under and export (see the module docstring; None: aiohttp's defaults). `accelerators`: where
    the GPU and Jetson metrics are read (None: this machine's NVML and sysfs).
    """

    def __init__(
        self,
        server: Server,
        config: MetricsConfig,
        frontend_stats: FrontendCounters | Mapping[str, FrontendCounters] | None = None,
        *,
        token: str | None = None,
        guard: HttpGuardPort | None = None,
        accelerators: Accelerators | None = None,
    ) -> None:
        if config.listen is None:
            raise ValueError("MetricsEndpoint needs metrics.listen (host, port); port 0 picks a free one")
        self.server = server
        self.config = config
        self.token = token or None
        self.guard = guard
        self.refused_auth = 0  # scrapes refused for a missing or wrong token
        if frontend_stats is None:
            self.frontends: dict[str, FrontendCounters] = {}
        elif isinstance(frontend_stats, Mapping):
            self.frontends = dict(frontend_stats)
        else:
            self.frontends = {"socket": frontend_stats}
        self.accelerators = accelerators if accelerators is not None else Accelerators()
        self._families: list[Family] = []  # what the registry yields: the scrape being encoded
        # this endpoint's registry, never the global one; encoded in a worker thread (see _scrape)
        self.registry = registry_of(lambda: self._families, yield_gil=True)
        self._scraping = asyncio.Lock()  # one scrape encodes at a time (they share `_families`)
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    def families(self, accelerators: Sequence[Family] = ()) -> list[Family]:
        """Every family of one snapshot (call on the server's loop), then `accelerators`."""
        snapshot = self.server.snapshot()
        threads = snapshot.get("threads", {}).items()
        waits = {name: s for name, tid in threads if (s := process.thread_cpu_wait_s(tid)) is not None}
        families = collect(
            snapshot,
            models=self.server.models,
            frontends=self.frontends,
            process=process.sample(),
            thread_waits=waits,
            http=self.guard,
        )
        return [*families, *accelerators]

    def render(self, accept: str | None = None) -> str:
        """The exposition now, with the accelerators last read (call on the server's loop; a
        registry of its own, so that it never meets a scrape being encoded)."""
        families = self.families(self.accelerators.cached)
        return encode(registry_of(lambda: families), accept)[0].decode("utf-8")

    async def _scrape(self, request: web.Request) -> web.Response:
        async with self._scraping:
            accelerators = await self.accelerators.families()  # a worker thread, at most once a second
            self._families = self.families(accelerators)  # one consistent snapshot, on the loop
            accept = request.headers.get("Accept")
            body, content_type = await asyncio.to_thread(encode, self.registry, accept)
            self._families = []
        return web.Response(body=body, headers={"Content-Type": content_type})

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Bearer token on every path (a 404 is not told apart from a 401 without it)."""
        if self.token is None or bearer_ok(request.headers.get("Authorization"), self.token):
            return await handler(request)
        self.refused_auth += 1
        answer = error_response(
            401,
            "a bearer token is required: send 'Authorization: Bearer <[listen] token>'",
            {"WWW-Authenticate": 'Bearer realm="edgeserve-metrics"'},
        )
        answer.force_close()  # a client without the token keeps no connection open
        return answer

    async def start(self) -> MetricsEndpoint:
        """Listen; `url` then names the real port (useful with port 0)."""
        assert self.config.listen is not None
        app = web.Application(middlewares=[_json_errors, self._authorize])
        app.router.add_get(self.config.path, self._scrape)
        if self.guard is None:
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
        else:
            runner = self.guard.runner(app, LISTENER, access_log=None, handle_signals=False)
        await runner.setup()
        host, port = self.config.listen
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise listen_failure("metrics.listen", f"{host}:{port}", exc) from None
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}{self.config.path}"
        _log.info("metrics on %s", self.url)
        warn_if_exposed(_log, "metrics.listen", bound_host, bound_port, self.token)
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> MetricsEndpoint:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

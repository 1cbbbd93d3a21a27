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

    async with MetricsEndpoint(server, MetricsConfig(("127.0.0.1", 8002))) as endpoint:
        print(endpoint.url)   # http://127.0.0.1:8002/metrics
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from edgeserve.config.access import bearer_ok, warn_if_exposed
from edgeserve.config.server import MetricsConfig
from edgeserve.errors import listen_failure
from edgeserve.metrics import process
from edgeserve.metrics.catalog import FrontendCounters, HttpCounters, render_metrics
from edgeserve.metrics.exposition import CONTENT_TYPE

if TYPE_CHECKING:
    from edgeserve.runtime import Server

_log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LISTENER = "metrics"  # this endpoint's name among the HTTP listeners of a guard


class HttpGuardPort(HttpCounters, Protocol):
    """What the endpoint needs of the HTTP listeners' guard: a runner under its limits, its counters."""

    def runner(self, app: web.Application, listener: str, **kwargs: Any) -> web.AppRunner: ...


def _json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 404/405 as {"error": ...} JSON, like every other answer of the HTTP fronts."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kept = {k: exc.headers[k] for k in ("Allow",) if k in exc.headers}
        return _json_error(exc.status, exc.text or exc.reason, kept)


class MetricsEndpoint:
    """Serve `server`'s counters (and the frontends', labelled by name) for Prometheus to scrape.

    `frontend_stats`: one frontend's counters (labelled "socket") or {name: counters}; the objects
    are read at every scrape, so pass the live ones. `token`: the bearer token scrapes must present
    (None: anyone who reaches the port may scrape). `guard`: the HTTP listeners' limits to serve
    under and export (see the module docstring; None: aiohttp's defaults).
    """

    def __init__(
        self,
        server: Server,
        config: MetricsConfig,
        frontend_stats: FrontendCounters | Mapping[str, FrontendCounters] | None = None,
        *,
        token: str | None = None,
        guard: HttpGuardPort | None = None,
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
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    def render(self) -> str:
        """The exposition text now (call on the server's loop)."""
        snapshot = self.server.snapshot()
        threads = snapshot.get("threads", {}).items()
        waits = {name: s for name, tid in threads if (s := process.thread_cpu_wait_s(tid)) is not None}
        return render_metrics(
            snapshot,
            models=self.server.models,
            frontends=self.frontends,
            process=process.sample(),
            thread_waits=waits,
            http=self.guard,
        )

    async def _scrape(self, request: web.Request) -> web.Response:
        return web.Response(body=self.render().encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Bearer token on every path (a 404 is not told apart from a 401 without it)."""
        if self.token is None or bearer_ok(request.headers.get("Authorization"), self.token):
            return await handler(request)
        self.refused_auth += 1
        answer = _json_error(
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

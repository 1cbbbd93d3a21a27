"""The Open Inference Protocol (KServe v2) HTTP frontend: an aiohttp app over a running Server.

It lets independent clients (tritonclient, perf_analyzer, KServe tooling, curl) reach the
scheduler: health, server and model metadata, Triton's model configuration extension, and infer
with JSON tensors or the binary tensor extension. An infer request of N samples becomes N
`Server.infer` calls, each its own request under the same deadline, so the scheduler batches them
with everything else in flight. Deadlines travel as request parameters, the exit taken (and how
late) as response parameters; statuses and parameters are in docs/oip.md.

It runs on the Server's event loop (the Server is loop-only) and answers every request exactly
once: a client that disconnects cancels its handler (aiohttp handler_cancellation), which cancels
its still-queued samples.

Every error answer, aiohttp's own included (unknown route, wrong method, unparsable HTTP, a handler
fault), is the protocol's `{"error": ...}` JSON; with `[listen] token` set every route but the two
health probes needs `Authorization: Bearer <token>` (401 otherwise). docs/oip.md has the details.

One client cannot stall or starve the others (docs/oip.md, "Limits"): connections are capped and
timed out (oip/connections.py, shared with the metrics endpoint), and an infer body is checked
against its model before any tensor is decoded, bounded by what the model takes, charged to a
decode budget and, when large, decoded on a worker thread (oip/decoding.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from edgeserve import __version__
from edgeserve.config.access import bearer_ok, warn_if_exposed
from edgeserve.config.server import ListenConfig
from edgeserve.errors import listen_failure
from edgeserve.oip.connections import HttpGuard
from edgeserve.oip.decoding import Decoder, charge, decode, json_size
from edgeserve.oip.errors import OipRequestError
from edgeserve.runtime import FrontendStats, Result, Sample, Server, Status
from edgeserve.wire.http_errors import error_response, http_exception_response
from edgeserve.wire.oip_codec import (
    HEADER_LENGTH,
    InferRequest,
    InferResponse,
    OipMessageError,
    Tensor,
    binary_outputs,
    clip,
    encode_response,
)
from edgeserve.wire.oip_model import (
    ModelTables,
    answer_parameters,
    deadline_keywords,
    metadata_entry,
    model_config,
    output_rows,
)

_log = logging.getLogger(__name__)

VERSION = "1"  # every model has one version; /versions/1 and the unversioned paths are the same
EXTENSIONS = ("binary_tensor_data", "model_configuration", "parameters")
SHUTDOWN_TIMEOUT_S = 2.0  # at close, handlers still running after this long are cancelled
ACCEPTED_ENCODINGS = ("", "identity", "gzip", "deflate")
# A smaller answer fits in one TCP segment anyway: deflating it saves no packet, and took 8 % of the
# loop's time at 4k answers/s (aiohttp's client asks for gzip by default; a few logits: ~300 bytes).
COMPRESS_MIN_BYTES = 1400
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")  # answered without the token (probes)
MALFORMED = (400, 413, 415)  # refusals counted as protocol errors (not 408, 503: no fault of the request's)

# HTTP status per Result status. A full queue is 429 (back off and retry), shutdown 503 (go elsewhere).
HTTP_STATUS = {
    Status.INVALID: 400,
    Status.ERROR: 500,
    Status.SHUTDOWN: 503,
    Status.REJECTED: 429,
    Status.EXPIRED: 504,
}
# When samples of one request end differently, the answer reports the first of these that occurred.
PRECEDENCE = (Status.INVALID, Status.ERROR, Status.SHUTDOWN, Status.REJECTED, Status.EXPIRED)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error answer carries {"error": ...}, as the protocol says, even aiohttp's own 404/405/413
    and a fault in a handler (500, logged with its traceback)."""
    try:
        return await handler(request)
    except OipRequestError as exc:
        answer = error_response(exc.status, exc.message, exc.headers)
        if exc.close:
            answer.force_close()
        return answer
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http_exception_response(exc)
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: there is nobody to answer
    except Exception as exc:
        _log.exception("OIP %s %s failed", request.method, clip(request.path))
        text = f"internal server error ({type(exc).__name__}); the server log has details"
        return error_response(500, text)


def _deadline(parameters: dict[str, Any]) -> dict[str, float]:
    """Server.infer's deadline keywords from the request's parameters (wire/oip_model.py); 400 if bad."""
    try:
        return deadline_keywords(parameters)
    except OipMessageError as exc:
        raise OipRequestError(400, str(exc)) from None


class OipFrontend:
    """Serve `server` over HTTP at `listen.http`: `url = await frontend.start()`, `await frontend.close()`.

    Bodies above `listen.max_frame_bytes` are refused with 413; an infer request carries at most
    the model's `max_queue` samples (more could never be queued at once). `guard`: the connection
    caps, timeouts and decode budget shared with the server's other HTTP listener (NetServer
    passes one; alone the front makes its own).
    """

    def __init__(self, server: Server, listen: ListenConfig, guard: HttpGuard | None = None) -> None:
        if listen.http is None:
            raise ValueError("OipFrontend needs listen.http (host, port); port 0 picks a free one")
        self.server = server
        self.listen = listen
        self.guard = guard if guard is not None else HttpGuard(listen)
        self.stats = FrontendStats()  # requests, protocol errors, by sample status, discarded answers
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._tables = ModelTables(server)  # per model: its tensors and what a request may carry
        self._decoder = Decoder(self.guard.budget)

    # -- lifecycle ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [_json_errors] if self.listen.token is None else [_json_errors, self._authorize]
        app = web.Application(client_max_size=self.listen.max_frame_bytes, middlewares=middlewares)
        get, post = app.router.add_get, app.router.add_post
        get("/v2/health/live", self._live)
        get("/v2/health/ready", self._ready)
        get("/v2", self._server_metadata)
        post("/v2/repository/index", self._repository_index)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            get(prefix, self._model_metadata)
            get(prefix + "/ready", self._model_ready)
            get(prefix + "/config", self._model_config)
            post(prefix + "/infer", self._infer)
        return app

    async def start(self) -> str:
        """Listen on listen.http; returns http://host:port (the real port when 0 was asked)."""
        assert self.listen.http is not None
        runner = self.guard.runner(
            self.app(),
            "http",
            self.stats,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            auto_decompress=False,  # decoding inflates, bounded, and _encoding answers 415 for others
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        host, port = self.listen.http
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise listen_failure("listen.http", f"{host}:{port}", exc) from None
        self._runner, self._site = runner, site
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}"
        _log.info("Open Inference Protocol on %s", self.url)
        what = "listen.http (Open Inference Protocol)"
        warn_if_exposed(_log, what, bound_host, bound_port, self.listen.token)
        return self.url

    async def stop_accepting(self) -> None:
        """Accept no new connections; requests on open ones are still answered (503 once shut down)."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def close(self) -> None:
        """Close the connections (call after Server.close has answered everything in flight)."""
        await self.stop_accepting()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._decoder.close()

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """With [listen] token: `Authorization: Bearer <token>` on every route but the health probes."""
        assert self.listen.token is not None
        if request.path in OPEN_PATHS or bearer_ok(request.headers.get("Authorization"), self.listen.token):
            return await handler(request)
        self.stats.refused_auth += 1
        given = "a wrong" if "Authorization" in request.headers else "no"
        raise OipRequestError(  # closing: a client without the token keeps no connection open
            401,
            f"{given} bearer token: send 'Authorization: Bearer <[listen] token>'",
            {"WWW-Authenticate": 'Bearer realm="edgeserve"'},
            close=True,
        )

    # -- health and metadata -----------------------------------------------------------------------

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.server.accepting else 503)

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": "edgeserve", "version": __version__, "extensions": list(EXTENSIONS)}
        )

    async def _repository_index(self, request: web.Request) -> web.Response:
        """Triton's repository index (what tools call to list models); load/unload are not offered."""
        state = "READY" if self.server.accepting else "UNAVAILABLE"
        return web.json_response(
            [{"name": m, "version": VERSION, "state": state} for m in self.server.models]
        )

    def _model(self, request: web.Request) -> str:
        """The served model the path names (404 naming the served ones, or the versions, if not)."""
        model = request.match_info["model"]
        if model not in self.server.models:
            served = ", ".join(self.server.models)
            raise OipRequestError(404, f"unknown model {clip(model)}; served: {served}")
        version = request.match_info.get("version")
        if version is not None and version != VERSION:
            raise OipRequestError(
                404, f"model {model!r} has no version {clip(version)}; versions: [{VERSION!r}]"
            )
        return model

    async def _model_ready(self, request: web.Request) -> web.Response:
        self._model(request)
        return web.Response(status=200 if self.server.accepting else 503)

    def _platform(self) -> str:
        return f"edgeserve_{self.server.config.backend.name}"

    async def _model_metadata(self, request: web.Request) -> web.Response:
        model = self._model(request)
        inputs, outputs = self._tables.tensors(model)
        return web.json_response(
            {
                "name": model,
                "versions": [VERSION],
                "platform": self._platform(),
                "inputs": [metadata_entry(t) for t in inputs],
                "outputs": [metadata_entry(t) for t in outputs],
            }
        )

    async def _model_config(self, request: web.Request) -> web.Response:
        """Triton's model configuration (ModelConfig protobuf as JSON), what perf_analyzer reads."""
        model = self._model(request)
        return web.json_response(self.model_config(model))

    def model_config(self, model: str) -> dict[str, Any]:
        """The configuration /config answers for a served model (wire/oip_model.py)."""
        manifest, config = self.server.manifest(model), self.server.config
        max_batch = self.server.latency_model.models[self.server.models.index(model)].max_batch
        return model_config(
            model,
            self._platform(),
            config.backend.name,
            max_batch,
            config.models[model].slo_ms,
            manifest.exits,
            *self._tables.tensors(model),
        )

    # -- infer -------------------------------------------------------------------------------------

    def _encoding(self, request: web.Request) -> str:
        """The body's Content-Encoding (lower case, "" for none); 415 for one not taken."""
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ACCEPTED_ENCODINGS:
            raise OipRequestError(
                415, f"Content-Encoding {clip(encoding)} is not supported; send gzip, deflate or none"
            )
        return "" if encoding == "identity" else encoding

    async def _read_body(self, request: web.Request, size: int) -> bytes:
        """The body as sent, at most listen.max_frame_bytes; one not in by the body timeout for
        `size` bytes is 408 (and the connection closed). A body already in whole, as most small
        ones are with their headers, is taken without a timer."""
        limit = self.listen.max_frame_bytes
        try:
            if request.content.is_eof():
                return await request.read()
            timeout = self.guard.limits.body_timeout(size)
            try:
                return await asyncio.wait_for(request.read(), timeout)
            except asyncio.TimeoutError:
                self.guard.timed_out("http", "body")
                raise OipRequestError(
                    408,
                    f"request body not received within {timeout:.1f} s (listen.http_body_timeout_s plus "
                    f"{size} bytes at listen.http_body_min_rate)",
                    close=True,
                ) from None
        except web.HTTPRequestEntityTooLarge:
            raise OipRequestError(
                413, f"request body exceeds listen.max_frame_bytes ({limit} bytes)"
            ) from None
        except HttpProcessingError as exc:  # a malformed chunked or compressed transfer
            raise OipRequestError(400, f"request body could not be read: {clip(exc.message)}") from None

    async def _decode(self, request: web.Request, model: str) -> tuple[InferRequest, list[Sample]]:
        """The request and its samples (docs/oip.md, "Limits"): a large body is charged to the
        decode budget (503 when it is full) before it is read, and decoded on the worker thread."""
        encoding = self._encoding(request)
        limit, declared = self.listen.max_frame_bytes, request.content_length
        if declared is not None and declared > limit:
            raise OipRequestError(
                413,
                f"request body exceeds listen.max_frame_bytes ({limit} bytes): Content-Length is {declared}",
            )
        table = self._tables.inputs(model)
        size = limit if declared is None or encoding else declared  # chunked or inflated: up to the limit
        header_length = request.headers.get(HEADER_LENGTH)
        cost = charge(size, json_size(size, header_length), table.max_items)
        budget = self.guard.budget
        if cost and not budget.acquire(cost):
            raise OipRequestError(
                503,
                f"the server is decoding other large requests up to listen.http_decode_budget_bytes "
                f"({budget.limit} bytes); retry",
                {"Retry-After": "1"},
            )
        handed = False
        try:
            body = await self._read_body(request, size)
            if not cost:
                return decode(body, encoding, header_length, table, limit)
            handed = True  # the worker releases the charge when it is done
            return await self._decoder.run(cost, decode, body, encoding, header_length, table, limit)
        finally:
            if cost and not handed:
                budget.release(cost)

    async def _infer(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        model = self._model(request)
        self.stats.requests += 1
        try:
            infer, samples = await self._decode(request, model)
            deadline = _deadline(infer.parameters)
        except OipRequestError as exc:
            if exc.status in MALFORMED:
                self.stats.protocol_errors += 1
            raise
        try:
            margin = self.listen.reply_margin_ms / 1000.0
            if len(samples) == 1:  # most requests: no task and no gathering future for one sample
                results = [await self.server.infer(model, samples[0], reply_margin_s=margin, **deadline)]
            else:
                results = await asyncio.gather(
                    *(self.server.infer(model, x, reply_margin_s=margin, **deadline) for x in samples)
                )
        except asyncio.CancelledError:
            self.stats.discarded += 1  # the client went away: Server.infer dropped what was still queued
            raise
        for result in results:
            self.stats.by_status[result.status.value] = self.stats.by_status.get(result.status.value, 0) + 1
        return self._answer(model, infer, results, received)

    def _answer(
        self,
        model: str,
        infer: InferRequest,
        results: list[Result],
        received: float,
    ) -> web.Response:
        failed = [r for r in results if r.status is not Status.OK]
        if failed:
            status = next(s for s in PRECEDENCE if any(r.status is s for r in failed))
            index = next(i for i, r in enumerate(results) if r.status is status)
            detail = results[index].error or status.value
            where = f"sample {index} of {len(results)}: " if len(results) > 1 else ""
            return error_response(HTTP_STATUS[status], f"{status.value}: {where}{detail}")
        _, specs = self._tables.tensors(model)
        wanted = {o.name for o in infer.outputs} if infer.outputs else None
        tensors = [
            Tensor(t.name, output_rows(t, [r.outputs[t.name] if r.outputs else r.output for r in results]))
            for t in specs
            if wanted is None or t.name in wanted
        ]
        parameters = answer_parameters(results)
        response = InferResponse(model, tensors, VERSION, infer.id, parameters)
        parameters["edgeserve_server_ms"] = round((time.monotonic() - received) * 1000.0, 3)
        body, headers = encode_response(response, binary_outputs(infer, [t.name for t in tensors]))
        answer = web.Response(body=body, headers=headers)
        if len(body) >= COMPRESS_MIN_BYTES:
            answer.enable_compression()  # only when the client sent Accept-Encoding
        return answer

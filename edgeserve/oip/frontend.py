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
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from edgeserve import __version__
from edgeserve.config.access import bearer_ok, warn_if_exposed
from edgeserve.config.server import ListenConfig
from edgeserve.errors import listen_failure
from edgeserve.manifest import TensorSpec
from edgeserve.runtime import FrontendStats, Result, Sample, Server, Status
from edgeserve.wire.oip_codec import (
    HEADER_LENGTH,
    InferRequest,
    InferResponse,
    OipMessageError,
    Tensor,
    binary_outputs,
    clip,
    decode_request,
    encode_response,
)

_log = logging.getLogger(__name__)

VERSION = "1"  # every model has one version; /versions/1 and the unversioned paths are the same
# manifest dtype -> KServe v2 datatype
_DATATYPE = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
EXTENSIONS = ("binary_tensor_data", "model_configuration", "parameters")
SHUTDOWN_TIMEOUT_S = 2.0  # at close, handlers still running after this long are cancelled
ACCEPTED_ENCODINGS = ("", "identity", "gzip", "deflate")
# A smaller answer fits in one TCP segment anyway: deflating it saves no packet, and took 8 % of the
# loop's time at 4k answers/s (aiohttp's client asks for gzip by default; a few logits: ~300 bytes).
COMPRESS_MIN_BYTES = 1400
MAX_ERROR_CHARS = 1024  # an error text longer than this is cut (and says so)
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")  # answered without the token (probes)

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


class OipRequestError(Exception):
    """A request the frontend refuses before queueing: `status` and the {"error": ...} text."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def error_response(status: int, message: str, headers: Any = None) -> web.Response:
    """The protocol's error answer: {"error": message}, the message cut to MAX_ERROR_CHARS."""
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}...[cut, {len(message)} chars]"
    return web.json_response({"error": message}, status=status, headers=headers)


# aiohttp's HTTPException headers that still apply to the JSON answer (405's Allow, 401's challenge).
_KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error answer carries {"error": ...}, as the protocol says, even aiohttp's own 404/405/413
    and a fault in a handler (500, logged with its traceback)."""
    try:
        return await handler(request)
    except OipRequestError as exc:
        return error_response(exc.status, exc.message, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kept = {k: exc.headers[k] for k in _KEPT_HEADERS if k in exc.headers}
        return error_response(exc.status, exc.text or exc.reason, kept)
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away: there is nobody to answer
    except Exception as exc:
        _log.exception("OIP %s %s failed", request.method, clip(request.path))
        text = f"internal server error ({type(exc).__name__}); the server log has details"
        return error_response(500, text)


class _JsonErrorProtocol(RequestHandler):
    """aiohttp's per-connection protocol, answering requests it cannot parse (bad request line,
    headers, chunked body) with the protocol's JSON error instead of text/plain."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)  # logs; raises if already sending
        stats = getattr(self._manager, "edgeserve_stats", None)
        if stats is not None and 400 <= status < 500:
            stats.protocol_errors += 1
        if status >= 500:
            text = f"internal server error ({type(exc).__name__ if exc else status})"
        else:
            text = f"bad HTTP request: {message or (exc and str(exc)) or status}"
        answer = error_response(status, text)
        answer.force_close()
        del plain
        return answer


class _CountingServer(web.Server):
    """aiohttp's low-level server, counting connections into `edgeserve_stats` and building
    _JsonErrorProtocol connections. AppRunner builds a plain web.Server; _Runner retypes it."""

    edgeserve_stats: FrontendStats

    def __call__(self) -> RequestHandler:
        return _JsonErrorProtocol(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.edgeserve_stats.connections += 1
        self.edgeserve_stats.open_connections += 1

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.edgeserve_stats.open_connections = max(0, self.edgeserve_stats.open_connections - 1)


class _Runner(web.AppRunner):
    def __init__(self, app: web.Application, stats: FrontendStats, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._edgeserve_stats = stats

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is web.Server:  # only aiohttp's own class, whose layout we extend
            server.__class__ = _CountingServer
            server.edgeserve_stats = self._edgeserve_stats  # type: ignore[attr-defined]
        return server


def _deadline(parameters: dict[str, Any]) -> dict[str, float]:
    """Server.infer's deadline keywords from the request's parameters: `deadline_ms` (edgeserve), else
    Triton's `timeout` in microseconds, or `capture_ts`; the core turns them into one deadline."""
    found: dict[str, float] = {}
    for key, name, scale in (
        ("deadline_ms", "deadline_ms", 1.0),
        ("timeout", "deadline_ms", 1e-3),
        ("capture_ts", "capture_ts", 1.0),
    ):
        value = parameters.get(key)
        if value is None or name in found:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise OipRequestError(400, f"parameters.{key}: must be a positive number, got {clip(value)}")
        found[name] = float(value) * scale
    if len(found) > 1:
        raise OipRequestError(400, "parameters: give deadline_ms (or timeout) or capture_ts, not both")
    return found


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate a gzip or deflate (zlib, or raw as some clients send) body, refusing more than `limit`."""
    wbits = (16 + zlib.MAX_WBITS,) if encoding == "gzip" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for bits in wbits:
        inflater = zlib.decompressobj(bits)
        try:
            data = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(data) > limit:
            raise OipRequestError(
                413, f"decompressed request body exceeds listen.max_frame_bytes ({limit} bytes)"
            )
        if not inflater.eof:
            raise OipRequestError(400, f"{encoding} request body is truncated")
        return data
    raise OipRequestError(400, f"request body is not valid {encoding} data")


def _joined(values: Sequence[Any]) -> Any:
    """One value if every sample agrees, else the per-sample values comma-joined."""
    return values[0] if len(set(values)) == 1 else ",".join(str(v) for v in values)


class OipFrontend:
    """Serve `server` over HTTP at `listen.http`: `url = await frontend.start()`, `await frontend.close()`.

    Bodies above `listen.max_frame_bytes` are refused with 413; an infer request carries at most
    the model's `max_queue` samples (more could never be queued at once).
    """

    def __init__(self, server: Server, listen: ListenConfig) -> None:
        if listen.http is None:
            raise ValueError("OipFrontend needs listen.http (host, port); port 0 picks a free one")
        self.server = server
        self.listen = listen
        self.stats = FrontendStats()  # requests, protocol errors, by sample status, discarded answers
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._tensor_specs: dict[str, tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]] = {}

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
        runner = _Runner(
            self.app(),
            self.stats,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            auto_decompress=False,  # _read_body inflates, bounded, and answers 415 for other encodings
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

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """With [listen] token: `Authorization: Bearer <token>` on every route but the health probes."""
        assert self.listen.token is not None
        if request.path in OPEN_PATHS or bearer_ok(request.headers.get("Authorization"), self.listen.token):
            return await handler(request)
        self.stats.refused_auth += 1
        given = "a wrong" if "Authorization" in request.headers else "no"
        raise OipRequestError(
            401,
            f"{given} bearer token: send 'Authorization: Bearer <[listen] token>'",
            {"WWW-Authenticate": 'Bearer realm="edgeserve"'},
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

    def _tensors(self, model: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """(inputs, outputs) of one sample; the outputs are the final exit's (every exit answers
        under these names, see Server). Kept per model: every infer needs them, and a model's
        manifest does not change while the server runs (a reload that would change it is refused)."""
        specs = self._tensor_specs.get(model)
        if specs is None:
            manifest = self.server.manifest(model)
            outputs = manifest.exit_outputs(len(manifest.exits) - 1)
            specs = self._tensor_specs[model] = (tuple(manifest.inputs), tuple(outputs))
        return specs

    def _platform(self) -> str:
        return f"edgeserve_{self.server.config.backend.name}"

    async def _model_metadata(self, request: web.Request) -> web.Response:
        model = self._model(request)
        inputs, outputs = self._tensors(model)
        return web.json_response(
            {
                "name": model,
                "versions": [VERSION],
                "platform": self._platform(),
                "inputs": [_metadata(t) for t in inputs],
                "outputs": [_metadata(t) for t in outputs],
            }
        )

    async def _model_config(self, request: web.Request) -> web.Response:
        """Triton's model configuration (ModelConfig protobuf as JSON), what perf_analyzer reads."""
        model = self._model(request)
        manifest = self.server.manifest(model)
        index = self.server.models.index(model)
        max_batch = self.server.latency_model.models[index].max_batch
        config = self.server.config.models[model]
        inputs, outputs = self._tensors(model)
        exits = ",".join(e.name for e in manifest.exits)
        parameters = {"exits": exits, "slo_ms": f"{config.slo_ms:g}"}
        if any(e.accuracy is not None for e in manifest.exits):
            parameters["exit_accuracies"] = ",".join(
                "" if e.accuracy is None else f"{e.accuracy:.4f}" for e in manifest.exits
            )
        return web.json_response(
            {
                "name": model,
                "platform": self._platform(),
                "backend": self.server.config.backend.name,
                "version_policy": {"latest": {"num_versions": 1}},
                "max_batch_size": max_batch,
                "input": [{**_config_entry(t), "format": "FORMAT_NONE"} for t in inputs],
                "output": [_config_entry(t) for t in outputs],
                "parameters": {key: {"string_value": value} for key, value in parameters.items()},
            }
        )

    # -- infer -------------------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, decompressed (gzip, deflate) and at most listen.max_frame_bytes either way."""
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ACCEPTED_ENCODINGS:
            raise OipRequestError(
                415, f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or none"
            )
        limit = self.listen.max_frame_bytes
        too_large = f"request body exceeds listen.max_frame_bytes ({limit} bytes)"
        if request.content_length is not None and request.content_length > limit:
            raise OipRequestError(413, f"{too_large}: Content-Length is {request.content_length}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise OipRequestError(413, too_large) from None
        except HttpProcessingError as exc:  # a malformed chunked or compressed transfer
            raise OipRequestError(400, f"request body could not be read: {clip(exc.message)}") from None
        if encoding in ("gzip", "deflate"):
            body = _decompress(body, encoding, limit)
        return body

    def _samples(self, model: str, request: InferRequest) -> list[Sample]:
        """One sample per row of the inputs (a batched input's first dimension is N); 400 naming
        what was expected."""
        inputs, outputs = self._tensors(model)
        limit = self._max_samples(model) if all(t.batched for t in inputs) else 1
        given = {t.name: t for t in request.inputs}
        if len(given) != len(request.inputs) or sorted(given) != sorted(t.name for t in inputs):
            expected = "; ".join(f"{t.name!r}: {_expected(t)}" for t in inputs)
            names = ", ".join(clip(t.name) for t in request.inputs[:8]) or "none"
            if len(inputs) == 1 and len(request.inputs) == 1:
                raise OipRequestError(
                    400, f"model {model!r} has one input named {inputs[0].name!r}, got {names} ({expected})"
                )
            raise OipRequestError(
                400, f"model {model!r} takes the inputs {expected} (1 <= N <= {limit}), got {names}"
            )
        rows: set[int] = set()
        for spec in inputs:
            tensor = given[spec.name]
            datatype = _DATATYPE[spec.dtype]
            if tensor.datatype != datatype:
                raise OipRequestError(
                    400, f"input {spec.name!r}: datatype must be {datatype}, got {tensor.datatype}"
                )
            shape = tensor.shape
            want = list(spec.shape)
            if spec.batched:
                ok = len(shape) == 1 + len(want) and shape[1:] == want and 1 <= shape[0] <= limit
                rows.add(shape[0] if ok else -1)
            else:
                ok = shape == want
            if not ok:
                raise OipRequestError(
                    400,
                    f"input {spec.name!r}: shape must be {_expected(spec)} with 1 <= N <= {limit}, "
                    f"got {clip(shape)}",
                )
        if len(rows) > 1:
            raise OipRequestError(400, f"model {model!r}: the inputs have different N {sorted(rows)}")
        names = {t.name for t in outputs}
        for output in request.outputs:
            if output.name not in names:
                raise OipRequestError(
                    400, f"model {model!r} has the outputs {sorted(names)}, not {clip(output.name)}"
                )
        count = rows.pop() if rows else 1
        if len(inputs) == 1 and inputs[0].batched:
            return list(given[inputs[0].name].data)
        return [
            {t.name: given[t.name].data[i] if t.batched else given[t.name].data for t in inputs}
            for i in range(count)
        ]

    def _max_samples(self, model: str) -> int:
        return self.server.queue_bound(model)

    async def _infer(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        model = self._model(request)
        self.stats.requests += 1
        try:
            body = await self._read_body(request)
            try:
                infer = decode_request(body, request.headers.get(HEADER_LENGTH))
            except OipMessageError as exc:
                raise OipRequestError(exc.status, str(exc)) from None
            samples = self._samples(model, infer)
            deadline = _deadline(infer.parameters)
        except OipRequestError:
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
        _, specs = self._tensors(model)
        wanted = {o.name for o in infer.outputs} if infer.outputs else None
        tensors = [
            Tensor(t.name, _rows(t, [r.outputs[t.name] if r.outputs else r.output for r in results]))
            for t in specs
            if wanted is None or t.name in wanted
        ]
        parameters: dict[str, Any] = {
            "edgeserve_exit": _joined([r.exit_name for r in results]),
            "edgeserve_exit_index": _joined([r.exit_index for r in results]),
            "edgeserve_served_by": _joined([r.served_by for r in results]),
            "edgeserve_late": any(r.late for r in results),
            "edgeserve_deadline_ms": round((results[0].deadline - results[0].queued) * 1000.0, 3),
        }
        accuracies = [r.expected_accuracy for r in results]
        if all(a is not None for a in accuracies):
            parameters["edgeserve_expected_accuracy"] = round(sum(accuracies) / len(accuracies), 6)
        response = InferResponse(model, tensors, VERSION, infer.id, parameters)
        parameters["edgeserve_server_ms"] = round((time.monotonic() - received) * 1000.0, 3)
        body, headers = encode_response(response, binary_outputs(infer, [t.name for t in tensors]))
        answer = web.Response(body=body, headers=headers)
        if len(body) >= COMPRESS_MIN_BYTES:
            answer.enable_compression()  # only when the client sent Accept-Encoding
        return answer


def _expected(spec: TensorSpec) -> str:
    dims = ", ".join(str(d) for d in spec.shape)
    shape = f"[N, {dims}]" if spec.batched and dims else ("[N]" if spec.batched else f"[{dims}]")
    return f"{shape} {_DATATYPE[spec.dtype]}"


def _metadata(spec: TensorSpec) -> dict[str, Any]:
    """A tensor as model metadata lists it: -1 for the batch and for sizes that vary."""
    shape = [-1, *spec.shape] if spec.batched else list(spec.shape)
    return {"name": spec.name, "datatype": _DATATYPE[spec.dtype], "shape": shape}


def _config_entry(spec: TensorSpec) -> dict[str, Any]:
    """A tensor as Triton's model configuration lists it (dims without the batch)."""
    entry: dict[str, Any] = {"name": spec.name, "data_type": f"TYPE_{_DATATYPE[spec.dtype]}"}
    return {**entry, "dims": list(spec.shape)}


def _rows(spec: TensorSpec, values: list[Any]) -> np.ndarray:
    """Per-sample outputs as one tensor: stacked on N when batched, the one sample's otherwise."""
    if len(values) == 1:
        array = np.asarray(values[0])
        return array[np.newaxis] if spec.batched else array
    return np.stack([np.asarray(v) for v in values])

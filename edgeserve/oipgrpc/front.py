"""The Open Inference Protocol (KServe v2) over gRPC: Triton's `inference.GRPCInferenceService` on
`[listen] grpc`, so that tritonclient.grpc, perf_analyzer -i grpc and KServe gRPC clients reach the
scheduler unchanged.

It runs a grpc.aio server on an event loop of its own, on a thread beside the Server's
(loop_thread.py says why), and hands each request to the Server's loop for Server.infer (the
Server is loop-only). It applies the HTTP front's rules (oip/frontend.py) through
wire/oip_model.py: the inputs a model takes by name, datatype and shape, at most
`Server.queue_bound(model)` samples a request, the deadline parameters (`deadline_ms`, Triton's
`timeout` in microseconds, `capture_ts`; else the gRPC deadline the client set), and the tensors
decoded by wire/oip_codec.py. An infer request of N samples becomes N `Server.infer` calls under
one deadline. RPCs, status codes and parameters are in docs/oip.md, "gRPC".

The messages are generated from Triton's .proto files (proto/, README.md there says how), in a
package of their own so that they never collide with tritonclient's in protobuf's descriptor pool;
the service is registered under Triton's name, which is all that reaches the wire.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format

from edgeserve import __version__
from edgeserve.config.access import bearer_ok, warn_if_exposed
from edgeserve.config.http_limits import HttpLimits
from edgeserve.config.server import ListenConfig
from edgeserve.errors import listen_failure
from edgeserve.oipgrpc.fair_gate import FairGate, Ticket
from edgeserve.oipgrpc.limits import server_options
from edgeserve.oipgrpc.loop_thread import Crossing, LoopThread
from edgeserve.oipgrpc.proto import grpc_service_pb2 as pb
from edgeserve.oipgrpc.proto import model_config_pb2
from edgeserve.runtime import FrontendStats, Result, Sample, Server, Status
from edgeserve.wire.oip_codec import (
    InferRequest,
    OipMessageError,
    RequestedOutput,
    RequestHeader,
    TensorEntry,
    clip,
    datatype_of,
    materialise,
    tensor_bytes,
)
from edgeserve.wire.oip_model import (
    ModelInputs,
    ModelTables,
    answer_parameters,
    check,
    deadline_keywords,
    metadata_entry,
    model_config,
    output_rows,
    samples,
)

_log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"  # Triton's: the path every client calls
VERSION = "1"  # every model has one version, as on HTTP
EXTENSIONS = ("model_configuration", "parameters")
SHUTDOWN_GRACE_S = 2.0  # at close, RPCs still running after this long (an idle open stream) are cancelled
OPEN_METHODS = ("ServerLive", "ServerReady")  # answered without the token (probes)

# gRPC status per Result status, as Triton uses them: a full queue and shutdown are UNAVAILABLE
# (retry, or go elsewhere), an expired deadline DEADLINE_EXCEEDED.
GRPC_STATUS = {
    Status.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Status.ERROR: grpc.StatusCode.INTERNAL,
    Status.SHUTDOWN: grpc.StatusCode.UNAVAILABLE,
    Status.REJECTED: grpc.StatusCode.UNAVAILABLE,
    Status.EXPIRED: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# When samples of one request end differently, the answer reports the first of these (as on HTTP).
PRECEDENCE = (Status.INVALID, Status.ERROR, Status.SHUTDOWN, Status.REJECTED, Status.EXPIRED)

# The typed `contents` field that carries each datatype (FP16 has none: raw_input_contents only).
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The least deadline a gRPC deadline is turned into (a deadline already past is answered expired).
MIN_DEADLINE_MS = 0.001


@dataclass(slots=True)
class Request:
    """A ModelInfer request read: whose (`context.peer()`: one per connection), its samples, the
    Server.infer deadline keywords, and the time.monotonic() it came to the handler."""

    peer: str
    model: str
    found: list[Sample]
    deadline: dict[str, float]
    received: float


class Refusal(Exception):
    """A request refused before any sample is queued: the gRPC status and its message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parameter_values(parameters: Any) -> dict[str, Any]:
    """A map<string, InferParameter> as plain values (bool, int, float or str)."""
    found: dict[str, Any] = {}
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which is not None:
            found[key] = getattr(parameter, which)
    return found


def set_parameter(parameter: Any, value: Any) -> None:
    """One InferParameter from a plain value."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)


def _entry(index: int, tensor: Any, raw: Any) -> TensorEntry:
    """One input as the codec's TensorEntry: its bytes from raw_input_contents, or its typed contents."""
    shape, where = list(tensor.shape), f"inputs[{index}] ({clip(tensor.name)})"
    count = math.prod(shape) if all(d >= 0 for d in shape) else 0
    parameters = parameter_values(tensor.parameters)
    if raw is not None:
        return TensorEntry(tensor.name, tensor.datatype, shape, count, parameters, where, raw=memoryview(raw))
    field = CONTENTS.get(tensor.datatype)
    if field is None:
        raise OipMessageError(f"{where}: {clip(tensor.datatype)} data must be sent in raw_input_contents")
    data = list(getattr(tensor.contents, field))
    return TensorEntry(tensor.name, tensor.datatype, shape, count, parameters, where, data=data)


def read_infer(request: Any, table: ModelInputs) -> tuple[InferRequest, list[Sample]]:
    """The request and its samples: its inputs checked against the model (wire/oip_model.py) before
    any tensor is decoded; OipMessageError naming what is wrong otherwise."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise OipMessageError(
            f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs: "
            "send every input raw, or none"
        )
    entries = [_entry(i, t, raw[i] if raw else None) for i, t in enumerate(request.inputs)]
    outputs = [RequestedOutput(o.name, True, parameter_values(o.parameters)) for o in request.outputs]
    header = RequestHeader(entries, outputs, request.id or None, parameter_values(request.parameters))
    count = check(header, table)
    infer = materialise(header)
    return infer, samples(infer, table.inputs, count)


def _failure(results: list[Result]) -> tuple[grpc.StatusCode, str] | None:
    failed = [r for r in results if r.status is not Status.OK]
    if not failed:
        return None
    status = next(s for s in PRECEDENCE if any(r.status is s for r in failed))
    index = next(i for i, r in enumerate(results) if r.status is status)
    detail = results[index].error or status.value
    where = f"sample {index} of {len(results)}: " if len(results) > 1 else ""
    return GRPC_STATUS[status], f"{status.value}: {where}{detail}"


class OipGrpcFront:
    """Serve `server` over gRPC at `listen.grpc`: `address = await front.start()`, `await front.close()`.

    The HTTP listeners' caps and timeouts and the socket front's window hold (limits.py); with
    `[listen] token` every RPC but ServerLive and ServerReady needs the metadata
    `authorization: Bearer <token>` (UNAUTHENTICATED otherwise)."""

    def __init__(
        self, server: Server, listen: ListenConfig, limits: Callable[[], HttpLimits] | None = None
    ) -> None:
        """`limits`: the HTTP listeners' limits in force (NetServer's HttpGuard derives them once
        for all listeners); by default derived here, when the front starts."""
        if listen.grpc is None:
            raise ValueError("OipGrpcFront needs listen.grpc (host, port); port 0 picks a free one")
        self.server = server
        self.listen = listen
        self.stats = FrontendStats()
        self.address: str | None = None
        self._grpc: grpc.aio.Server | None = None  # on self._beside's loop, as is all of gRPC here
        self._beside: LoopThread | None = None
        self._to_server: Crossing | None = None  # calls into the Server's loop
        self._to_grpc: Crossing | None = None  # and back
        self._stopping: asyncio.Task[None] | None = None
        self._limits = limits or (lambda: HttpLimits.from_listen(listen))
        self._tables = ModelTables(server)  # per model: its tensors and what a request may carry
        self._gate = FairGate(self._total)  # on the Server's loop
        self._in_flight_total = 1 << 30  # [listen] max_in_flight_total, resolved at start
        self._total_at = (math.nan, 0)  # (loop time, the total in force then)
        self._margin_s = listen.reply_margin_ms / 1000.0  # Server.infer's reply_margin_s

    # -- lifecycle ---------------------------------------------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler:
        """The service's handlers, under Triton's service name."""
        unary: dict[str, tuple[Callable[[Any, Any], Awaitable[Any]], Any]] = {
            "ServerLive": (self._live, pb.ServerLiveRequest),
            "ServerReady": (self._ready, pb.ServerReadyRequest),
            "ModelReady": (self._model_ready, pb.ModelReadyRequest),
            "ServerMetadata": (self._server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": (self._model_metadata, pb.ModelMetadataRequest),
            "ModelConfig": (self._model_config, pb.ModelConfigRequest),
            "RepositoryIndex": (self._repository_index, pb.RepositoryIndexRequest),
            "ModelInfer": (self._model_infer, pb.ModelInferRequest),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                fn if name in OPEN_METHODS else self._guarded(fn),
                request_deserializer=kind.FromString,
                response_serializer=_serialize,
            )
            for name, (fn, kind) in unary.items()
        }
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self._stream, request_deserializer=pb.ModelInferRequest.FromString, response_serializer=_serialize
        )
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    async def start(self) -> str:
        """Listen on listen.grpc (call on the Server's loop); returns host:port (the real port when
        0 was asked)."""
        resolved = self.listen.resolved(*self.server.window_bounds())
        window = resolved.max_in_flight
        assert window is not None
        self._in_flight_total = resolved.in_flight_total
        options = server_options(self.listen, self._limits(), window)
        beside = LoopThread("edgeserve-grpc")
        self._to_server, self._to_grpc = Crossing(asyncio.get_running_loop()), Crossing(beside.loop)
        beside.start()
        try:
            self.address = await beside.run(self._listen(options))
        except BaseException:
            await beside.stop()
            raise
        self._beside = beside
        return self.address

    async def _listen(self, options: list[tuple[str, int]]) -> str:
        """The grpc.aio server, made and started on the gRPC loop."""
        assert self.listen.grpc is not None
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((self.handler(),))
        host, port = self.listen.grpc
        shown = f"[{host}]" if ":" in host else host
        try:
            bound = server.add_insecure_port(f"{shown}:{port}")
        except RuntimeError as exc:  # grpc raises this, without an errno, for a port it cannot bind
            bound, reason = 0, str(exc)
        else:
            reason = "the address is in use or cannot be bound"
        if not bound:
            raise listen_failure("listen.grpc", f"{host}:{port}", OSError(reason)) from None
        await server.start()
        self._grpc = server
        _log.info("Open Inference Protocol over gRPC on %s:%s", shown, bound)
        warn_if_exposed(_log, "listen.grpc (Open Inference Protocol)", host, bound, self.listen.token)
        return f"{shown}:{bound}"

    async def stop_accepting(self) -> None:
        """Take no new RPCs; the running ones are still answered (UNAVAILABLE once shut down)."""
        if self._beside is not None and self._stopping is None:
            await self._beside.run(self._begin_stop())

    async def _begin_stop(self) -> None:
        assert self._grpc is not None
        self._stopping = asyncio.ensure_future(self._grpc.stop(SHUTDOWN_GRACE_S))
        await asyncio.sleep(0)  # (the stop's first step: no call is taken after it)

    async def _stopped(self) -> None:
        assert self._stopping is not None
        await self._stopping

    async def close(self) -> None:
        """Close (call after Server.close has answered everything in flight)."""
        beside = self._beside
        if beside is None:
            return
        await self.stop_accepting()
        await beside.run(self._stopped())
        await beside.stop()
        self._beside = self._grpc = None

    def _guarded(self, fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._authorize(context)
            return await fn(request, context)

        return guarded

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        """With [listen] token: the metadata `authorization: Bearer <token>` (UNAUTHENTICATED if not)."""
        token = self.listen.token
        if token is None:
            return
        given = [v for k, v in (context.invocation_metadata() or ()) if k == "authorization"]
        if given and isinstance(given[0], str) and bearer_ok(given[0], token):
            return
        self.stats.refused_auth += 1
        what = "a wrong" if given else "no"
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{what} bearer token: send the metadata 'authorization: Bearer <[listen] token>'",
        )

    # -- health and metadata -----------------------------------------------------------------------

    async def _live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def _ready(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.server.accepting)

    async def _server_metadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="edgeserve", version=__version__, extensions=EXTENSIONS)

    async def _repository_index(self, request: Any, context: Any) -> Any:
        state = "READY" if self.server.accepting else "UNAVAILABLE"
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[index(name=m, version=VERSION, state=state) for m in self.server.models]
        )

    def _model(self, name: str, version: str) -> str:
        """The served model named (NOT_FOUND naming the served ones, or the versions, if not)."""
        if name not in self.server.models:
            served = ", ".join(self.server.models)
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"unknown model {clip(name)}; served: {served}")
        if version and version != VERSION:
            raise Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"model {name!r} has no version {clip(version)}; versions: [{VERSION!r}]",
            )
        return name

    async def _served(self, request: Any, context: grpc.aio.ServicerContext) -> str:
        try:
            return self._model(request.name, request.version)
        except Refusal as exc:
            await context.abort(exc.code, exc.message)
            raise  # (abort raises)

    async def _model_ready(self, request: Any, context: Any) -> Any:
        """Ready: a served model while the server accepts; an unknown one or version is not ready
        (as tritonclient.http reads the HTTP front's 404)."""
        try:
            self._model(request.name, request.version)
        except Refusal:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.server.accepting)

    def _platform(self) -> str:
        return f"edgeserve_{self.server.config.backend.name}"

    async def _model_metadata(self, request: Any, context: Any) -> Any:
        model = await self._served(request, context)
        inputs, outputs = self._tables.tensors(model)
        answer = {
            "name": model,
            "versions": [VERSION],
            "platform": self._platform(),
            "inputs": [metadata_entry(t) for t in inputs],
            "outputs": [metadata_entry(t) for t in outputs],
        }
        return json_format.ParseDict(answer, pb.ModelMetadataResponse())

    async def _model_config(self, request: Any, context: Any) -> Any:
        """Triton's model configuration, the HTTP front's /config as the ModelConfig message."""
        model = await self._served(request, context)
        config = self.server.config
        max_batch = self.server.latency_model.models[self.server.models.index(model)].max_batch
        answer = model_config(
            model,
            self._platform(),
            config.backend.name,
            max_batch,
            config.models[model].slo_ms,
            self.server.manifest(model).exits,
            *self._tables.tensors(model),
        )
        return pb.ModelConfigResponse(config=json_format.ParseDict(answer, model_config_pb2.ModelConfig()))

    # -- infer -------------------------------------------------------------------------------------

    def _read(
        self, request: Any, remaining: float | None
    ) -> tuple[str, InferRequest, list[Sample], dict[str, float]]:
        """The model, the request, its samples and Server.infer's deadline keywords; Refusal if bad.
        A request whose parameters give no deadline gets the gRPC deadline the client set, if any;
        one with a budget (`deadline_ms`, `timeout`) and a gRPC deadline gets the tighter. A budget
        runs from the request's arrival here, the gRPC deadline from the client's call (gRPC sends
        what is left of it when the call leaves the client): only the latter counts the time the
        call waited in the client's channel for a free stream (`grpc.max_concurrent_streams`) and
        in grpc's queue here, which under overload is most of its deadline."""
        model = self._model(request.model_name, request.model_version)
        try:
            infer, found = read_infer(request, self._tables.inputs(model))
            deadline = deadline_keywords(infer.parameters)
        except OipMessageError as exc:
            self.stats.protocol_errors += 1
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if remaining is not None and "capture_ts" not in deadline:
            left_ms = max(remaining * 1000.0, MIN_DEADLINE_MS)
            deadline = {"deadline_ms": min(deadline.get("deadline_ms", left_ms), left_ms)}
        return model, infer, found, deadline

    async def _run(self, request: Request) -> list[Result]:
        """The samples' Results, from Server.infer on the Server's loop, in the peer's turn there
        (fair_gate.py); the RPC cancelled (its client went away) cancels them there too, which
        drops what is still waiting or queued."""
        assert self._to_server is not None
        reply: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        ticket = Ticket(len(request.found))
        self._to_server.call(self._start, reply, ticket, request)
        try:
            return await reply
        except asyncio.CancelledError:
            self.stats.discarded += 1
            self._to_server.call(self._gate.cancel, ticket)  # (after _start: in order)
            raise

    def _start(self, reply: asyncio.Future[list[Result]], ticket: Ticket, request: Request) -> None:
        """(On the Server's loop.) Into the gate; the task that answers `reply` on the gRPC loop
        once it is let through."""
        gate, to_grpc = self._gate, self._to_grpc
        assert to_grpc is not None

        def done(task: asyncio.Task[object]) -> None:
            gate.leave(ticket)
            to_grpc.call(_settle, reply, task)

        def begin() -> asyncio.Task[object]:
            task: asyncio.Task[object] = asyncio.ensure_future(self._infer(request))
            task.add_done_callback(done)
            return task

        gate.enter(request.peer, ticket, begin)

    def _total(self, in_flight: int) -> int:
        """(On the Server's loop.) The gRPC front's in-flight total in force, as the socket front's
        (Frontend.refresh_total): what the server should hold now, at most the configured total;
        asked once per loop time (uvloop's, to the millisecond), as there."""
        now = asyncio.get_running_loop().time()
        if now != self._total_at[0]:
            limit = min(self._in_flight_total, self.server.in_flight_limit(in_flight, self._margin_s))
            self._total_at = (now, limit)
        return self._total_at[1]

    async def _infer(self, request: Request) -> list[Result]:
        """(On the Server's loop, which also reads stats.by_status for the metrics.) The deadline
        runs from the request's arrival on the gRPC loop (`received`): its wait in the gate and
        its crossings count."""
        model, found, infer = request.model, request.found, self.server.infer
        keywords = {"reply_margin_s": self._margin_s, "received": request.received, **request.deadline}
        if len(found) == 1:
            results = [await infer(model, found[0], **keywords)]
        else:
            results = list(await asyncio.gather(*(infer(model, x, **keywords) for x in found)))
        for result in results:
            self.stats.by_status[result.status.value] = self.stats.by_status.get(result.status.value, 0) + 1
        return results

    async def _answer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The ModelInferResponse for one request; Refusal for one refused or failed."""
        received = time.monotonic()
        self.stats.requests += 1
        model, infer, found, deadline = self._read(request, context.time_remaining())
        results = await self._run(Request(context.peer(), model, found, deadline, received))
        failure = _failure(results)
        if failure is not None:
            raise Refusal(*failure)
        _, specs = self._tables.tensors(model)
        wanted = {o.name for o in infer.outputs} if infer.outputs else None
        response = pb.ModelInferResponse(model_name=model, model_version=VERSION, id=request.id)
        for spec in specs:
            if wanted is not None and spec.name not in wanted:
                continue
            data = output_rows(spec, [r.outputs[spec.name] if r.outputs else r.output for r in results])
            response.outputs.add(name=spec.name, datatype=datatype_of(data), shape=data.shape)
            response.raw_output_contents.append(tensor_bytes(data))
        parameters = answer_parameters(results)
        # from the request's arrival here, as HTTP's (Result.queued is its later one at the Server)
        parameters["edgeserve_deadline_ms"] = round((results[0].deadline - received) * 1000.0, 3)
        parameters["edgeserve_server_ms"] = round((time.monotonic() - received) * 1000.0, 3)
        for key, value in parameters.items():
            set_parameter(response.parameters[key], value)
        return response

    async def _model_infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await self._answer(request, context)
        except Refusal as exc:
            await context.abort(exc.code, exc.message)

    async def _stream(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """ModelStreamInfer: every request answered on the stream as soon as it is done (not in
        order: `id` matches them), a refused or failed one as `error_message`, as Triton does."""
        await self._authorize(context)
        answers: asyncio.Queue[Any] = asyncio.Queue()

        async def one(request: Any) -> None:
            try:
                response = await self._answer(request, context)
                answer = pb.ModelStreamInferResponse(infer_response=response)
            except Refusal as exc:
                answer = _stream_error(request, exc.message)
            except Exception as exc:  # a fault here: the client still gets its answer, the log the trace
                _log.exception("gRPC ModelStreamInfer failed")
                answer = _stream_error(request, f"internal server error ({type(exc).__name__})")
            answers.put_nowait(answer)

        async def read() -> None:
            running: set[asyncio.Task[None]] = set()
            try:
                async for request in requests:
                    task = asyncio.ensure_future(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.wait(set(running))
            finally:
                for task in running:
                    task.cancel()
                answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
            await reader  # (its error, if any)
        finally:
            reader.cancel()


def _settle(reply: asyncio.Future[list[Result]], done: asyncio.Task[list[Result]]) -> None:
    """(On the gRPC loop.) The Server loop's task's outcome, unless the RPC was cancelled since."""
    if reply.done():
        return
    if done.cancelled():
        reply.cancel()
    elif (error := done.exception()) is not None:
        reply.set_exception(error)
    else:
        reply.set_result(done.result())


def _stream_error(request: Any, message: str) -> Any:
    """A stream's answer to a request refused or failed: Triton's `error_message`, with its id."""
    response = pb.ModelInferResponse(id=request.id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=response)


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()

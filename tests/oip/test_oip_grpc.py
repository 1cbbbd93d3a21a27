"""The Open Inference Protocol over gRPC ([listen] grpc) against tritonclient.grpc, unchanged.

One server listens on HTTP and gRPC: every answer over gRPC is compared with the HTTP front's
(tritonclient.http) for the same input. Requests tritonclient will not build (typed `contents`,
bad raw sizes) go through its own generated stub and messages: they are what any client sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from net_support import ServerThread, server_thread
from oip_support import grpc_address, http_url, oip_config
from runtime_support import HookedFactory, profiled_tiny_repository

from edgeserve.config.checks import ConfigError
from edgeserve.config.server import ServerConfig
from edgeserve.net.listeners import require_listener

grpcclient = pytest.importorskip("tritonclient.grpc")
import grpc  # noqa: E402
import tritonclient.grpc.aio as grpcclient_aio  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from edgeserve.oipgrpc.proto import grpc_service_pb2, model_config_pb2  # noqa: E402

TOKEN = "s3cret-token"
FRAME = 64 * 1024


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oip-grpc") / "engines"
    profiled_tiny_repository(root)
    return root


@pytest.fixture(scope="module")
def served(served_root: Path) -> Iterator[ServerThread]:
    config = oip_config(served_root, grpc="127.0.0.1:0", max_frame_bytes=FRAME)
    with server_thread(config) as srv:
        yield srv


@pytest.fixture
def triton(served: ServerThread) -> Iterator[Any]:
    client = grpcclient.InferenceServerClient(grpc_address(served))
    yield client
    client.close()


@pytest.fixture
def triton_http(served: ServerThread) -> Iterator[Any]:
    client = httpclient.InferenceServerClient(http_url(served).removeprefix("http://"), network_timeout=10)
    yield client
    client.close()


@pytest.fixture
def stub(served: ServerThread) -> Iterator[Any]:
    with grpc.insecure_channel(grpc_address(served)) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def status_of(info: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(info.value.status())


def grpc_input(x: np.ndarray) -> Any:
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def http_infer(client: Any, model: str, x: np.ndarray, deadline_ms: float = 500) -> Any:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return client.infer(model, [tensor], parameters={"deadline_ms": deadline_ms})


# -- the messages --------------------------------------------------------------------------------------


def _fields(message: Any) -> dict[str, tuple[int, int, bool]]:
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.fields}


@pytest.mark.parametrize(
    ("ours", "theirs"), [(grpc_service_pb2, service_pb2), (model_config_pb2, grpcclient.model_config_pb2)]
)
def test_the_generated_messages_are_tritonclients_on_the_wire(ours: Any, theirs: Any) -> None:
    def walk(mine: Any, other: Any, where: str) -> None:
        assert _fields(mine) == _fields(other), where
        assert set(mine.nested_types_by_name) == set(other.nested_types_by_name), where
        for name, nested in other.nested_types_by_name.items():
            walk(mine.nested_types_by_name[name], nested, f"{where}.{name}")
        for name, enum in other.enum_types_by_name.items():
            values = {v.name: v.number for v in enum.values}
            assert {v.name: v.number for v in mine.enum_types_by_name[name].values} == values

    assert set(ours.DESCRIPTOR.message_types_by_name) == set(theirs.DESCRIPTOR.message_types_by_name)
    for name, message in theirs.DESCRIPTOR.message_types_by_name.items():
        walk(ours.DESCRIPTOR.message_types_by_name[name], message, name)
    for name, service in theirs.DESCRIPTOR.services_by_name.items():
        mine = ours.DESCRIPTOR.services_by_name[name]
        assert [(m.name, m.client_streaming, m.server_streaming) for m in mine.methods] == [
            (m.name, m.client_streaming, m.server_streaming) for m in service.methods
        ]


def test_listen_grpc_is_parsed_like_http_and_off_by_default(served_root: Path) -> None:
    config = oip_config(served_root)
    assert ServerConfig.from_dict(config).listen.grpc is None
    listen = ServerConfig.from_dict({**config, "listen": {"grpc": ":8001"}}).listen
    assert listen.grpc == ("127.0.0.1", 8001)
    with pytest.raises(ConfigError, match=r"listen\.grpc"):
        ServerConfig.from_dict({**config, "listen": {"grpc": "8001"}})
    with pytest.raises(ConfigError, match=r"listen\.grpc"):
        ServerConfig.from_dict({**config, "listen": {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8000"}})
    require_listener(listen)  # gRPC alone is a listener: a server may serve nothing else


# -- health, metadata, configuration -------------------------------------------------------------------


def test_health_metadata_and_config_match_the_http_front(triton, triton_http) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny_a") and triton.is_model_ready("tiny_b", "1")
    assert not triton.is_model_ready("tiny_b", "2") and not triton.is_model_ready("resnet")
    server = triton.get_server_metadata()
    assert server.name == "edgeserve" and server.version == triton_http.get_server_metadata()["version"]
    for model in ("tiny_a", "tiny_b"):
        metadata, expected = triton.get_model_metadata(model), triton_http.get_model_metadata(model)
        assert metadata.name == model and list(metadata.versions) == expected["versions"]
        assert metadata.platform == expected["platform"]
        for got, want in zip(
            [*metadata.inputs, *metadata.outputs], [*expected["inputs"], *expected["outputs"]], strict=True
        ):
            assert (got.name, got.datatype, list(got.shape)) == (
                want["name"],
                want["datatype"],
                want["shape"],
            )
        config, http = triton.get_model_config(model).config, triton_http.get_model_config(model)
        assert config.max_batch_size == http["max_batch_size"] == 4
        assert [(t.name, list(t.dims)) for t in config.input] == [
            (t["name"], t["dims"]) for t in http["input"]
        ]
        assert [model_config_pb2.DataType.Name(t.data_type) for t in config.input] == [
            t["data_type"] for t in http["input"]
        ]
        assert [(t.name, list(t.dims)) for t in config.output] == [
            (t["name"], t["dims"]) for t in http["output"]
        ]
        assert config.parameters["exits"].string_value == http["parameters"]["exits"]["string_value"]


def test_index_urls_and_the_rpcs_not_offered(served: ServerThread, triton, stub) -> None:
    index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=10)
    assert [(m.name, m.version, m.state) for m in index.models] == [
        ("tiny_a", "1", "READY"),
        ("tiny_b", "1", "READY"),
    ]
    assert f"grpc://{grpc_address(served)}" in served.net.urls
    with pytest.raises(InferenceServerException) as info:
        triton.get_inference_statistics("tiny_a")
    assert status_of(info) == "StatusCode.UNIMPLEMENTED"


def test_an_unknown_model_is_not_found(triton) -> None:
    for call in (triton.get_model_metadata, triton.get_model_config):
        with pytest.raises(InferenceServerException) as info:
            call("resnet")
        assert status_of(info) == "StatusCode.NOT_FOUND"
        assert "unknown model 'resnet'; served: tiny_a, tiny_b" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        triton.infer("resnet", [grpc_input(np.zeros((1, 1, 8, 8), np.float32))])
    assert status_of(info) == "StatusCode.NOT_FOUND"


# -- infer ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "shape"), [("tiny_a", (3, 1, 8, 8)), ("tiny_b", (2, 3, 16, 16))])
def test_infer_answers_what_the_http_front_answers(triton, triton_http, model: str, shape: tuple) -> None:
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    result = triton.infer(model, [grpc_input(x)], request_id="req-9", parameters={"deadline_ms": 500})
    http = http_infer(triton_http, model, x)
    response = result.get_response()
    assert response.id == "req-9" and response.model_name == model and response.model_version == "1"
    parameters = response.parameters
    assert parameters["edgeserve_deadline_ms"].double_param == 500
    assert parameters["edgeserve_late"].bool_param is False
    assert parameters["edgeserve_served_by"].string_param == "local"
    exit_index = parameters["edgeserve_exit_index"].int64_param
    assert exit_index == http.get_response()["parameters"]["edgeserve_exit_index"]
    logits = result.as_numpy("logits")
    assert logits.dtype == np.float32 and logits.shape[0] == shape[0]
    np.testing.assert_array_equal(logits, http.as_numpy("logits"))


def test_typed_contents_and_named_outputs_are_taken(stub, triton_http) -> None:
    x = np.random.default_rng(6).standard_normal((2, 1, 8, 8)).astype(np.float32)
    request = service_pb2.ModelInferRequest(model_name="tiny_a", id="typed")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 1, 8, 8])
    tensor.contents.fp32_contents.extend(x.reshape(-1).tolist())
    request.outputs.add(name="logits")
    request.parameters["deadline_ms"].int64_param = 500
    response = stub.ModelInfer(request, timeout=10)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["logits"]
    assert list(response.outputs[0].shape) == [2, 5] and response.outputs[0].datatype == "FP32"
    logits = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 5)
    np.testing.assert_array_equal(logits, http_infer(triton_http, "tiny_a", x).as_numpy("logits"))


def test_tritons_timeout_parameter_and_the_grpc_deadline_set_the_deadline(triton) -> None:
    x = np.zeros((1, 3, 16, 16), dtype=np.float32)
    result = triton.infer("tiny_b", [grpc_input(x)], timeout=250_000)  # Triton's, in microseconds
    assert result.get_response().parameters["edgeserve_deadline_ms"].double_param == 250
    result = triton.infer("tiny_b", [grpc_input(x)], client_timeout=5.0)  # the gRPC deadline
    deadline = result.get_response().parameters["edgeserve_deadline_ms"].double_param
    assert 4000 < deadline <= 5100  # (gRPC rounds the timeout it sends up)
    result = triton.infer("tiny_b", [grpc_input(x)])  # neither: the model's SLO
    assert result.get_response().parameters["edgeserve_deadline_ms"].double_param == 1000
    # both: the tighter (the gRPC deadline also counts the call's wait before it reached the server)
    result = triton.infer("tiny_b", [grpc_input(x)], parameters={"deadline_ms": 60_000}, client_timeout=5.0)
    assert 4000 < result.get_response().parameters["edgeserve_deadline_ms"].double_param <= 5100
    result = triton.infer("tiny_b", [grpc_input(x)], parameters={"deadline_ms": 300}, client_timeout=5.0)
    assert result.get_response().parameters["edgeserve_deadline_ms"].double_param == 300


def test_a_deadline_too_short_is_deadline_exceeded(triton) -> None:
    x = np.zeros((1, 1, 8, 8), dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        # a frame captured 10 s ago, past its model's 1 s SLO: answered expired at once
        triton.infer("tiny_a", [grpc_input(x)], parameters={"capture_ts": time.time() - 10})
    assert status_of(info) == "StatusCode.DEADLINE_EXCEEDED" and "expired" in info.value.message()
    assert triton.infer("tiny_a", [grpc_input(x)]).as_numpy("logits").shape == (1, 5)  # still serving


def _request(shape: list[int], datatype: str = "FP32", name: str = "x", raw: bytes | None = None) -> Any:
    request = service_pb2.ModelInferRequest(model_name="tiny_a")
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    count = int(np.prod(shape))
    request.raw_input_contents.append(b"\0" * 4 * count if raw is None else raw)
    return request


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (
            _request([1, 8, 8]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "shape must be [N, 1, 8, 8] FP32 with 1 <= N <= 64",
        ),
        (_request([65, 1, 8, 8]), grpc.StatusCode.INVALID_ARGUMENT, "1 <= N <= 64, got [65, 1, 8, 8]"),
        (
            _request([1, 1, 8, 8], "INT32"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "datatype must be FP32, got INT32",
        ),
        (
            _request([1, 1, 8, 8], name="input"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "one input named 'x', got 'input'",
        ),
        (_request([1, 1, 8, 8], raw=b"\0" * 12), grpc.StatusCode.INVALID_ARGUMENT, "12 bytes of FP32"),
        (
            _request([1, 1, 8, 8], raw=b"\0" * (FRAME + 1)),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "",
        ),
    ],
    ids=["wrong-shape", "too-many", "wrong-dtype", "wrong-name", "raw-size", "too-large"],
)
def test_bad_requests_are_invalid_argument_naming_the_fault(
    stub, request_: Any, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request_, timeout=10)
    assert info.value.code() == code
    assert message in info.value.details()


def test_deadline_parameters_must_be_positive_numbers(stub) -> None:
    request = _request([1, 1, 8, 8])
    request.parameters["deadline_ms"].string_param = "soon"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "parameters.deadline_ms: must be a positive number" in info.value.details()


# -- the stream and the asyncio client ------------------------------------------------------------------


def test_stream_answers_every_request_and_errors_on_the_stream(triton, triton_http) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    triton.start_stream(callback=lambda result, error: answers.put((result, error)))
    rng = np.random.default_rng(7)
    inputs = {f"s{i}": rng.standard_normal((1 + i % 3, 1, 8, 8)).astype(np.float32) for i in range(6)}
    try:
        for request_id, x in inputs.items():
            triton.async_stream_infer(
                "tiny_a", [grpc_input(x)], request_id=request_id, parameters={"deadline_ms": 500}
            )
        triton.async_stream_infer("tiny_a", [grpc_input(np.zeros((1, 8, 8), np.float32))], request_id="bad")
        got = [answers.get(timeout=10) for _ in range(len(inputs) + 1)]
    finally:
        triton.stop_stream()
    errors = [error for result, error in got if error is not None]
    assert len(errors) == 1 and "shape must be [N, 1, 8, 8] FP32" in errors[0].message()
    results = {result.get_response().id: result for result, error in got if error is None}
    assert set(results) == set(inputs)
    for request_id, x in inputs.items():
        expected = http_infer(triton_http, "tiny_a", x).as_numpy("logits")
        np.testing.assert_array_equal(results[request_id].as_numpy("logits"), expected)


def test_the_asyncio_client_infers(served: ServerThread, triton_http) -> None:
    x = np.random.default_rng(8).standard_normal((2, 1, 8, 8)).astype(np.float32)

    async def run() -> np.ndarray:
        client = grpcclient_aio.InferenceServerClient(grpc_address(served))
        try:
            assert await client.is_server_live() and await client.is_model_ready("tiny_a")
            tensor = grpcclient_aio.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = await client.infer("tiny_a", [tensor], parameters={"deadline_ms": 500})
            return result.as_numpy("logits")
        finally:
            await client.close()

    logits = asyncio.run(run())
    np.testing.assert_array_equal(logits, http_infer(triton_http, "tiny_a", x).as_numpy("logits"))


def test_a_cancelled_rpc_is_dropped_before_it_runs(served_root: Path) -> None:
    """gRPC runs on a loop of its own: an RPC its client cancels must still reach the Server's
    loop and take its request out of the queue, never run."""
    factory = HookedFactory(delay_s=0.4)
    with (
        server_thread(oip_config(served_root, grpc="127.0.0.1:0"), factory) as srv,
        grpc.insecure_channel(grpc_address(srv)) as channel,
    ):
        assert srv.net.grpc is not None and factory.backend is not None
        infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        factory.backend.spans.clear()
        factory.backend.entered.clear()
        busy = infer.future(_request([1, 1, 8, 8]))  # holds the executor for 0.4 s
        assert factory.backend.entered.wait(10)
        queued = infer.future(_request([1, 1, 8, 8]))
        until = time.monotonic() + 10
        while srv.net.grpc.stats.requests < 2 and time.monotonic() < until:
            time.sleep(0.005)
        queued.cancel()
        assert busy.result(10).model_name == "tiny_a" and queued.cancelled()
        until = time.monotonic() + 10
        while srv.net.grpc.stats.discarded < 1 and time.monotonic() < until:
            time.sleep(0.005)
        infer(_request([1, 1, 8, 8]), timeout=10)  # served after it: the queue is not stuck
        assert srv.net.grpc.stats.discarded == 1
        assert [size for _, _, size in factory.backend.spans] == [1, 1]  # the cancelled one never ran


# -- the token ----------------------------------------------------------------------------------------


def test_with_a_token_every_rpc_but_health_needs_the_bearer_metadata(served_root: Path) -> None:
    config = oip_config(served_root, grpc="127.0.0.1:0", token=TOKEN)
    with server_thread(config) as srv:
        client = grpcclient.InferenceServerClient(grpc_address(srv))
        try:
            assert client.is_server_live() and client.is_server_ready()  # probes stay open
            x = np.zeros((1, 1, 8, 8), dtype=np.float32)
            for headers in (None, {"authorization": "Bearer wrong"}):
                with pytest.raises(InferenceServerException) as info:
                    client.get_model_metadata("tiny_a", headers=headers)
                assert status_of(info) == "StatusCode.UNAUTHENTICATED"
                assert "bearer token" in info.value.message()
                with pytest.raises(InferenceServerException) as info:
                    client.infer("tiny_a", [grpc_input(x)], headers=headers)
                assert status_of(info) == "StatusCode.UNAUTHENTICATED"
            auth = {"authorization": f"Bearer {TOKEN}"}
            assert client.get_model_metadata("tiny_a", headers=auth).name == "tiny_a"
            assert client.infer("tiny_a", [grpc_input(x)], headers=auth).as_numpy("logits").shape == (1, 5)
            answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            try:
                with contextlib.suppress(InferenceServerException):  # (the stream may be closed already)
                    client.async_stream_infer("tiny_a", [grpc_input(x)])
                result, error = answers.get(timeout=10)
            finally:
                client.stop_stream()
            assert result is None and "UNAUTHENTICATED" in str(error.status())
        finally:
            client.close()

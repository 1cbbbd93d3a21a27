"""tritonclient (an independent client of the protocol) against edgeserve's OIP frontend.

tritonclient.http is blocking (geventhttpclient); importing it does not monkey-patch the standard
library (checked below), so it runs in the test thread while the server's loop runs in its own.
Error cases the client library hides (malformed bodies, oversize, encodings) go through urllib.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from net_support import ServerThread
from oip_support import oip_config, oip_server
from runtime_support import profiled_tiny_repository

from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend

tritonclient_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oip-triton") / "engines"
    profiled_tiny_repository(root)
    return root


@pytest.fixture(scope="module")
def served(served_root: Path) -> Iterator[tuple[ServerThread, str]]:
    # max_frame_bytes is small so that the 413 test needs only a small body
    with oip_server(oip_config(served_root, max_frame_bytes=64 * 1024)) as pair:
        yield pair


@pytest.fixture
def triton(served: tuple[ServerThread, str]) -> Iterator[object]:
    client = tritonclient_http.InferenceServerClient(served[1].removeprefix("http://"), network_timeout=10)
    yield client
    client.close()


def reference_logits(root: Path, model: str, exit_index: int, x: np.ndarray) -> np.ndarray:
    """The same ONNX Runtime backend the server runs, called directly at the exit the server reported."""
    repository = ModelRepository(root)
    backend = OnnxRuntimeBackend(repository, threads=1, warmup=0)
    try:
        backend.load(repository.load_manifest(model))
        return backend.run(model, exit_index, x)
    finally:
        backend.close()


def test_importing_tritonclient_does_not_monkey_patch_the_standard_library() -> None:
    from gevent import monkey

    assert not monkey.is_module_patched("socket") and not monkey.is_module_patched("threading")


def test_tritonclient_reads_health_server_and_model_metadata_and_config(triton) -> None:
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny_a") and triton.is_model_ready("tiny_b", "1")
    assert not triton.is_model_ready("tiny_b", "2")
    server = triton.get_server_metadata()
    assert server["name"] == "edgeserve" and "binary_tensor_data" in server["extensions"]
    metadata = triton.get_model_metadata("tiny_b")
    assert metadata["versions"] == ["1"] and metadata["platform"] == "edgeserve_onnxruntime"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 7]}]
    config = triton.get_model_config("tiny_b")
    assert config["max_batch_size"] == 4  # the profile's B_max (runtime_support.MAX_BATCH)
    assert config["input"][0]["dims"] == [3, 16, 16] and config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["output"][0]["dims"] == [7]
    assert config["parameters"]["exits"] == {"string_value": "early,final"}
    assert config["parameters"]["slo_ms"] == {"string_value": "1000"}


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_infer_returns_the_backends_logits_at_the_reported_exit(
    triton, served_root: Path, binary: bool
) -> None:
    x = np.random.default_rng(3).standard_normal((3, 1, 8, 8)).astype(np.float32)
    tensor = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    wanted = tritonclient_http.InferRequestedOutput("logits", binary_data=binary)
    result = triton.infer(
        "tiny_a", [tensor], outputs=[wanted], parameters={"deadline_ms": 50}, request_id="req-7"
    )
    response = result.get_response()
    parameters = response["parameters"]
    assert response["id"] == "req-7" and response["model_name"] == "tiny_a"
    assert ("data" in response["outputs"][0]) is not binary  # binary outputs carry no JSON data
    assert parameters["edgeserve_deadline_ms"] == 50 and parameters["edgeserve_late"] is False
    assert parameters["edgeserve_served_by"] == "local" and parameters["edgeserve_server_ms"] > 0
    exit_index = parameters["edgeserve_exit_index"]
    assert isinstance(exit_index, int), "one request, one batch: every sample took the same exit"
    assert parameters["edgeserve_exit"] == ["layer1", "layer2", "final"][exit_index]
    logits = result.as_numpy("logits")
    assert logits.shape == (3, 5) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, reference_logits(served_root, "tiny_a", exit_index, x), atol=1e-5)


def test_tritons_timeout_parameter_in_microseconds_sets_the_deadline(triton) -> None:
    x = np.zeros((1, 3, 16, 16), dtype=np.float32)
    tensor = tritonclient_http.InferInput("x", [1, 3, 16, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = triton.infer("tiny_b", [tensor], timeout=250_000)  # no outputs named: all binary
    assert result.get_response()["parameters"]["edgeserve_deadline_ms"] == 250
    assert result.as_numpy("logits").shape == (1, 7)


def test_compressed_requests_and_responses_work(triton) -> None:
    x = np.ones((2, 1, 8, 8), dtype=np.float32)
    tensor = tritonclient_http.InferInput("x", [2, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    for algorithm in ("gzip", "deflate"):
        result = triton.infer(
            "tiny_a",
            [tensor],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        assert result.as_numpy("logits").shape == (2, 5)


def test_tritonclient_sees_404_for_an_unknown_model(triton) -> None:
    with pytest.raises(InferenceServerException) as info:
        triton.get_model_metadata("resnet")
    assert info.value.status() == "404" or info.value.status() == 404
    assert "unknown model 'resnet'; served: tiny_a, tiny_b" in info.value.message()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def infer_body(shape: list[int], datatype: str = "FP32", name: str = "x") -> bytes:
    count = int(np.prod(shape))
    return json.dumps(
        {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": [0] * count}]}
    ).encode()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        (
            "tiny_z/infer",
            infer_body([1, 1, 8, 8]),
            None,
            404,
            "unknown model 'tiny_z'; served: tiny_a, tiny_b",
        ),
        ("tiny_a/versions/3/infer", infer_body([1, 1, 8, 8]), None, 404, "has no version '3'"),
        (
            "tiny_a/infer",
            infer_body([1, 8, 8]),
            None,
            400,
            "shape must be [N, 1, 8, 8] FP32 with 1 <= N <= 64",
        ),
        ("tiny_a/infer", infer_body([65, 1, 8, 8]), None, 400, "1 <= N <= 64, got [65, 1, 8, 8]"),
        ("tiny_a/infer", infer_body([1, 1, 8, 8], "INT32"), None, 400, "datatype must be FP32, got INT32"),
        (
            "tiny_a/infer",
            infer_body([1, 1, 8, 8], name="input"),
            None,
            400,
            "one input named 'x', got 'input'",
        ),
        ("tiny_a/infer", b'{"inputs": [', None, 400, "body is not valid JSON"),
        ("tiny_a/infer", b"\0" * (64 * 1024 + 1), None, 413, "exceeds listen.max_frame_bytes (65536"),
        (
            "tiny_a/infer",
            infer_body([1, 1, 8, 8]),
            {"Content-Encoding": "zstd"},
            415,
            "'zstd' is not supported",
        ),
        (
            "tiny_a/infer",
            gzip.compress(b" " * (200 * 1024)),
            {"Content-Encoding": "gzip"},
            413,
            "decompressed",
        ),
    ],
    ids=[
        "unknown-model",
        "unknown-version",
        "wrong-shape",
        "too-many",
        "wrong-dtype",
        "wrong-name",
        "bad-json",
        "too-large",
        "encoding",
        "gzip-bomb",
    ],
)
def test_bad_requests_get_the_status_and_a_json_error_naming_the_fault(
    served: tuple[ServerThread, str],
    path: str,
    body: bytes,
    headers: dict[str, str] | None,
    status: int,
    message: str,
) -> None:
    got, answer = post(f"{served[1]}/v2/models/{path}", body, headers)
    assert got == status
    assert message in str(answer["error"])


def test_deadline_parameters_must_be_positive_numbers(served: tuple[ServerThread, str]) -> None:
    body = json.loads(infer_body([1, 1, 8, 8]))
    body["parameters"] = {"deadline_ms": "soon"}
    status, answer = post(f"{served[1]}/v2/models/tiny_a/infer", json.dumps(body).encode())
    assert status == 400 and "parameters.deadline_ms: must be a positive number" in str(answer["error"])


def test_accepted_connections_have_tcp_nodelay(triton, served: tuple[ServerThread, str]) -> None:
    srv = served[0]
    assert triton.is_server_live()  # keeps a connection open in the client's pool

    async def server_side_flags() -> list[int]:
        assert srv.net.oip is not None and srv.net.oip._runner is not None
        connections = srv.net.oip._runner.server.connections
        sockets = [c.transport.get_extra_info("socket") for c in connections if c.transport is not None]
        return [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets]

    flags = asyncio.run_coroutine_threadsafe(server_side_flags(), srv.loop).result(10)
    assert flags and all(flags)

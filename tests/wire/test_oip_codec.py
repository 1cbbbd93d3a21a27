"""The Open Inference Protocol codec: round trips in JSON and binary, and clear errors on bad messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgeserve.wire.oip_codec import (
    HEADER_LENGTH,
    InferRequest,
    InferResponse,
    OipMessageError,
    RequestedOutput,
    Tensor,
    binary_outputs,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    np.arange(6, dtype=np.int64).reshape(2, 3) - 3,
    np.array([[True, False]]),
    np.arange(5, dtype=np.uint8),
    np.arange(4, dtype=np.float16),
    np.array([b"ab", b"", "\u00e9".encode()], dtype=object),
]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: str(a.dtype))
def test_request_round_trips_every_datatype(array: np.ndarray, binary: bool) -> None:
    request = InferRequest([Tensor("x", array)], [RequestedOutput("logits", binary=True)], "req-1", {"k": 1})
    body, headers = encode_request(request, binary=binary)
    assert (HEADER_LENGTH in headers) == binary
    decoded = decode_request(body, headers.get(HEADER_LENGTH))
    assert decoded.id == "req-1" and decoded.parameters == {"k": 1}
    assert decoded.outputs[0].name == "logits" and decoded.outputs[0].binary
    got = decoded.inputs[0].data
    assert got.shape == array.shape and got.dtype == array.dtype
    assert got.tolist() == array.tolist()


def test_response_sends_only_the_requested_outputs_binary() -> None:
    a, b = np.ones((2, 3), np.float32), np.arange(2, dtype=np.int32)
    response = InferResponse("m", [Tensor("a", a), Tensor("b", b)], "1", "id", {"edgeserve_exit": "final"})
    body, headers = encode_response(response, binary={"a"})
    header = json.loads(body[: int(headers[HEADER_LENGTH])])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": a.nbytes}
    assert header["outputs"][1]["data"] == [0, 1]
    decoded = decode_response(body, headers[HEADER_LENGTH])
    assert decoded.parameters == {"edgeserve_exit": "final"} and decoded.model_version == "1"
    np.testing.assert_array_equal(decoded.output("a"), a)
    np.testing.assert_array_equal(decoded.output("b"), b)


def test_nested_json_data_is_read_row_major() -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]}
    )
    x = decode_request(body.encode()).inputs[0].data
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]] and x.dtype == np.float32


def test_binary_data_output_parameter_asks_for_every_output() -> None:
    body = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
            "parameters": {"binary_data_output": True},
        }
    )
    request = decode_request(body.encode())
    assert binary_outputs(request, ["logits", "exit"]) == {"logits", "exit"}


@pytest.mark.parametrize(
    ("header", "tail", "length", "message"),
    [
        ({"inputs": "x"}, b"", None, "request.inputs: wrong type str"),
        ({}, b"", None, "missing 'inputs'"),
        ({"inputs": []}, b"", None, "at least one tensor"),
        ({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}, b"", None, "1 values"),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP99", "data": [1]}]},
            b"",
            None,
            "unsupported 'FP99'",
        ),
        (
            {"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]},
            b"",
            None,
            "non-negative",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": ["a"]}]},
            b"",
            None,
            "only INT32",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1000]}]},
            b"",
            None,
            "does not fit",
        ),
        ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, b"", None, "neither 'data'"),
        (
            {
                "inputs": [
                    {"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
                ]
            },
            b"\0" * 4,
            "auto",
            "exceeds",
        ),
        (
            {
                "inputs": [
                    {"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 4}}
                ]
            },
            b"\0" * 4,
            "auto",
            "expected 8",
        ),
        (
            {
                "inputs": [
                    {"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}
                ]
            },
            b"\0" * 6,
            "auto",
            "belong to no tensor",
        ),
    ],
)
def test_malformed_requests_name_the_field(
    header: dict, tail: bytes, length: str | None, message: str
) -> None:
    text = json.dumps(header).encode()
    with pytest.raises(OipMessageError, match=message) as info:
        decode_request(text + tail, len(text) if length == "auto" else length)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (b"{", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b"{}", "x", "integer"),
        (b"{}", 99, "outside"),
    ],
)
def test_unreadable_bodies_are_refused(body: bytes, length: object, message: str) -> None:
    with pytest.raises(OipMessageError, match=message):
        decode_request(body, length)  # type: ignore[arg-type]


def test_error_response_raises_with_the_servers_message() -> None:
    with pytest.raises(OipMessageError, match="model busy"):
        decode_response(b'{"error": "model busy"}')


def test_non_text_bytes_go_binary_or_are_refused_in_json() -> None:
    request = InferRequest([Tensor("x", np.array([b"\x00\xff"], dtype=object))])
    body, headers = encode_request(request, binary=True)
    assert decode_request(body, headers[HEADER_LENGTH]).inputs[0].data.tolist() == [b"\x00\xff"]
    with pytest.raises(OipMessageError, match="send it binary"):
        encode_request(request, binary=False)

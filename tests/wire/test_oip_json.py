"""The codec's JSON is orjson's where orjson and the standard library agree, and the standard
library's everywhere else: the same values read, the same bodies refused with the same message, and
what is written reads back to what the standard library would have written."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest

from edgeserve.wire.oip_codec import (
    InferRequest,
    InferResponse,
    OipMessageError,
    Tensor,
    _dumps,
    _loads,
    decode_request,
    encode_request,
    encode_response,
)

EDGES = [
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',  # the standard library's extension
    b'{"big": 123456789012345678901234567890, "neg": -99999999999999999999}',
    b'{"x": 1e400, "y": -1e400, "z": 1e-400}',
    b'{"a": 1, "a": 2, "b": 3}',  # duplicates: the last value, the first key's place
    b'{"s": "\\ud800 lone surrogate", "t": "\\u00e9\\ud83d\\ude00"}',
    b'{"x": -0, "y": -0.0, "z": 0E0, "w": 1E+2}',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte-order mark
    '{"x": [1.5]}'.encode("utf-16"),
    '{"x": "\u00e9"}'.encode("latin-1"),
    b"[" * 5000 + b"]" * 5000,
    b"[" * 200 + b"]" * 200,
    b'{"x": 1} trailing',
    b'{"x": 01}',
    b'{"x": .5}',
    b"{'x': 1}",
    b'{"x": "tab\tinside"}',
    b" \n\t{}\r\n ",
    b"",
    b"null",
    b'"text"',
    b"12",
]


def _same(text: bytes) -> None:
    """`_loads(text)` reads what `json.loads` reads, or raises what it raises (type and message)."""
    try:
        want: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)) as info:
            _loads(text)
        assert str(info.value) == str(exc)
        return
    got = _loads(text)
    assert repr(got) == repr(want), text[:80]  # types, values, NaN and key order included


@pytest.mark.parametrize("text", EDGES, ids=range(len(EDGES)))
def test_what_orjson_refuses_the_standard_library_reads_or_refuses(text: bytes) -> None:
    _same(text)


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(2**70), 2**70) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if kind == 2:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10.0 ** rng.randint(-320, 308), -0.0])
    if kind == 3:
        return np.float32(rng.random()).item()  # a float32's value, as a tensor's tolist() gives
    if kind in (4, 5):
        return _text(rng)
    if kind in (6, 7):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    size = rng.randrange(5)
    return {_text(rng) if rng.random() < 0.9 else "k": _value(rng, depth + 1) for _ in range(size)}


def _text(rng: random.Random) -> str:
    return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)])) for _ in range(5))


def _mutated(rng: random.Random, text: bytes) -> bytes:
    data = bytearray(text)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(data) + 1)
        op = rng.randrange(3)
        if op == 0 and data:
            del data[min(at, len(data) - 1)]
        elif op == 1:
            data.insert(at, rng.choice(b'{}[]",:0123456789.eE+-ntfalsrue\\ \x00\xff'))
        elif data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
    return bytes(data)


def test_random_and_mutated_json_is_read_as_the_standard_library_reads_it() -> None:
    rng = random.Random(20261126)
    for _ in range(3000):
        value = {str(k): _value(rng) for k in range(rng.randrange(1, 4))}
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        _same(text)
        _same(_mutated(rng, text))


def test_what_is_written_reads_back_as_the_standard_librarys_writing() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        header = {"outputs": [{"name": "y", "data": _value(rng)}], "parameters": {"p": _value(rng, 3)}}
        want = json.dumps(header, separators=(",", ":"), allow_nan=False)
        assert repr(json.loads(_dumps(header))) == repr(json.loads(want))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, [1.0, math.nan], {"deep": {"x": math.inf}}])
@pytest.mark.parametrize("where", ["request", "output"])
def test_a_non_finite_parameter_is_refused_as_before(bad: Any, where: str) -> None:
    """orjson would write null; the standard library refuses, and so does the codec."""
    header: dict[str, Any] = {"outputs": [{"name": "y", "data": [1.0]}]}
    if where == "request":
        header["parameters"] = {"p": bad}
    else:
        header["outputs"][0]["parameters"] = {"p": bad}
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        _dumps(header)


def test_what_orjson_cannot_write_the_standard_library_writes() -> None:
    header = {"parameters": {1: "int key", "big": 2**80, "f": np.float64(0.25)}, "outputs": []}
    assert _dumps(header) == json.dumps(header, separators=(",", ":")).encode()
    with pytest.raises(TypeError):
        _dumps({"parameters": {"a": object()}})


def test_tensors_in_json_read_back_exactly_with_their_datatypes() -> None:
    rng = np.random.default_rng(3)
    x = rng.random((2, 3, 4), dtype=np.float32)
    x[0, 0, 0] = np.nan
    body, _ = encode_request(InferRequest([Tensor("x", x)], [], "i", {"deadline_ms": 8.5}), binary=False)
    request = decode_request(body)
    got = request.inputs[0].data
    assert got.dtype == np.float32 and np.isnan(got[0, 0, 0])
    np.testing.assert_array_equal(got.reshape(-1)[1:], x.reshape(-1)[1:])
    assert request.parameters == {"deadline_ms": 8.5} and request.id == "i"
    body, _ = encode_response(InferResponse("m", [Tensor("y", x)], "1", None, {"p": 1.0}))
    assert json.loads(body)["outputs"][0]["data"][0] is None


@pytest.mark.parametrize(
    ("datatype", "data", "ok"),
    [
        ("FP32", [1, -2.5], True),
        ("FP32", [1, True], False),
        ("FP32", [None, 1.0], True),  # null: NaN
        ("FP32", ["1.5", 2.0], False),
        ("INT32", [1, 2], True),
        ("INT32", [1, 2.0], False),
        ("INT32", [False, 1], False),
        ("INT32", [None, 1], False),
        ("BOOL", [True, False], True),
        ("BOOL", [1, 0], False),
        ("BOOL", [None, True], False),
    ],
)
def test_json_data_must_hold_values_of_its_datatype(datatype: str, data: list[Any], ok: bool) -> None:
    entry = {"name": "x", "shape": [len(data)], "datatype": datatype, "data": data}
    body = json.dumps({"inputs": [entry]}).encode()
    if ok:
        assert decode_request(body).inputs[0].data.shape == (2,)
    else:
        with pytest.raises(OipMessageError, match=f"only {datatype} values"):
            decode_request(body)

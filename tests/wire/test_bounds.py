"""brief(), cut(), timing_problem() and decode_tensor's shape arithmetic: bounded, never raising."""

from __future__ import annotations

import math
import time

import msgpack
import numpy as np
import pytest

from edgeserve.wire.bounds import (
    BRIEF_LIMIT,
    ERROR_TEXT_LIMIT,
    MAX_CLOCK_SKEW_S,
    MAX_DEADLINE_MS,
    MIN_DEADLINE_MS,
    brief,
    cut,
    timing_problem,
)
from edgeserve.wire.frames import ProtocolError, decode_body, parse_infer
from edgeserve.wire.tensors import MAX_ELEMENTS, TensorError, decode_tensor, encode_tensor

NOW = 1.7e9  # a Unix time for the timing checks


def _nested(depth: int, leaf: object = "x") -> object:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


class _Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        5e-324,
        math.nan,
        -math.inf,
        2**64,
        10**5000,  # repr() of this raises ValueError (int max str digits)
        "x" * 1_000_000,
        "\U0001f600" * 10_000,
        b"\xff" * 8_000_000,
        bytearray(300),
        list(range(100_000)),
        {str(i): i for i in range(10_000)},
        _nested(2000),
        _nested(200_000),
        (1,),
        {1, 2, 3},
        np.zeros((1000, 1000)),
        np.float32(1.5),
        _Hostile(),
    ],
    ids=lambda v: type(v).__name__,
)
def test_brief_renders_anything_in_a_bounded_ascii_text(value: object) -> None:
    text = brief(value)
    assert isinstance(text, str) and 0 < len(text) <= BRIEF_LIMIT
    assert text.isascii()
    assert brief(value, 60) == brief(value, 60) and len(brief(value, 60)) <= 60


def test_brief_shows_small_values_whole_and_marks_what_it_cuts() -> None:
    assert brief([0, 2**31 - 1, 2**31 - 1]) == "[0, 2147483647, 2147483647]"
    assert brief({"a": 1}) == "{'a': 1}"
    assert brief("tiny_a") == "'tiny_a'"
    assert brief((1,)) == "(1,)"
    assert brief(-1) == "-1"
    assert brief(5e-324) == "5e-324"
    assert "(cut, 1000000 chars)" in brief("x" * 1_000_000)
    assert "(cut, 8000000 bytes)" in brief(b"\0" * 8_000_000)
    assert "(cut, 100 items)" in brief(list(range(100)))
    assert brief(_nested(1000, "x")) == "[{'k': [<dict of 1 items>]}]"
    assert brief(10**5000) == "<int of 16610 bits>"
    assert brief(_Hostile()) == "<_Hostile>"
    assert brief(np.zeros((2, 3), np.float32)) == "<ndarray float32 [2, 3]>"


def test_cut_bounds_characters_and_utf8_bytes() -> None:
    assert cut("short") == "short"
    for text in ("a" * 5000, "\u00b5" * 999, "\U0001f600" * 300):
        out = cut(text)
        assert len(out) <= ERROR_TEXT_LIMIT and len(out.encode()) <= ERROR_TEXT_LIMIT
        assert "(cut, " in out
    assert cut("\u00b5" * 10) == "\u00b5" * 10  # short non-ASCII text is kept as it is


@pytest.mark.parametrize(
    "shape",
    [
        [0, 2**31 - 1, 2**31 - 1],  # the fuzzer's case: numpy raised "array is too big" on b""
        [0, 2**31 - 1, 2**31 - 1, 2**31 - 1],
        [2**31 - 1, 2**31 - 1],
        [0, 65536, 65536],
        [2**31],
        [2**63],
        [2**64],
        [-1],
        [-(2**63)],
        [0] * 9,
        [1.0],
        [True],
        ["1"],
        [None],
        [[1]],
        "1,2",
        None,
        _nested(2000),
        list(range(10**5)),
    ],
    ids=lambda s: brief(s, 40),
)
def test_decode_tensor_checks_the_shape_before_numpy_sees_it(shape: object) -> None:
    for data in (b"", b"\0" * 16):
        with pytest.raises(TensorError) as caught:
            decode_tensor({"dtype": "float32", "shape": shape, "data": data})
        text = str(caught.value)
        assert text.startswith("tensor.") and len(text) <= ERROR_TEXT_LIMIT


def test_decode_tensor_accepts_empty_and_edge_shapes() -> None:
    assert decode_tensor({"dtype": "float32", "shape": [0, 8, 8], "data": b""}).shape == (0, 8, 8)
    assert decode_tensor({"dtype": "uint8", "shape": [0, 2**31 - 1], "data": b""}).shape == (0, 2**31 - 1)
    assert decode_tensor({"dtype": "uint8", "shape": [], "data": b"\7"}).shape == ()
    limit = [0, MAX_ELEMENTS]
    assert decode_tensor({"dtype": "float64", "shape": limit, "data": b""}).size == 0
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert np.array_equal(decode_tensor(encode_tensor(x)), x)


def test_decode_tensor_error_texts_quote_a_bounded_part_of_the_input() -> None:
    huge = {"dtype": "x" * 1_000_000, "shape": [1], "data": b""}
    with pytest.raises(TensorError) as caught:
        decode_tensor(huge)
    assert len(str(caught.value)) <= ERROR_TEXT_LIMIT and "(cut, 1000000 chars)" in str(caught.value)
    with pytest.raises(TensorError) as caught:
        decode_tensor({"dtype": "uint8", "shape": [1], "data": b"", **{f"k{i}": i for i in range(10_000)}})
    assert len(str(caught.value)) <= ERROR_TEXT_LIMIT


@pytest.mark.parametrize(
    ("deadline_ms", "capture_ts", "wanted"),
    [
        (5e-324, None, "deadline_ms must be a positive number"),
        (MIN_DEADLINE_MS / 2, None, "from 0.001 (1 us) to 86400000 (1 day)"),
        (MAX_DEADLINE_MS * 1.01, None, "deadline_ms"),
        (math.inf, None, "deadline_ms"),
        (math.nan, None, "deadline_ms"),
        (2**64, None, "deadline_ms"),
        (10**400, None, "deadline_ms"),
        (-1, None, "deadline_ms"),
        (0, None, "deadline_ms"),
        (True, None, "deadline_ms"),
        ("5", None, "deadline_ms"),
        (None, 5e-324, "in the past"),
        (None, 1e308, "in the future"),
        (None, math.inf, "capture_ts must be a Unix time"),
        (None, -1.0, "capture_ts must be a Unix time"),
        (None, 2**64, "is the camera's clock set?"),
        (None, NOW - MAX_CLOCK_SKEW_S - 1, "in the past"),
        (None, NOW + MAX_CLOCK_SKEW_S + 1, "in the future"),
        (5, NOW, "not both"),
    ],
)
def test_timing_problem_bounds(deadline_ms: object, capture_ts: object, wanted: str) -> None:
    problem = timing_problem(deadline_ms, capture_ts, now=NOW)
    assert problem is not None and wanted in problem and len(problem) <= 300


@pytest.mark.parametrize(
    ("deadline_ms", "capture_ts"),
    [
        (MIN_DEADLINE_MS, None),
        (MAX_DEADLINE_MS, None),
        (5, None),
        (np.float32(5), None),
        (None, NOW),
        (None, NOW - MAX_CLOCK_SKEW_S + 1),  # old, so `expired` by the caller, but not a bad clock
        (None, NOW + MAX_CLOCK_SKEW_S - 1),
        (None, None),
    ],
)
def test_timing_problem_accepts_the_range(deadline_ms: object, capture_ts: object) -> None:
    assert timing_problem(deadline_ms, capture_ts, NOW) is None


def _infer(**fields: object) -> dict[str, object]:
    x = np.zeros((1, 2, 2), np.float32)
    return {"type": "infer", "id": 7, "model": "m", "tensor": encode_tensor(x), **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"model": _nested(1000)},
        {"model": "m" * 1_000_000},
        {"priority": _nested(1000)},
        {"deadline_ms": _nested(1000)},
        {"capture_ts": "x" * 1_000_000},
        {"tensor": _nested(1000)},
        {"tensor": {"dtype": "float32", "shape": [0, 2**31 - 1, 2**31 - 1], "data": b""}},
        {"tensor": {"dtype": "float32", "shape": [2**31 - 1] * 8, "data": b"\0" * 8_000_000}},
        {"x" * 1_000_000: 1},
        {"deadline_ms": 5e-324},
        pytest.param({"capture_ts": time.time() + 10 * MAX_CLOCK_SKEW_S}, id="capture_ts in the future"),
        {"priority": 2**64 - 1},
    ],
    ids=lambda f: brief(f, 40),
)
def test_parse_infer_errors_keep_the_id_and_stay_short(fields: dict[str, object]) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_infer(_infer(**fields))
    assert caught.value.request_id == 7
    assert len(str(caught.value).encode()) <= ERROR_TEXT_LIMIT


def test_decode_body_errors_are_short_and_never_recursion_errors() -> None:
    body = msgpack.packb({"type": "infer"}) + b"\xa5" + b"x" * 100_000  # ExtraData quotes the rest
    with pytest.raises(ProtocolError) as caught:
        decode_body(body, 1 << 20)
    assert len(str(caught.value)) <= ERROR_TEXT_LIMIT
    deep = b"\x91" * 100_000 + b"\xc0"  # 100000 nested arrays
    with pytest.raises(ProtocolError):
        decode_body(deep, 1 << 20)

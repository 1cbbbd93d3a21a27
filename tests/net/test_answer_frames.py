"""The `ok` answer written from cached pieces is byte for byte the general encoder's frame."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from edgeserve.net import answer_frames
from edgeserve.net.answer_frames import AnswerFrames
from edgeserve.net.frontend import result_message
from edgeserve.runtime.results import Result, Status
from edgeserve.wire.client import Reply
from edgeserve.wire.frames import HEADER, decode_body, encode_frame

DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int32", "int64", "bool"]


def general(request_id: int, result: Result, priority: int | None) -> bytes:
    return encode_frame(result_message(request_id, result, priority))


def random_result(rng: random.Random) -> Result:
    shapes = [(), (1,), (10,), (3, 4), (0, 2), (300,), (70000,)]
    outputs = {}
    for k in range(rng.choice([1, 1, 2, 3, 15])):
        shape = rng.choice(shapes)
        dtype = rng.choice(DTYPES)
        outputs[rng.choice(["logits", "boxes", f"out{k}", "ü-name"]) + str(k)] = (
            np.random.default_rng(k).standard_normal(shape).astype(dtype)
        )
    queued = rng.uniform(0, 1e6)
    start = math.nan if rng.random() < 0.1 else queued + rng.uniform(0, 0.1)
    end = queued + rng.uniform(0, 0.2)
    return Result(
        status=Status.OK,
        model=rng.choice(["digits-m", "m", "a" * 40, "模型"]),
        output=next(iter(outputs.values())),
        outputs=outputs,
        exit_index=rng.choice([0, 1, 3, 200]),
        exit_name=rng.choice(["final", "exit1", None]),
        expected_accuracy=rng.choice([0.97, None, 1.0, 0.123456789]),
        batch_size=rng.choice([0, 1, 7, 64, 300]),
        queued=queued,
        dispatch=queued,
        start=start,
        end=end,
        deadline=rng.choice([math.nan, end - 0.001, end + 0.001, end]),
        served_by=rng.choice(["local", "upstream-a"]),
    )


compiled = pytest.mark.skipif(answer_frames._compiled_frame is None, reason="no compiled writer")
IDS = [0, 5, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
PRIORITIES = [None, 0, -1, -32, -33, 5, 127, 128, 200, -128, -129, -(2**15) - 1, -(2**31), -(2**31) - 1]


@pytest.mark.parametrize("writer", ["compiled", "python"])
def test_ok_answers_are_the_general_encoders_bytes(writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if writer == "python":
        monkeypatch.setattr(answer_frames, "_compiled_frame", None)
    elif answer_frames._compiled_frame is None:
        pytest.skip("the compiled writer is not built")
    rng = random.Random(1)
    frames = AnswerFrames()
    written_by_c = 0
    for _ in range(3000):
        result = random_result(rng)
        request_id, priority = rng.choice(IDS), rng.choice(PRIORITIES)
        expected = general(request_id, result, priority)
        assert frames.frame(request_id, result, priority) == expected
        if writer == "compiled":  # the caches hold its pieces now (unless 15 outputs overflowed them)
            by_c = answer_frames._compiled_frame(request_id, result, priority, frames._tables)
            written_by_c += by_c is not None
            assert by_c in (None, expected)
    if writer == "compiled":
        assert written_by_c > 2900


@compiled
@pytest.mark.parametrize(
    "seconds",
    [
        0.0,
        -0.0,
        1.23456e-3,
        1.23455e-3,
        1.5e-7,
        2.5e-7,
        -2.5e-7,
        -1e-9,
        0.0012345,
        12.3456789,
        1e11,
        1e12 - 1e-3,
        1e12,
        1e13,
        5e302,
        -5e302,
        math.inf,
        -math.inf,
        math.nan,
        86400.0,
        1 / 3,
    ],
)
def test_compiled_timings_round_as_python_does(seconds: float) -> None:
    out = np.zeros(2, np.float32)
    frames = AnswerFrames()
    result = Result(Status.OK, "m", out, 0, "e", None, 1, 0.0, 0.0, seconds, seconds, 1.0, outputs={"y": out})
    assert frames.written_here(1, result, None) is not None  # fills the caches
    by_c = answer_frames._compiled_frame(1, result, None, frames._tables)
    assert by_c is not None and by_c == general(1, result, None)
    reply = Reply.from_message(decode_body(by_c[4:], len(by_c)))
    want = answer_frames.timing_ms(seconds)
    assert reply.timings["queue_ms"] == want or (want is None and reply.timings["queue_ms"] is None)


def test_the_frame_reads_back_as_its_result() -> None:
    out = np.arange(10, dtype=np.float32)
    result = Result(Status.OK, "digits-m", out, 1, "final", 0.9, 4, 1.0, 1.0, 1.001, 1.003, 1.01)
    result.outputs = {"logits": out}
    frame = AnswerFrames().frame(42, result, 3)
    assert frame is not None
    (size,) = HEADER.unpack_from(frame)
    reply = Reply.from_message(decode_body(frame[4:], size))
    assert (reply.id, reply.status, reply.model, reply.priority) == (42, "ok", "digits-m", 3)
    assert (reply.exit_index, reply.exit_name, reply.late) == (1, "final", False)
    assert reply.timings["batch_size"] == 4
    assert reply.timings["queue_ms"] == 1.0 and reply.timings["total_ms"] == 3.0
    np.testing.assert_array_equal(reply.output, out)
    np.testing.assert_array_equal(reply.outputs["logits"], out)


@pytest.mark.parametrize(
    "change",
    [
        {"status": Status.ERROR, "error": "boom"},
        {"outputs": None},
        {"outputs": {}},
        {"exit_index": None},
        {"outputs": {"x": np.zeros((3, 4), np.float32).T}},  # not C-ordered
        {"outputs": {"x": np.zeros(3, ">f4")}},  # big-endian: converted by the general encoder
        {"outputs": {"x": [1.0, 2.0]}},  # not an array
        {"outputs": {f"o{k}": np.zeros(1, np.float32) for k in range(16)}},  # not a fixmap
    ],
)
def test_unusual_answers_take_the_general_encoder(change: dict[str, object]) -> None:
    out = np.zeros(3, np.float32)
    result = Result(Status.OK, "m", out, 0, "final", 0.5, 1, 0.0, 0.0, 0.1, 0.2, 1.0, outputs={"y": out})
    frames = AnswerFrames()
    for shape in [(3,), (4, 3), (1,)]:  # the caches hold the usual answers' pieces
        usual = np.zeros(shape, np.float32)
        for name in ["y", "x", *(f"o{k}" for k in range(16))]:
            assert frames.frame(1, replace(result, outputs={name: usual}), None) is not None
    for name, value in change.items():
        setattr(result, name, value)
    assert frames.frame(1, result, None) is None


class Subclassed(np.ndarray):
    pass


@compiled
@pytest.mark.parametrize(
    "change",
    [
        {"batch_size": 2.0},  # not an int: msgpack writes a float
        {"queued": 1},  # an int time: Python's arithmetic
        {"outputs": {"y": np.zeros(3, np.float32).view(Subclassed)}},
        {"outputs": {"y": np.zeros(4, np.float32)}},  # a layout not cached yet
        {"model": "other"},
        {"served_by": "upstream"},
        {"exit_name": "other"},
        {"outputs": {"y": np.zeros(6, np.float32)[::2]}},  # cached layout, not C-ordered
    ],
)
def test_the_compiled_writer_declines_what_it_cannot_write_as_python_would(change: dict[str, object]) -> None:
    out = np.zeros(3, np.float32)
    result = Result(Status.OK, "m", out, 0, "final", 0.5, 1, 0.0, 0.0, 0.1, 0.2, 1.0, outputs={"y": out})
    frames = AnswerFrames()
    assert frames.frame(1, result, None) is not None
    assert answer_frames._compiled_frame(1, result, None, frames._tables) is not None
    changed = replace(result, **change)
    assert answer_frames._compiled_frame(1, changed, None, frames._tables) is None
    assert frames.frame(1, changed, None) in (None, general(1, changed, None))
    for request_id, priority in [(-(2**63) - 1, None), (2**64, None), (True, None), (1, 2**64), (1, 1.0)]:
        assert answer_frames._compiled_frame(request_id, result, priority, frames._tables) is None


@compiled
def test_the_compiled_writer_checks_its_arguments() -> None:
    out = np.zeros(3, np.float32)
    result = Result(Status.OK, "m", out, 0, "final", 0.5, 1, 0.0, 0.0, 0.1, 0.2, 1.0, outputs={"y": out})
    frames = AnswerFrames()
    with pytest.raises(TypeError):
        answer_frames._compiled_frame(1, result, None)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        answer_frames._compiled_frame(1, result, None, frames._tables[:6])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        answer_frames._compiled_frame(1, result, None, (*frames._tables[:3], [], {}, {}, {}))  # type: ignore[arg-type]
    assert answer_frames._compiled_frame(1, object(), None, frames._tables) is None  # type: ignore[arg-type]


def test_caches_stay_bounded() -> None:
    frames = AnswerFrames()
    for n in range(answer_frames.CACHE_LIMIT * 3):
        out = np.zeros(n % 700 + 1, np.float32)  # an output shape that varies, as a detector's may
        result = Result(Status.OK, "m", out, 0, "e", None, 1, 0.0, 0.0, 0.1, 0.2, 1.0, outputs={"y": out})
        assert frames.frame(n, result, None) == general(n, result, None)
    assert len(frames._layouts) <= answer_frames.CACHE_LIMIT

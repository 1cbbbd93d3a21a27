"""The compiled reader of the common infer request gives what fast_infer(decode_body(...)) gives,
or None: on valid frames written every way msgpack allows, and on random and mutated bytes."""

from __future__ import annotations

import random
import struct
from typing import Any

import msgpack
import numpy as np
import pytest

from edgeserve.wire import frames
from edgeserve.wire.frames import (
    ProtocolError,
    SampleSpec,
    compiled_head,
    compiled_infer,
    decode_body,
    fast_infer,
    infer_table,
    refusal_head,
)

pytestmark = pytest.mark.skipif(frames._compiled_parse is None, reason="the compiled reader is not built")

SPECS = {
    "digits-m": SampleSpec.of("float32", (1, 8, 8)),
    "模型": SampleSpec.of("uint8", (3,)),
    "scalar": SampleSpec.of("int64", ()),
}
TABLE = infer_table({name: spec for name, spec in SPECS.items() if spec is not None})


def reference(body: bytes) -> Any:
    """fast_infer's answer for a frame (None where decode_body refuses it), capture_ts left out."""
    try:
        message = decode_body(body, 1 << 20)
    except ProtocolError:
        return None
    found = fast_infer(message, {name: spec for name, spec in SPECS.items() if spec is not None})
    return None if found is None or found[4] is not None else found


def same(found: Any, expected: Any) -> bool:
    if found is None or expected is None:
        return found is expected
    return (
        found[:2] == expected[:2]
        and found[3:] == expected[3:]
        and type(found[3]) is type(expected[3])
        and found[2].dtype == expected[2].dtype
        and found[2].shape == expected[2].shape
        and found[2].tobytes() == expected[2].tobytes()
    )


def check(body: bytes, *, accepted: bool | None = None) -> None:
    buffer = bytearray(b"junk" + body + b"more")  # the frame sits inside a connection's buffer
    found = compiled_infer(buffer, 4, 4 + len(body), TABLE)
    expected = reference(body)
    if found is not None:  # whatever it accepts, the general way reads the same
        assert same(found, expected), (body, found, expected)
        # and a window's refusal of it answers with what a refusal of the decoded frame would
        assert compiled_head(buffer, 4, 4 + len(body), TABLE) == refusal_head(decode_body(body, 1 << 20))
    else:
        assert compiled_head(buffer, 4, 4 + len(body), TABLE) is None
    if accepted is not None:
        assert (found is not None) is accepted, body
        if accepted:
            assert same(found, expected)


def request(rng: random.Random) -> dict[str, Any]:
    model = rng.choice(["digits-m", "模型", "scalar"])
    spec = SPECS[model]
    assert spec is not None
    data = np.random.default_rng(rng.randrange(1000)).integers(0, 255, spec.nbytes, dtype=np.uint8).tobytes()
    message: dict[str, Any] = {
        "type": "infer",
        "id": rng.choice([0, 1, 127, 128, 255, 256, 65535, 65536, 2**32, 2**63 - 1]),
        "model": model,
        "tensor": dict(
            rng.sample([("dtype", spec.dtype_name), ("shape", list(spec.shape)), ("data", data)], 3)
        ),
    }
    if rng.random() < 0.7:
        message["deadline_ms"] = rng.choice(
            [5.0, 8, 0.001, 86_400_000, 1e-4, 10.5, 86_400_000.5, 0, -3, True]
        )
    if rng.random() < 0.3:
        message["priority"] = rng.choice([0, 1, -1, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1, None, 1.0])
    if rng.random() < 0.1:
        message["capture_ts"] = None
    keys = list(message)
    rng.shuffle(keys)
    return {key: message[key] for key in keys}


def test_common_requests_are_read_as_the_general_way_reads_them() -> None:
    rng = random.Random(0)
    accepted = 0
    for _ in range(3000):
        body = msgpack.packb(request(rng), use_bin_type=True)
        expected = reference(body)
        check(body, accepted=expected is not None)
        accepted += expected is not None
    assert accepted > 1000


def test_every_int_width_and_str_header_reads_the_same() -> None:
    """msgpack-python writes the shortest form; other encoders may not."""
    data = bytes(64 * 4)
    tensor = (
        (b"\x83\xa5dtype\xd9\x07float32\xa5shape\x93\xd0\x01\xcd\x00\x08\xcf" + (8).to_bytes(8, "big"))
        + b"\xa4data\xc5\x01\x00"
        + data
    )
    head = b"\x86\xa4type\xda\x00\x05infer\xa2id\xd3" + (7).to_bytes(8, "big") + b"\xa5model\xa8digits-m"
    tail = (
        b"\xabdeadline_ms\xca"
        + struct.pack(">f", 2.5)
        + b"\xa8priority\xd2"
        + (-5).to_bytes(4, "big", signed=True)
    )
    body = head + b"\xa6tensor" + tensor + tail
    check(body, accepted=True)
    found = compiled_infer(bytearray(body), 0, len(body), TABLE)
    assert found is not None and found[0] == 7 and found[3] == 2.5 and found[5] == -5


@pytest.mark.parametrize(
    "message",
    [
        {"type": "infer", "id": 1, "model": "digits-m", "tensor": {}, "capture_ts": 1.7e9},
        {
            "type": "infer",
            "id": -1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
        },
        {
            "type": "infer",
            "id": True,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
        },
        {
            "type": "hello",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
        },
        {
            "type": "infer",
            "id": 1,
            "model": "other",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
        },
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int32", "shape": [], "data": bytes(8)},
        },
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [1], "data": bytes(8)},
        },
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(7)},
        },
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": "x" * 8},
        },
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
            "x": 1,
        },
        {"type": "infer", "id": 1, "model": "scalar", "inputs": {"x": {}}},
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
            "deadline_ms": float("nan"),
        },
        {
            "type": "infer",
            "id": 1,
            "model": "scalar",
            "tensor": {"dtype": "int64", "shape": [], "data": bytes(8)},
            "deadline_ms": "5",
        },
    ],
)
def test_what_the_general_way_must_read_is_left_to_it(message: dict[str, Any]) -> None:
    check(msgpack.packb(message, use_bin_type=True), accepted=False)


def test_trailing_bytes_and_repeated_keys_are_left_to_the_general_way() -> None:
    body = msgpack.packb(request(random.Random(3)), use_bin_type=True)
    check(body + b"\xc0", accepted=False)
    repeated = b"\x85\xa2id\x01" + body[1:]  # "id" twice: the decoder keeps the last
    check(repeated, accepted=False)


def test_random_and_mutated_bytes_never_read_otherwise() -> None:
    rng = random.Random(7)
    bodies = [msgpack.packb(request(rng), use_bin_type=True) for _ in range(50)]
    for _ in range(20000):
        body = bytearray(rng.choice(bodies))
        for _ in range(rng.randint(1, 4)):
            cut = rng.randrange(len(body) + 1)
            edit = rng.random()
            if edit < 0.5 and body:
                body[min(cut, len(body) - 1)] = rng.randrange(256)
            elif edit < 0.7:
                del body[cut:]
            elif edit < 0.85:
                body[cut:cut] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
            else:
                del body[cut : cut + rng.randint(1, 9)]
        check(bytes(body))
    for _ in range(3000):
        check(bytes(rng.randrange(256) for _ in range(rng.randint(0, 80))))


@pytest.mark.parametrize(
    "args",
    [(bytearray(4), 2, 1, ()), (bytearray(4), 0, 5, ()), (bytearray(4), -1, 2, ()), (bytearray(4), 0, 4, [])],
)
def test_bad_arguments_raise_instead_of_reading_outside(args: tuple[Any, ...]) -> None:
    with pytest.raises((ValueError, TypeError)):
        frames._compiled_parse(*args)

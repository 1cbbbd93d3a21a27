"""The frame codec, tensor encoding and camera preprocessing, without sockets."""

from __future__ import annotations

import re

import msgpack
import numpy as np
import pytest

from edgeserve.config.server import PreprocessConfig
from edgeserve.net.preprocess import PreprocessError, preprocess_frame, resize
from edgeserve.wire.frames import (
    HEADER,
    UNIFORM_RUN,
    ProtocolError,
    decode_body,
    encode_frame,
    newest_frames_start,
    parse_hello,
    parse_infer,
)
from edgeserve.wire.tensors import DTYPES, TensorError, decode_tensor, encode_tensor


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_allowed_dtype_round_trips_exactly(dtype: str) -> None:
    x = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    y = decode_tensor(msgpack.unpackb(msgpack.packb(encode_tensor(x), use_bin_type=True)))
    assert y.dtype == x.dtype and np.array_equal(x, y)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if np.dtype(d).itemsize > 1])
def test_big_endian_and_strided_arrays_go_out_as_little_endian_c_order(dtype: str) -> None:
    x = (np.arange(24) % 7).astype(dtype).reshape(4, 6)
    for sent in (x.astype(np.dtype(dtype).newbyteorder(">")), x.T, x[:, ::2], np.asfortranarray(x)):
        wire = encode_tensor(sent)
        assert wire["dtype"] == dtype and wire["shape"] == list(sent.shape)
        assert wire["data"] == np.ascontiguousarray(sent, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        assert np.array_equal(decode_tensor(wire), sent)


def test_tensor_byte_count_must_match_the_shape() -> None:
    with pytest.raises(TensorError, match="has 15 bytes; float32 \\[2, 2\\] needs 16"):
        decode_tensor({"dtype": "float32", "shape": [2, 2], "data": b"\0" * 15})
    with pytest.raises(TensorError, match="dtype must be one of"):
        decode_tensor({"dtype": "object", "shape": [1], "data": b"\0" * 8})
    with pytest.raises(TensorError, match="non-negative integers"):
        decode_tensor({"dtype": "uint8", "shape": [-1], "data": b""})


def test_frame_is_a_big_endian_length_then_the_msgpack_map() -> None:
    frame = encode_frame({"type": "hello", "version": 1})
    (length,) = HEADER.unpack_from(frame)
    assert frame[:4] == length.to_bytes(4, "big") and length == len(frame) - 4
    assert decode_body(frame[4:], 1024) == {"type": "hello", "version": 1}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xc1", "not one msgpack value"),
        (msgpack.packb([1, 2]), "must hold a msgpack map"),
        (msgpack.packb({1: 2}), "not one msgpack value"),  # non-string keys
        (msgpack.packb({"a": 1}) + b"\x00", "not one msgpack value"),  # trailing data
        (msgpack.packb({"a": b"x" * 200}, use_bin_type=True), "not one msgpack value"),  # over the limit
    ],
)
def test_undecodable_bodies_raise_protocol_errors(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_body(body, 128)


def test_request_validation_names_the_field_and_keeps_the_id() -> None:
    tensor = encode_tensor(np.zeros(3, np.float32))
    good = parse_infer({"type": "infer", "id": 3, "model": "m", "tensor": tensor, "priority": 2})
    assert (good.id, good.model, good.priority, good.deadline_ms) == (3, "m", 2, None)
    cases = [
        ({"deadline_ms": -1}, "infer.deadline_ms must be a positive number"),
        ({"deadline_ms": 5, "capture_ts": 1.0}, "not both"),
        ({"priority": True}, "infer.priority must be an integer"),
        ({"model": ""}, "infer.model must be a model name"),
        ({"colour": 1}, "unknown fields ['colour']"),
    ]
    for extra, message in cases:
        with pytest.raises(ProtocolError, match=re.escape(message)) as info:
            parse_infer({"type": "infer", "id": 3, "model": "m", "tensor": tensor, **extra})
        assert info.value.request_id == 3
    with pytest.raises(ProtocolError, match=r"infer\.id must be an integer") as info:
        parse_infer({"type": "infer", "id": -1, "model": "m", "tensor": tensor})
    assert info.value.request_id is None
    for version in (2, 1.0, True, "1", None):  # only the integer 1: 1.0 and True compare equal to it
        with pytest.raises(ProtocolError, match=r"hello\.version must be 1"):
            parse_hello({"type": "hello", "version": version})
    assert parse_hello({"type": "hello", "version": 1}).version == 1


def test_bilinear_resize_interpolates_and_nearest_picks_pixels() -> None:
    frame = np.array([[0, 100], [200, 255]], dtype=np.uint8)[:, :, None]
    assert np.array_equal(resize(frame, 2, 2)[:, :, 0], frame[:, :, 0])
    up = resize(frame, 4, 4)[:, :, 0]
    assert up[0, 0] == 0 and up[3, 3] == 255 and 0 < up[1, 1] < 255
    assert np.isclose(up[1:3, 1:3].mean(), frame.astype(np.float32).mean())
    down = resize(np.arange(16, dtype=np.uint8).reshape(4, 4, 1), 2, 2, "nearest")[:, :, 0]
    assert set(down.ravel()) <= set(range(16))


def test_camera_frame_becomes_normalised_nchw_in_rgb_order() -> None:
    frame = np.zeros((4, 6, 3), dtype=np.uint8)
    frame[:, :, 0] = 255  # blue in a BGR frame
    config = PreprocessConfig(mean=(0.5,), std=(0.5,), channels="bgr")
    x = preprocess_frame(frame, config, (3, 2, 3))
    assert x.shape == (3, 2, 3) and x.dtype == np.float32
    assert np.allclose(x[2], 1.0) and np.allclose(x[0], -1.0) and np.allclose(x[1], -1.0)
    gray = preprocess_frame(frame, PreprocessConfig(channels="bgr"), (1, 4, 6))
    assert gray.shape == (1, 4, 6) and np.allclose(gray, 0.114, atol=1e-3)
    with pytest.raises(PreprocessError, match="height x width x 3"):
        preprocess_frame(frame[:, :, :2], config, (3, 2, 3))
    with pytest.raises(PreprocessError, match="does not match the model's 2x3"):
        preprocess_frame(frame, PreprocessConfig(resize=(5, 5)), (3, 2, 3))


def test_preprocessing_fits_channels_last_and_uint8_image_inputs() -> None:
    """Imported graphs take (H, W, C) images, and some take uint8 pixels they normalise themselves."""
    frame = (np.arange(4 * 6 * 3) % 251).astype(np.uint8).reshape(4, 6, 3)
    config = PreprocessConfig(mean=(0.5,), std=(0.5,))
    hwc = preprocess_frame(frame, config, (4, 6, 3))
    chw = preprocess_frame(frame, config, (3, 4, 6))
    assert hwc.shape == (4, 6, 3) and np.array_equal(hwc, chw.transpose(1, 2, 0))
    pixels = preprocess_frame(frame, config, (4, 6, 3), "uint8")
    assert pixels.dtype == np.uint8 and np.array_equal(pixels, frame)
    half = preprocess_frame(frame, config, (3, 4, 6), "float16")
    assert half.dtype == np.float16 and np.allclose(half, chw, atol=1e-3)
    with pytest.raises(PreprocessError, match="image input"):
        preprocess_frame(frame, config, (4, 6, 5))
    with pytest.raises(PreprocessError, match="image input"):
        preprocess_frame(frame, config, (3, 4, 6), "int64")


def _frame_starts(buffer: bytearray) -> list[int]:
    """Where each complete frame of `buffer` starts, one header after another."""
    starts, pos = [], 0
    while len(buffer) - pos >= HEADER.size:
        end = pos + HEADER.size + HEADER.unpack_from(buffer, pos)[0]
        if end > len(buffer):
            break
        starts.append(pos)
        pos = end
    return starts


def test_newest_frames_start_finds_the_last_frames_across_runs_of_any_length() -> None:
    """Runs of one length long enough for the numpy check, broken by frames of other lengths (one
    of them a header-only frame), with or without an incomplete frame at the end: the answer is
    where the last `count` complete frames start, 0 when there are no more than `count`; the
    buffer stays resizable (no view of it is left behind)."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        parts = []
        for _ in range(int(rng.integers(0, 4))):
            length = int(rng.choice([0, 3, 296]))
            parts += [HEADER.pack(length) + bytes(length)] * int(rng.integers(1, 3 * UNIFORM_RUN))
        buffer = bytearray(b"".join(parts))
        buffer += [b"", b"\0\0", HEADER.pack(500) + bytes(100)][int(rng.integers(0, 3))]
        starts = _frame_starts(buffer)
        for count in (1, 2, 7, UNIFORM_RUN + 1, 500):
            expected = starts[-count] if len(starts) > count else 0
            assert newest_frames_start(buffer, len(buffer), count) == expected
        buffer.clear()

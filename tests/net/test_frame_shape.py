"""FrameShape: a frame it matches decodes to the same type, model and priority as the learned one,
with the id the match reads; anything else does not match."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from edgeserve.net import frame_shape
from edgeserve.net.frame_shape import FrameShape, FrameShapes
from edgeserve.wire.frames import HEADER, MAX_ID, ProtocolError, decode_body
from edgeserve.wire.tensors import encode_tensor

TENSOR = encode_tensor(np.zeros((1, 8, 8), np.float32))


def frame_of(fields: dict[str, Any]) -> bytes:
    body = msgpack.packb(fields, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def raw_frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def learn(frame: bytes) -> FrameShape | None:
    return FrameShape.learn(frame, decode_body(frame[HEADER.size :], 1 << 20))


def request(request_id: int, **extra: Any) -> dict[str, Any]:
    x = encode_tensor(np.random.default_rng(request_id).standard_normal((1, 8, 8)).astype(np.float32))
    return {"type": "infer", "id": request_id, "model": "digits-m", "tensor": x, **extra}


def matched_ids(shapes: FrameShapes, frames: list[bytes]) -> tuple[int, dict[str, list[int]]]:
    """What match says: how many frames, and the ids by model, decoded from the echoed encodings."""
    count, groups = shapes.match(b"".join(frames), len(frames[0]))
    ids: dict[str, list[int]] = {}
    for shape, rows in groups:
        ids.setdefault(shape.model, []).extend(msgpack.unpackb(row.tobytes()) for row in rows)
    return count, ids


@pytest.mark.parametrize("first_id", [0, 5, 200, 1_000, 70_000, 2**40])
def test_frames_of_one_layout_match_and_their_ids_are_read(first_id: int) -> None:
    """Ids in every msgpack width (fixint, uint8/16/32/64); the tensor and deadline differ per frame."""
    frames = [frame_of(request(first_id + k, deadline_ms=5.0 + k)) for k in range(20)]
    frames = [f for f in frames if len(f) == len(frames[0])]  # the width changed: another length
    shapes = FrameShapes()
    shape = learn(frames[0])
    assert shape is not None and shape.model == "digits-m" and shape.priority is None
    shapes.add(shape)
    count, ids = matched_ids(shapes, frames)
    assert count == len(frames) and list(ids) == ["digits-m"]
    assert ids["digits-m"] == [decode_body(f[HEADER.size :], 1 << 20)["id"] for f in frames]


def test_interleaved_models_and_priorities_are_told_apart() -> None:
    rng = np.random.default_rng(0)
    kinds = [("digits-s", None), ("digits-m", 3), ("digits-l", None), ("digits-m", None)]
    picks = rng.integers(0, len(kinds), 300)
    frames = []
    for k, pick in enumerate(picks):
        model, priority = kinds[pick]
        fields = {**request(70_000 + k), "model": model}
        if priority is not None:
            fields["priority"] = priority
        frames.append(frame_of(fields))
    shapes = FrameShapes()
    for model, priority in kinds:
        fields = {**request(70_000), "model": model} | ({} if priority is None else {"priority": priority})
        shape = learn(frame_of(fields))
        assert shape is not None and (shape.model, shape.priority) == (model, priority)
        shapes.add(shape)
    by_length: dict[int, list[int]] = {}
    for k, f in enumerate(frames):
        by_length.setdefault(len(f), []).append(k)
    for indices in by_length.values():  # the frame with a priority is longer
        run = [frames[k] for k in indices]
        count, groups = shapes.match(b"".join(run), len(run[0]))
        assert count == len(run)
        for shape, rows in groups:
            for row in rows:
                k = msgpack.unpackb(row.tobytes()) - 70_000
                assert kinds[picks[k]] == (shape.model, shape.priority)
        assert sum(len(rows) for _, rows in groups) == len(run)


def test_matching_stops_at_the_first_frame_of_another_layout() -> None:
    frames = [frame_of(request(70_000 + k)) for k in range(10)]
    other = frame_of({**request(70_010), "model": "digits-x"})  # same length, another model
    assert len(other) == len(frames[0])
    shapes = FrameShapes()
    shapes.add(learn(frames[0]))  # type: ignore[arg-type]
    count, ids = matched_ids(shapes, [*frames[:4], other, *frames[4:]])
    assert count == 4 and ids["digits-m"] == [70_000, 70_001, 70_002, 70_003]
    assert shapes.match(b"".join([other, *frames]), len(other)) == (0, [])


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb({"type": "hello", "id": 1}),  # not an infer
        msgpack.packb({"type": "infer", "id": -1, "model": "m"}),  # no usable id
        msgpack.packb({"type": "infer", "id": 1.5, "model": "m"}),
        msgpack.packb({"type": "infer", "model": "m"}),
        # a repeated key: the decoder keeps the last one
        b"\x83\xa4type\xa5infer\xa2id\x01\xa2id\x02",
        # too much structure to learn: a long list, a long string
        msgpack.packb({"type": "infer", "id": 1, "model": "m", "extra": list(range(1000))}),
        msgpack.packb({"type": "infer", "id": 1, "model": "m", "extra": "x" * 10_000}),
    ],
)
def test_frames_it_does_not_describe_teach_nothing(body: bytes) -> None:
    frame = raw_frame(body)
    try:
        message = decode_body(frame[HEADER.size :], 1 << 20)
    except ProtocolError:
        return
    assert FrameShape.learn(frame, message) is None


def test_a_str8_key_and_a_signed_id_are_read_as_the_decoder_reads_them() -> None:
    """Encoders other than msgpack-python's: "id" as str8, a non-negative id as int32."""
    body = b"\x83\xa4type\xa5infer\xd9\x02id\xd2\x00\x01\x00\x00\xa5model\xa1m"
    shape = learn(raw_frame(body))
    assert shape is not None
    shapes = FrameShapes()
    shapes.add(shape)
    negative = body.replace(b"\xd2\x00\x01", b"\xd2\x80\x01")  # int32 < 0: no usable id
    count, groups = shapes.match(raw_frame(body) + raw_frame(negative), len(raw_frame(body)))
    assert count == 1 and msgpack.unpackb(groups[0][1][0].tobytes()) == 65536


def test_a_uint64_id_over_max_id_does_not_match() -> None:
    frames = [frame_of(request(2**62 + k)) for k in range(3)]
    over = frame_of(request(MAX_ID + 1))
    shapes = FrameShapes()
    shapes.add(learn(frames[0]))  # type: ignore[arg-type]
    assert shapes.match(b"".join([*frames[:2], over, frames[2]]), len(over))[0] == 2


def test_a_fixint_id_over_127_is_another_layout() -> None:
    frames = [frame_of(request(k)) for k in (1, 2, 3)]
    shapes = FrameShapes()
    shapes.add(learn(frames[0]))  # type: ignore[arg-type]
    mutated = bytearray(frames[2])
    mutated[mutated.index(b"\xa2id") + 3] = 0xFF  # a negative fixint where the id was
    assert shapes.match(b"".join([*frames[:2], bytes(mutated)]), len(frames[0]))[0] == 2


def test_what_matches_always_decodes_as_the_shape_says() -> None:
    """Soundness under mutation: flip random bytes of real frames; whatever still matches must
    decode (as the server's decoder does) to an infer of the shape's model and priority, with
    the id read from the echoed bytes."""
    rng = np.random.default_rng(7)
    base = [
        frame_of(request(70_000, deadline_ms=8.0)),
        frame_of({**request(300, priority=2), "model": "digits-s"}),
        frame_of({"id": 2**33, "tensor": TENSOR, "capture_ts": 1.7e9, "type": "infer", "model": "x"}),
    ]
    checked = 0
    for frame in base:
        shapes = FrameShapes()
        shapes.add(learn(frame))  # type: ignore[arg-type]
        shape = shapes.match(frame, len(frame))[1][0][0]
        mutants = []
        for _ in range(400):
            mutant = bytearray(frame)
            for at in rng.integers(HEADER.size, len(frame), rng.integers(1, 4)):
                mutant[at] = rng.integers(0, 256)
            mutants.append(bytes(mutant))
        for mutant in mutants:
            count, groups = shapes.match(mutant, len(mutant))
            if not count:
                continue
            message = decode_body(mutant[HEADER.size :], 1 << 20)
            ((matched, rows),) = groups
            assert matched is shape and message["type"] == "infer"
            assert message["model"] == shape.model and message.get("priority") == shape.priority
            assert message["id"] == msgpack.unpackb(rows[0].tobytes()) and 0 <= message["id"] <= MAX_ID
            checked += 1
    assert checked > 300  # most mutations hit payload bytes (the tensor) and still match


def test_the_book_is_bounded() -> None:
    """At most MAX_PER_LENGTH shapes of one length and MAX_LENGTHS lengths: the oldest go."""
    shapes = FrameShapes()
    models = [frame_of({**request(70_000), "model": f"model-{k}"}) for k in range(6)]
    for frame in models:
        shapes.add(learn(frame))  # type: ignore[arg-type]
    assert [shapes.match(f, len(f))[0] for f in models] == [0, 0, 1, 1, 1, 1]
    padded = [frame_of({**request(70_000), "pad": "x" * k}) for k in range(1, 5)]
    for frame in padded:
        shapes.add(learn(frame))  # type: ignore[arg-type]
    assert len(models[0]) not in shapes.lengths and all(len(f) in shapes.lengths for f in padded)


def tagged(shape: FrameShape) -> tuple[bytes, bytes]:
    """A test answer for `refuse`: a frame holding the shape's model and priority, then the id."""
    tag = f"{shape.model}|{shape.priority}".encode()
    return HEADER.pack(2 + len(tag) + shape.id_size) + len(tag).to_bytes(2, "big") + tag, b""


def answered(data: bytes) -> list[tuple[str, int]]:
    """The (model|priority, id) of each answer `refuse` wrote with `tagged`, in order."""
    out, pos = [], 0
    while pos < len(data):
        (length,) = HEADER.unpack_from(data, pos)
        body = data[pos + HEADER.size : pos + HEADER.size + length]
        size = int.from_bytes(body[:2], "big")
        out.append((body[2 : 2 + size].decode(), msgpack.unpackb(body[2 + size :])))
        pos += HEADER.size + length
    return out


@pytest.mark.skipif(frame_shape.compiled_refuse is None, reason="edgeserve.net._shapes is not built")
def test_compiled_refusals_are_numpys_in_the_frames_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled pass (net/_shapes.c) and numpy's refuse the same frames with the same answers,
    on interleaved shapes and mutated frames; the compiled one answers in the frames' order."""
    rng = np.random.default_rng(11)
    kinds = [("digits-s", None), ("digits-m", None), ("digits-m", 3), ("x" * 300, None)]
    checked = 0
    for trial in range(60):
        shapes = FrameShapes()
        for model, priority in kinds:
            fields = {**request(2**20 + trial), "model": model}
            fields |= {} if priority is None else {"priority": priority}
            shapes.add(learn(frame_of(fields)))  # type: ignore[arg-type]
        frames = []
        for k in range(int(rng.integers(1, 80))):
            model, priority = kinds[int(rng.integers(0, 2))]  # two kinds of one length, interleaved
            fields = {**request(2**20 + 1000 * trial + k), "model": model, "priority": priority}
            frame = bytearray(frame_of({key: v for key, v in fields.items() if v is not None}))
            if rng.random() < 0.05:  # a mutated byte anywhere: the block may stop there
                frame[int(rng.integers(0, len(frame)))] = int(rng.integers(0, 256))
            frames.append(bytes(frame))
        length = len(frames[0])
        block = b"".join(f for f in frames if len(f) == length)
        count, answers = shapes.refuse(memoryview(bytearray(block)), length, tagged)
        with monkeypatch.context() as patch:
            patch.setattr(frame_shape, "compiled_refuse", None)
            numpy_count, numpy_answers = shapes.refuse(block, length, tagged)
        assert numpy_count == count and sorted(answered(numpy_answers)) == sorted(answered(answers))
        matched = [block[k * length : (k + 1) * length] for k in range(count)]
        expected = []
        for frame in matched:
            message = decode_body(frame[HEADER.size :], 1 << 20)
            expected.append((f"{message['model']}|{message.get('priority')}", message["id"]))
        assert answered(answers) == expected
        checked += count
    assert checked > 1000


def test_refuse_without_a_shape_of_that_length_refuses_nothing() -> None:
    shapes = FrameShapes()
    frame = frame_of(request(70_000))
    assert shapes.refuse(frame, len(frame), tagged) == (0, b"")
    shapes.add(learn(frame_of({**request(70_000), "pad": "x"})))  # type: ignore[arg-type]
    assert shapes.refuse(frame, len(frame), tagged) == (0, b"")


@pytest.mark.skipif(frame_shape.compiled_refuse is None, reason="edgeserve.net._shapes is not built")
@pytest.mark.parametrize(
    ("shape", "error"),
    [
        ((b"\xff" * 3, b"\x00" * 4, 0, 1, -1, b"", b""), ValueError),  # mask shorter than a frame
        ((b"\xff" * 4, b"\x00" * 4, 3, 2, -1, b"", b""), ValueError),  # the id runs past the frame
        ((b"\xff" * 4, b"\x00" * 4, 0, 1, 4, b"", b""), ValueError),  # the sign byte too
        ((b"\xff" * 4, b"\x00" * 4, 0, 1, -1, "before", b""), TypeError),
        ((b"\xff" * 4, b"\x00" * 4, 0, 1), TypeError),
    ],
)
def test_the_compiled_pass_refuses_a_shape_it_cannot_apply(shape: tuple[Any, ...], error: type) -> None:
    """FrameShapes builds its arguments, but the C function checks them anyway: no read past a frame."""
    assert frame_shape.compiled_refuse is not None
    with pytest.raises(error):
        frame_shape.compiled_refuse(b"\x00" * 8, 4, (shape,))
    assert frame_shape.compiled_refuse(
        b"\x00" * 9, 4, ((b"\xff" * 4, b"\x00" * 4, 0, 1, -1, b"<", b">"),)
    ) == (
        2,
        b"<\x00><\x00>",
    )

"""Seeded structural fuzzing of infer frames against a running server (after an external fuzzer's
findings): values replaced by other types, nesting up to 2000 deep, huge, empty, negative and zero
tensor sizes, extreme floats and ints, strings up to 1 MB, unknown fields.

Checked: every frame whose id is readable is answered exactly once and never `error` (a server
fault), on a connection that stays open; a frame that cannot be read (no readable id, or msgpack
refuses it) gets one `error` message and a close; no answer or error text is over 1 KiB; the
process's memory stays bounded; a well-formed request is still served at the end.
"""

from __future__ import annotations

import math
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from net_support import (
    ServerThread,
    hello_frame,
    net_config,
    raw_connect,
    read_frame,
    server_thread,
    valid_infer,
)
from runtime_support import config_dict, profiled_tiny_repository

from edgeserve.wire.client import BlockingClient
from edgeserve.wire.frames import HEADER, ProtocolError, decode_body, encode_frame, id_of

MAX_FRAME = 2 * 1024 * 1024
SEED = 20240611
CONNECTIONS = 4
ROUNDS = 4
FRAMES_PER_CONNECTION = 200  # per round: 4 * 4 * 200 = 3200 frames
TEXT_LIMIT = 1024  # bytes of any error text the server sends
RSS_GROWTH_LIMIT = 400 * 2**20


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp = tmp_path_factory.mktemp("mutations")
    root = tmp / "engines"
    profiled_tiny_repository(root)
    config = net_config(config_dict(root), tmp, max_frame_bytes=MAX_FRAME, max_in_flight=64)
    with server_thread(config) as srv:
        yield srv


# -- frames built from pre-encoded values (so nesting can go deeper than msgpack's packer) ------------


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _map(items: dict[str, bytes]) -> bytes:
    """A msgpack map of already encoded values."""
    n = len(items)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
    return head + b"".join(_pack(k) + v for k, v in items.items())


def _deep(depth: int, rng: random.Random) -> bytes:
    """`depth` nested arrays or maps (msgpack's own limit is about 1024)."""
    level = b"\x91" if rng.random() < 0.5 else b"\x81\xa1k"
    return level * depth + _pack(rng.choice([None, 1, "x", 5e-324]))


EXTREME_NUMBERS: list[Any] = [
    0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), True, False,
    5e-324, -5e-324, 1e-283, 0.0, -0.0, math.inf, -math.inf, math.nan, 1e308, -1e308, 86_400_001.0,
]  # fmt: skip
EXTREME_SHAPES: list[Any] = [
    [0, 2**31 - 1, 2**31 - 1], [0, 2**31 - 1, 2**31 - 1, 2**31 - 1], [2**31 - 1] * 8, [-1], [-(2**63)],
    [2**32], [2**64 - 1], [0], [], [1] * 9, [0] * 8, [1, 8, 8], [1, 8, -8], [1.0, 8, 8], [None], ["1"],
    [[1]], [True, 8, 8], [1, 0, 8],
]  # fmt: skip


def _string(rng: random.Random) -> str:
    size = int(2 ** rng.uniform(0, 20))  # log-uniform, up to 1 MB
    return rng.choice(["x", "\u00b5", "\U0001f600", "'"]) * size


def _junk(rng: random.Random) -> bytes:
    kind = rng.randrange(9)
    if kind == 0:
        return _pack(rng.choice(EXTREME_NUMBERS))
    if kind == 1:
        return _pack(_string(rng))
    if kind == 2:
        return _pack(b"\0" * int(2 ** rng.uniform(0, 20)))
    if kind == 3:
        return _deep(rng.randint(1, 1000), rng)
    if kind == 4:
        return _pack(rng.choice(EXTREME_SHAPES))
    if kind == 5:
        return _pack({"dtype": "float32", "shape": rng.choice(EXTREME_SHAPES), "data": b""})
    if kind == 6:
        return _pack([rng.choice(EXTREME_NUMBERS) for _ in range(rng.randrange(50))])
    if kind == 7:
        return _pack({_string(rng)[:64]: rng.choice(EXTREME_NUMBERS) for _ in range(rng.randrange(5))})
    return _pack(None)


def _mutated(rng: random.Random, request_id: int, closing: bool) -> bytes:
    """One frame body: a valid request with 1-3 structural mutations. With `closing`, the id is made
    unreadable or the nesting deeper than msgpack reads, so the frame ends the connection."""
    fields = valid_infer(request_id)
    items = {k: _pack(v) for k, v in fields.items()}
    tensor = dict(fields["tensor"])
    for _ in range(rng.randint(1, 3)):
        action = rng.randrange(7)
        key = rng.choice(["type", "model", "tensor", "deadline_ms", "capture_ts", "priority"])
        if action == 0:
            items[key] = _junk(rng)
        elif action == 1:
            items.pop(key, None)
        elif action == 2:
            items[rng.choice(["extra", "x" * rng.randint(1, 300_000), ""])] = _junk(rng)
        elif action == 3:
            tensor["shape"] = rng.choice(EXTREME_SHAPES)
            tensor["data"] = rng.choice([b"", tensor["data"], b"\0" * 7])
            items["tensor"] = _pack(tensor)
        elif action == 4:
            tensor[rng.choice(["dtype", "shape", "data", "extra"])] = rng.choice(EXTREME_NUMBERS)
            items["tensor"] = _pack(tensor)
        elif action == 5:
            timing = rng.choice(["deadline_ms", "capture_ts", "priority"])
            offset = rng.choice([-1e6, -2.0, 0.0, 60.0, 1e6])
            value = rng.choice([*EXTREME_NUMBERS, time.time() + offset])
            items[timing] = _pack(value)
        else:
            items[key] = _deep(rng.randint(1, 1000), rng)
    if closing:
        if rng.random() < 0.5:
            items["id"] = rng.choice([_junk(rng), _deep(rng.randint(1, 2000), rng), _pack(-1)])
        else:
            items[rng.choice(["model", "tensor", "extra"])] = _deep(rng.randint(1100, 2000), rng)
    return _map(items)


def _readable_id(body: bytes) -> int | None:
    """The id the server will read from this body, or None when it cannot (what the server does)."""
    try:
        return id_of(decode_body(body, MAX_FRAME))
    except ProtocolError:
        return None


# -- the run ------------------------------------------------------------------------------------------


class _Peer:
    """One raw connection: frames sent from the calling thread, answers read by a thread."""

    def __init__(self, srv: ServerThread) -> None:
        self.sock = raw_connect(srv.unix_url, timeout=60)
        self.sock.sendall(hello_frame())
        assert read_frame(self.sock)["type"] == "hello"
        self.messages: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while (message := read_frame(self.sock)) is not None:
            with self.arrived:
                self.messages.append(message)
                self.arrived.notify_all()

    def wait_for(self, count: int, timeout: float) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.messages) >= count, timeout), (
                len(self.messages),
                count,
            )

    def finish(self, tail: bytes | None) -> list[dict[str, Any]]:
        try:
            if tail is not None:
                self.sock.sendall(HEADER.pack(len(tail)) + tail)
            self.sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.reader.join(60)
        assert not self.reader.is_alive(), "the server did not close the connection"
        self.sock.close()
        return self.messages


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _check_texts(message: dict[str, Any]) -> None:
    text = message.get("error")
    assert text is None or len(text.encode()) <= TEXT_LIMIT, (len(text.encode()), text[:200])


def _one_round(srv: ServerThread, rng: random.Random, next_id: int) -> tuple[int, int]:
    peers = [_Peer(srv) for _ in range(CONNECTIONS)]
    expected: list[list[int]] = []
    tails: list[bytes | None] = []
    for peer in peers:
        ids = []
        for _ in range(FRAMES_PER_CONNECTION):
            body = _mutated(rng, next_id, closing=False)
            next_id += 1
            request_id = _readable_id(body)
            if request_id is None:
                continue  # an unreadable frame mid-stream would close the connection: not here
            assert request_id == next_id - 1
            ids.append(request_id)
            peer.sock.sendall(HEADER.pack(len(body)) + body)
        expected.append(ids)
        tail = _mutated(rng, next_id, closing=True) if rng.random() < 0.5 else None
        assert tail is None or _readable_id(tail) is None
        tails.append(tail)
    answered = 0
    for peer, ids, tail in zip(peers, expected, tails, strict=True):
        peer.wait_for(len(ids), timeout=60)  # all in-flight answers first: a closing frame discards them
        messages = peer.finish(tail)
        results = [m for m in messages if m["type"] == "result"]
        got = sorted(m["id"] for m in results)
        assert got == sorted(ids), "every readable id is answered exactly once"
        statuses = {m["status"] for m in results}
        assert statuses <= {"ok", "invalid", "rejected", "expired"}, [
            m for m in results if m["status"] == "error"
        ][:3]
        for message in messages:
            _check_texts(message)
        if tail is None:
            assert len(messages) == len(results)
        else:
            assert [m["type"] for m in messages[len(results) :]] == ["error"]
        answered += len(results)
    return next_id, answered


def test_structurally_mutated_frames_are_each_answered_once_with_short_texts(
    fuzz_server: ServerThread,
) -> None:
    srv = fuzz_server
    rng = random.Random(SEED)
    rss_before = _rss()
    next_id, answered, started = 1, 0, time.monotonic()
    for _ in range(ROUNDS):
        next_id, count = _one_round(srv, rng, next_id)
        answered += count
        assert _rss() - rss_before < RSS_GROWTH_LIMIT
    assert answered > ROUNDS * CONNECTIONS * FRAMES_PER_CONNECTION // 2
    assert time.monotonic() - started < 120
    with BlockingClient(srv.tcp_url) as client:
        assert client.infer("tiny_a", np.zeros((1, 8, 8), np.float32), timeout=30).ok


# -- targeted cases over a socket ---------------------------------------------------------------------


def _exchange(srv: ServerThread, bodies: list[bytes]) -> list[dict[str, Any]]:
    with raw_connect(srv.unix_url, timeout=30) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        sock.sendall(b"".join(HEADER.pack(len(b)) + b for b in bodies))
        sock.shutdown(socket.SHUT_WR)
        messages = []
        while (message := read_frame(sock)) is not None:
            messages.append(message)
    return messages


@pytest.mark.parametrize(
    "fields",
    [
        {"deadline_ms": 5e-324},
        {"deadline_ms": -5e-324},
        {"deadline_ms": 0.0},
        {"deadline_ms": math.inf},
        {"deadline_ms": math.nan},
        {"deadline_ms": 2**64 - 1},
        {"deadline_ms": 1e308},
        {"deadline_ms": -1},
        {"deadline_ms": 0.0009},
        {"deadline_ms": 86_400_001},
        {"capture_ts": 5e-324},
        {"capture_ts": -1.0},
        {"capture_ts": math.inf},
        {"capture_ts": math.nan},
        {"capture_ts": 2**64 - 1},
        {"capture_ts": "far future"},
        {"priority": 2**64 - 1},
        {"priority": math.nan},
    ],
    ids=lambda f: f"{next(iter(f))}={next(iter(f.values()))!r}",
)
def test_extreme_deadlines_capture_times_and_priorities_are_invalid_over_a_socket(
    fuzz_server: ServerThread, fields: dict[str, Any]
) -> None:
    del_deadline = "capture_ts" in fields
    message = {**valid_infer(41), **fields}
    if del_deadline:
        del message["deadline_ms"]
    answers = _exchange(
        fuzz_server, [encode_frame(message)[HEADER.size :], encode_frame(valid_infer(42))[HEADER.size :]]
    )
    by_id = {m["id"]: m for m in answers}
    assert [m["type"] for m in answers] == ["result", "result"]
    assert by_id[41]["status"] == "invalid", by_id[41]
    assert by_id[42]["status"] == "ok"  # the connection stayed open and served the next request


def test_capture_times_far_from_the_clock_are_invalid_and_recent_old_ones_expired(
    fuzz_server: ServerThread,
) -> None:
    now = time.time()
    bodies = []
    for request_id, capture_ts in [(1, now - 2 * 86400), (2, now + 2 * 86400), (3, now - 3600), (4, now)]:
        message = {**valid_infer(request_id), "capture_ts": capture_ts}
        del message["deadline_ms"]
        bodies.append(encode_frame(message)[HEADER.size :])
    by_id = {m["id"]: m for m in _exchange(fuzz_server, bodies)}
    assert (
        by_id[1]["status"] == "invalid"
        and "in the past" in by_id[1]["error"]
        and "clock" in by_id[1]["error"]
    )
    assert by_id[2]["status"] == "invalid" and "in the future" in by_id[2]["error"]
    assert by_id[3]["status"] == "expired"
    assert by_id[4]["status"] == "ok"


def test_the_fuzzer_findings_are_answered_and_the_connection_stays_open(fuzz_server: ServerThread) -> None:
    """[0, 2**31-1, 2**31-1] with no data; a 1000-deep model; an 8 MB-class bad shape; a second hello."""
    rng = random.Random(1)
    first = {
        **valid_infer(1),
        "tensor": {"dtype": "float32", "shape": [0, 2**31 - 1, 2**31 - 1], "data": b""},
    }
    deep = {k: _pack(v) for k, v in valid_infer(2).items()}
    deep["model"] = b"\x91" * 1000 + _pack("x")
    big = {
        **valid_infer(3),
        "tensor": {"dtype": "uint8", "shape": [7, -1], "data": b"\xff" * (MAX_FRAME - 1000)},
    }
    long_model = {**valid_infer(4), "model": "m" * (MAX_FRAME - 1000)}
    hello_again = {"type": "hello", "version": 1, "id": 5}
    bodies = [
        encode_frame(first)[HEADER.size :],
        _map(deep),
        encode_frame(big)[HEADER.size :],
        encode_frame(long_model)[HEADER.size :],
        encode_frame(hello_again)[HEADER.size :],
        _mutated(rng, 6, closing=False),
        encode_frame(valid_infer(7))[HEADER.size :],
    ]
    answers = _exchange(fuzz_server, bodies)
    by_id = {m["id"]: m for m in answers}
    assert sorted(by_id) == [1, 2, 3, 4, 5, 6, 7] and len(answers) == 7
    assert all(by_id[i]["status"] == "invalid" for i in (1, 2, 3, 4, 5)), answers
    assert by_id[7]["status"] == "ok"
    for message in answers:
        _check_texts(message)
    assert "tensor.shape" in by_id[1]["error"]
    assert "(cut, " in by_id[4]["error"] or len(by_id[4]["error"]) < 300

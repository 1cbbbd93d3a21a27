"""Hypothesis fuzzing of the frame decoder and request validation through real connections.

Whatever a peer sends, no exception escapes the frontend, the peer gets well-formed answers
(or an error message) and/or a closed connection, and a well-behaved client on the same server
keeps being answered.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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

from edgeserve.net.frontend import Connection, Frontend
from edgeserve.wire.client import BlockingClient
from edgeserve.wire.frames import HEADER, decode_body, encode_frame

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MAX_FRAME = 4096


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, BlockingClient]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    root = tmp / "engines"
    profiled_tiny_repository(root)
    config = net_config(config_dict(root), tmp, max_frame_bytes=MAX_FRAME, max_in_flight=8)
    with server_thread(config) as srv, BlockingClient(srv.tcp_url) as witness:
        yield srv, witness


def _exchange(srv: ServerThread, payload: bytes, greet: bool) -> list[dict[str, Any]]:
    """Send (hello and) payload, half-close, and read every answer until the server closes."""
    with raw_connect(srv.unix_url, timeout=20) as sock:
        if greet:
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server already closed on an early part of the payload
        messages = []
        while (message := read_frame(sock)) is not None:
            messages.append(message)
    return messages


def _check(srv: ServerThread, witness: BlockingClient, messages: list[dict[str, Any]]) -> None:
    for message in messages:
        assert message["type"] in ("result", "error", "hello"), message
        if message["type"] == "result":
            assert message["status"] in ("ok", "invalid", "rejected", "expired"), message
    x = np.zeros((1, 8, 8), dtype=np.float32)
    assert witness.infer("tiny_a", x, timeout=30).ok


@FUZZ
@given(payload=st.binary(max_size=600))
def test_random_bytes_before_hello_never_break_the_server(fuzz_server, payload: bytes) -> None:
    srv, witness = fuzz_server
    _check(srv, witness, _exchange(srv, payload, greet=False))


@FUZZ
@given(payload=st.binary(max_size=600))
def test_random_bytes_after_hello_never_break_the_server(fuzz_server, payload: bytes) -> None:
    srv, witness = fuzz_server
    _check(srv, witness, _exchange(srv, HEADER.pack(len(payload)) + payload, greet=True))


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid infer frame with a field replaced, removed or added, or its bytes flipped."""
    message: dict[str, Any] = valid_infer(draw(st.integers(0, 2**64)))
    junk = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.floats(allow_nan=True),
        st.text(max_size=20),
        st.binary(max_size=40),
        st.lists(st.integers(-5, 2**40), max_size=10),
        st.dictionaries(st.text(max_size=8), st.integers(), max_size=4),
    )
    keys = ["type", "id", "model", "tensor", "deadline_ms", "capture_ts", "priority", "extra"]
    tensor_keys = ["dtype", "shape", "data", "extra"]
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "drop", "tensor"]))
        key = draw(st.sampled_from(keys))
        if action == "set":
            message[key] = draw(junk)
        elif action == "drop":
            message.pop(key, None)
        elif isinstance(message.get("tensor"), dict):
            message["tensor"] = {**message["tensor"], draw(st.sampled_from(tensor_keys)): draw(junk)}
    try:
        body = msgpack.packb(message, use_bin_type=True)
    except (OverflowError, ValueError):
        body = msgpack.packb(valid_infer(), use_bin_type=True)
    flips = draw(st.lists(st.tuples(st.integers(0, len(body) - 1), st.integers(0, 255)), max_size=3))
    data = bytearray(body)
    for where, value in flips:
        data[where] = value
    return HEADER.pack(len(data)) + bytes(data)


@FUZZ
@given(frames=st.lists(mutated_frames(), min_size=1, max_size=4))
def test_mutated_requests_are_answered_or_refused_never_crash(fuzz_server, frames: list[bytes]) -> None:
    srv, witness = fuzz_server
    messages = _exchange(srv, b"".join(frames), greet=True)
    _check(srv, witness, messages)
    assert len(messages) <= len(frames)


class _RecordingTransport(asyncio.Transport):
    """Collects what the Connection writes; no socket, so thousands of frames run in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


@settings(max_examples=1500, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8), greet=st.booleans())
def test_decoder_survives_arbitrary_chunking_of_arbitrary_bytes(chunks: list[bytes], greet: bool) -> None:
    """data_received directly (no server needed before a valid request): never raises, and what it
    writes is a sequence of well-formed frames."""

    from edgeserve.config.server import ListenConfig, ServerConfig

    class _NoServer:
        models: tuple[str, ...] = ()
        config = ServerConfig(models={})  # a greeted request is checked against its (no) models

        def run_completed(self) -> None:  # no batches: nothing ever completes
            pass

        def answers_together(self, hold: object, release: object) -> None:
            pass

    async def feed() -> bytes:  # on a loop: answers leave at the end of each loop turn
        frontend = Frontend(_NoServer(), ListenConfig(max_frame_bytes=256))  # type: ignore[arg-type]
        connection = Connection(frontend)
        transport = _RecordingTransport()
        connection.connection_made(transport)
        if greet:
            connection.data_received(hello_frame())
        for chunk in chunks:
            if transport.closed:
                break
            connection.data_received(chunk)
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        return bytes(transport.written)

    out = asyncio.run(feed())
    while out:
        (length,) = HEADER.unpack_from(out)
        decode_body(out[HEADER.size : HEADER.size + length], 1 << 20)
        out = out[HEADER.size + length :]


def test_after_garbage_the_server_still_serves_a_pipelined_batch(fuzz_server) -> None:
    srv, witness = fuzz_server
    errors_before = srv.stats().protocol_errors
    assert [m["type"] for m in _exchange(srv, HEADER.pack(3) + b"\xc1\xc1\xc1", greet=True)] == ["error"]
    xs = np.random.default_rng(1).standard_normal((8, 1, 8, 8)).astype(np.float32)
    replies = [f.result(30) for f in [witness.submit("tiny_a", x) for x in xs]]
    assert all(r.ok for r in replies)
    assert srv.stats().protocol_errors == errors_before + 1


def test_requests_in_flight_are_answered_before_the_error_of_an_unreadable_frame(fuzz_server) -> None:
    srv, _ = fuzz_server
    stream = b"".join(encode_frame(valid_infer(i)) for i in (7, 8)) + HEADER.pack(3) + b"\xc1\xc1\xc1"
    messages = _exchange(srv, stream, greet=True)
    assert len(messages) == 3 and messages[-1]["type"] == "error"
    assert sorted((m["type"], m["id"], m["status"]) for m in messages[:2]) == [
        ("result", 7, "ok"),
        ("result", 8, "ok"),
    ]


def test_a_valid_frame_on_a_raw_connection_is_answered_before_the_close(fuzz_server) -> None:
    srv, _ = fuzz_server
    messages = _exchange(srv, encode_frame(valid_infer(5)), greet=True)
    assert [(m["type"], m["id"], m["status"]) for m in messages] == [("result", 5, "ok")]

"""The socket client against a server whose answers are malformed: each waiting call gets a
ConnectionError that says the answer was unreadable, never a hang or an exception escaping the
protocol's callback."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from edgeserve.loop import run
from edgeserve.wire.client import AsyncClient
from edgeserve.wire.frames import HEADER, encode_frame

OK = {"status": "ok", "model": "m"}
BAD_ANSWERS: list[Any] = [
    OK | {"exit": "deep"},  # exit not a map
    OK | {"outputs": [1, 2]},  # outputs not a map
    OK | {"outputs": {"logits": "not a tensor"}},
    {"model": "m"},  # no status
    [1, 2, 3],  # not a map at all
]


@pytest.mark.parametrize("answer", BAD_ANSWERS, ids=["exit", "outputs", "tensor", "status", "list"])
def test_a_malformed_answer_fails_the_waiting_call_with_a_clear_error(tmp_path: Path, answer: Any) -> None:
    path = tmp_path / "s.sock"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readexactly(HEADER.size)
                message = msgpack.unpackb(await reader.readexactly(HEADER.unpack(head)[0]))
                if message["type"] == "hello":
                    writer.write(encode_frame({"type": "hello", "version": 1, "models": {}}))
                elif isinstance(answer, dict):  # the request's own id, so the client takes it up
                    writer.write(encode_frame({"id": message["id"]} | answer))
                else:
                    body = msgpack.packb(answer)
                    writer.write(HEADER.pack(len(body)) + body)
                await writer.drain()
        writer.close()

    async def main() -> BaseException | None:
        server = await asyncio.start_unix_server(serve, str(path))
        try:
            client = await AsyncClient.connect(f"unix://{path}")
            try:
                await asyncio.wait_for(client.infer("m", np.zeros(3, np.float32)), 5)
            except ConnectionError as exc:
                return exc
            finally:
                await client.close()
            return None
        finally:
            server.close()

    error = run(main())
    assert isinstance(error, ConnectionError)
    assert "unreadable answer from the server" in str(error)

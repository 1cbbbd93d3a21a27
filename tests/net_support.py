"""Helpers for the network tests: a NetServer on its own loop thread and raw-socket frame I/O."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from edgeserve.loop import new_event_loop
from edgeserve.net.settings import FrontSettings
from edgeserve.runtime.server import BackendFactory
from edgeserve.service.process import NetServer
from edgeserve.wire.frames import HEADER, PROTOCOL_VERSION, decode_body, encode_frame
from edgeserve.wire.tensors import encode_tensor


def net_config(base: dict[str, Any], tmp: Path, **listen: Any) -> dict[str, Any]:
    """`base` (runtime_support.config_dict) plus a UNIX socket in `tmp` and a TCP port chosen by the OS."""
    return {**base, "listen": {"unix": str(tmp / "edgeserve.sock"), "tcp": "127.0.0.1:0", **listen}}


class ServerThread:
    """A started NetServer whose loop runs in a background thread; `call` runs code on that loop."""

    def __init__(self, net: NetServer, loop: asyncio.AbstractEventLoop) -> None:
        self.net = net
        self.loop = loop

    @property
    def unix_url(self) -> str:
        return next(u for u in self.net.urls if u.startswith("unix://"))

    @property
    def tcp_url(self) -> str:
        return next(u for u in self.net.urls if u.startswith("tcp://"))

    @property
    def tcp_address(self) -> tuple[str, int]:
        host, port = self.tcp_url.removeprefix("tcp://").rsplit(":", 1)
        return host, int(port)

    def stats(self) -> Any:
        async def read() -> Any:
            from dataclasses import replace

            return replace(self.net.frontend.stats)

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)


@contextmanager
def server_thread(
    config: dict[str, Any],
    backend_factory: BackendFactory | None = None,
    settings: FrontSettings | None = None,
) -> Iterator[ServerThread]:
    """`settings`: the socket front's tuning (an in-process front: not with [listen] front_process)."""
    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    net = NetServer(config, backend_factory=backend_factory, front_settings=settings)
    try:
        asyncio.run_coroutine_threadsafe(net.start(), loop).result(60)
        yield ServerThread(net, loop)
    finally:
        asyncio.run_coroutine_threadsafe(net.close(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def raw_connect(url: str, timeout: float = 10.0) -> socket.socket:
    if url.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(url.removeprefix("unix://"))
    else:
        host, port = url.removeprefix("tcp://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    return sock


def hello_frame(token: str | None = None) -> bytes:
    message: dict[str, Any] = {"type": "hello", "version": PROTOCOL_VERSION}
    if token is not None:
        message["token"] = token
    return encode_frame(message)


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None at end of stream."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    body = _read_exactly(sock, length)
    assert body is not None, "stream ended inside a frame"
    return decode_body(body, 1 << 30)


def read_until_closed(sock: socket.socket) -> list[dict[str, Any]]:
    """Every message until the server closes the connection (asserts it does, within the timeout)."""
    messages = []
    while (message := read_frame(sock)) is not None:
        messages.append(message)
    return messages


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        try:
            chunk = sock.recv(n - len(chunks))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            assert not chunks, "stream ended inside a frame"
            return None
        chunks += chunk
    return bytes(chunks)


def valid_infer(request_id: int = 1) -> dict[str, Any]:
    """A well-formed infer message for the tiny repository's `tiny_a` (a fuzzer's starting point)."""
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 8, 8)
    tensor = encode_tensor(x)
    return {"type": "infer", "id": request_id, "model": "tiny_a", "tensor": tensor, "deadline_ms": 500}

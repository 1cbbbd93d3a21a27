"""SIGTERM while several clients keep the server busy: every request sent is answered exactly once."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import msgpack
import pytest
from runtime_support import profiled_tiny_repository
from service_support import serve_process, write_serve_config

from edgeserve.wire.client import AsyncClient, Reply
from edgeserve.wire.frames import HEADER, encode_frame
from edgeserve.wire.tensors import encode_tensor

CONNECTIONS = 4
IN_FLIGHT = 24  # per connection, so a queue is standing when SIGTERM lands
SHUTDOWN_TIMEOUT_S = 1.0


# The socket front on the server's loop (the default) and in a process of its own.
FRONTS = pytest.mark.parametrize("front_process", ["false", "true"], ids=["loop", "process"])


@FRONTS
def test_sigterm_under_load_answers_every_request_and_exits_zero(tmp_path: Path, front_process: str) -> None:
    repository = tmp_path / "engines"
    models = profiled_tiny_repository(repository)
    config = tmp_path / "serve.toml"
    extra = f"front_process = {front_process}\n"
    write_serve_config(config, repository, tmp_path / "serve.sock", slo_ms=60000, extra=extra)
    xs = models["tiny_a"].random_input(8, seed=3)

    async def load(url: str, pid: int) -> list[Reply | BaseException]:
        stop = asyncio.Event()
        sent: list[asyncio.Future[Reply]] = []

        async def connection(client: AsyncClient) -> None:
            window = asyncio.Semaphore(IN_FLIGHT)
            i = 0
            while not stop.is_set():
                await window.acquire()
                if stop.is_set():
                    break
                future = client.send("tiny_a", xs[i % len(xs)])
                future.add_done_callback(lambda _: window.release())
                sent.append(future)
                i += 1
                await asyncio.sleep(0)

        clients = [await AsyncClient.connect(url) for _ in range(CONNECTIONS)]
        senders = [asyncio.ensure_future(connection(c)) for c in clients]
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGTERM)
        stop.set()  # what was sent before the signal must all be answered
        await asyncio.gather(*senders)
        replies = await asyncio.gather(*sent, return_exceptions=True)
        for client in clients:
            await client.close()
        return replies

    with serve_process(config) as server:
        urls = server.wait_ready()
        replies = asyncio.run(load(urls[1], server.process.pid))
        code, err = server.finish()

    assert code == 0, err
    errors = [r for r in replies if isinstance(r, BaseException)]
    assert not errors, (len(errors), len(replies), errors[:3], err[-3000:])
    statuses = collections.Counter(r.status for r in replies if isinstance(r, Reply))
    assert set(statuses) <= {"ok", "shutdown"} and statuses["ok"] > 100, statuses
    # The log says how many were in flight when the signal landed (often none now: answers are
    # quick; the flood test below shows a signal landing on a server past its capacity).
    assert re.search(r"in_flight=(\d+)", err) is not None, err
    stopped = re.search(r"event=stopped connections=(\d+) requests=(\d+) discarded=(\d+)", err)
    assert stopped is not None, err
    # The server saw exactly the requests sent and dropped no answer.
    assert int(stopped.group(2)) == len(replies) and int(stopped.group(3)) == 0


@FRONTS
def test_sigterm_under_a_flood_stops_reading_answers_what_was_read_and_exits_in_time(
    tmp_path: Path, front_process: str
) -> None:
    """Clients that ignore the window and keep writing after the signal (several times what the
    server can take): the server stops reading, answers each request it read exactly once, and
    exits 0 within shutdown_timeout_s + 1 s."""
    repository = tmp_path / "engines"
    models = profiled_tiny_repository(repository)
    sock = tmp_path / "serve.sock"
    config = tmp_path / "serve.toml"
    config.write_text(
        f"repository = {json.dumps(str(repository))}\nshutdown_timeout_s = {SHUTDOWN_TIMEOUT_S}\n"
        '[backend]\nname = "onnxruntime"\nthreads = 1\nwarmup = 0\n'
        "[models.tiny_a]\nslo_ms = 50\n"
        f'[listen]\nunix = {json.dumps(str(sock))}\nunix_mode = "0600"\nfront_process = {front_process}\n'
    )
    x = models["tiny_a"].random_input(1, seed=3)[0]
    head = encode_frame({"type": "infer", "model": "tiny_a", "tensor": encode_tensor(x), "id": 0})
    body = head[HEADER.size :]  # re-encoded per id below: ids of any size
    template = msgpack.unpackb(body)

    class Flood:
        def __init__(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(sock))
            self.sock.sendall(encode_frame({"type": "hello", "version": 1}))
            self.sent = 0
            self.answers: list[dict[str, object]] = []
            self.reader = threading.Thread(target=self.read, daemon=True)
            self.writer = threading.Thread(target=self.write, daemon=True)

        def write(self) -> None:
            with contextlib.suppress(OSError):
                while True:
                    ids = range(self.sent, self.sent + 64)
                    self.sock.sendall(b"".join(encode_frame(template | {"id": i}) for i in ids))
                    self.sent += 64

        def read(self) -> None:
            """Every answer until the server closes (the buffer trimmed once per read: a slice per
            frame made this quadratic, too slow for 200k refusals on 2 busy cores)."""
            buffer = bytearray()
            with contextlib.suppress(OSError):
                while chunk := self.sock.recv(1 << 16):
                    buffer += chunk
                    pos = 0
                    while len(buffer) - pos >= 4 and len(buffer) - pos >= 4 + (
                        size := HEADER.unpack_from(buffer, pos)[0]
                    ):
                        self.answers.append(msgpack.unpackb(buffer[pos + 4 : pos + 4 + size]))
                        pos += 4 + size
                    del buffer[:pos]

    with serve_process(config) as server:
        server.wait_ready()
        floods = [Flood() for _ in range(2)]
        for flood in floods:
            flood.reader.start()
            flood.writer.start()
        time.sleep(1.5)
        signalled = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        code, err = server.finish()
        exited = time.monotonic() - signalled
        for flood in floods:
            flood.reader.join(30)
            assert not flood.reader.is_alive(), "the server's answers were not all read within 30 s"
            flood.sock.close()
            flood.writer.join(10)

    assert code == 0, err
    assert exited <= SHUTDOWN_TIMEOUT_S + 1.0, f"exited {exited:.2f} s after SIGTERM; {err[-2000:]}"
    results = [a for f in floods for a in f.answers if a.get("type") == "result"]
    for flood in floods:
        ids = [a["id"] for a in flood.answers if a.get("type") == "result"]
        assert len(ids) == len(set(ids)), "an id was answered twice"
        assert set(ids) <= set(range(flood.sent)), "an answer for an id never sent"
    statuses = collections.Counter(str(a["status"]) for a in results)
    assert statuses["ok"] > 0 and statuses["rejected"] > 0, statuses  # served, and over the window
    assert set(statuses) <= {"ok", "rejected", "shutdown", "expired"}, statuses
    stopped = re.search(r"event=stopped connections=(\d+) requests=(\d+) discarded=(\d+)", err)
    assert stopped is not None, err
    # Every request the server read got its answer to the client: none lost, none discarded.
    assert int(stopped.group(2)) == len(results) and int(stopped.group(3)) == 0, (stopped.group(0), statuses)


def test_answers_a_peer_did_not_read_by_the_exit_are_counted_in_the_log(tmp_path: Path) -> None:
    """A client that floods and never reads: the server stops reading it once its answers back up,
    exits in time on SIGTERM, and says how many bytes of answers it could not deliver."""
    repository = tmp_path / "engines"
    models = profiled_tiny_repository(repository)
    sock_path = tmp_path / "serve.sock"
    config = tmp_path / "serve.toml"
    write_serve_config(config, repository, sock_path, slo_ms=50, extra="")
    x = models["tiny_a"].random_input(1, seed=3)[0]
    template = {"type": "infer", "model": "tiny_a", "tensor": encode_tensor(x)}
    with serve_process(config) as server:
        server.wait_ready()
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect(str(sock_path))
        peer.sendall(encode_frame({"type": "hello", "version": 1}))
        peer.settimeout(1.0)
        sent = 0
        with contextlib.suppress(TimeoutError):  # until the server stops reading this peer
            while sent < 2_000_000:
                peer.sendall(b"".join(encode_frame(template | {"id": sent + i}) for i in range(256)))
                sent += 256
        os.kill(server.process.pid, signal.SIGTERM)
        code, err = server.finish()
        peer.close()
    assert code == 0, err
    unsent = re.search(r"1 connection\(s\) had not taken their answers .* (\d+) bytes of answers unsent", err)
    assert unsent is not None and int(unsent.group(1)) > 0, err[-2000:]

"""SIGTERM while several clients keep the server busy: every request sent is answered exactly once."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
from pathlib import Path

from runtime_support import profiled_tiny_repository
from service_support import serve_process, write_serve_config

from edgeserve.wire.client import AsyncClient, Reply

CONNECTIONS = 4
IN_FLIGHT = 24  # per connection, so a queue is standing when SIGTERM lands


def test_sigterm_under_load_answers_every_request_and_exits_zero(tmp_path: Path) -> None:
    repository = tmp_path / "engines"
    models = profiled_tiny_repository(repository)
    config = tmp_path / "serve.toml"
    write_serve_config(config, repository, tmp_path / "serve.sock", slo_ms=60000)
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
    assert not errors, errors[:3]
    statuses = collections.Counter(r.status for r in replies if isinstance(r, Reply))
    assert set(statuses) <= {"ok", "shutdown"} and statuses["ok"] > 100, statuses
    in_flight = re.search(r"in_flight=(\d+)", err)
    assert in_flight is not None and int(in_flight.group(1)) > 0, err  # SIGTERM landed under load
    stopped = re.search(r"event=stopped connections=(\d+) requests=(\d+) discarded=(\d+)", err)
    assert stopped is not None, err
    # The server saw exactly the requests sent and dropped no answer.
    assert int(stopped.group(2)) == len(replies) and int(stopped.group(3)) == 0

"""The delaying TCP proxy: bytes arrive intact and in order, each direction `delay` later."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

from edgeserve.tools.delay_proxy import DelayProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    data = await reader.readexactly(len(payload))
    elapsed = time.perf_counter() - start
    writer.close()
    return data, elapsed


def test_round_trips_gain_twice_the_delay_and_bytes_are_unchanged() -> None:
    async def main() -> None:
        echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
        port = echo.sockets[0].getsockname()[1]
        proxy = await DelayProxy(("127.0.0.1", 0), ("127.0.0.1", port), delay_s=0.020).start()
        payload = os.urandom(200_000)
        data, elapsed = await _round_trip(proxy.port, payload)
        assert data == payload
        assert 0.040 <= elapsed < 0.2
        _, direct = await _round_trip(port, b"x")
        assert direct < 0.02
        await proxy.close()
        echo.close()

    asyncio.run(main())


def test_a_bandwidth_cap_paces_large_transfers() -> None:
    async def main() -> None:
        echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
        port = echo.sockets[0].getsockname()[1]
        proxy = await DelayProxy(("127.0.0.1", 0), ("127.0.0.1", port), bandwidth_bps=2e6).start()
        _, elapsed = await _round_trip(proxy.port, b"y" * 200_000)  # 0.1 s at 2 MB/s (the echo streams)
        assert 0.095 <= elapsed < 0.5
        _, small = await _round_trip(proxy.port, b"y" * 2_000)
        assert small < 0.05
        await proxy.close()
        echo.close()

    asyncio.run(main())


def test_the_command_forwards_and_stops_on_sigterm() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        target = listener.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "edgeserve.tools.delay_proxy",
            "--listen",
            f"127.0.0.1:{free}",
            "--to",
            f"127.0.0.1:{target}",
            "--delay-ms",
            "5",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            assert "delay proxy" in (proc.stdout.readline() if proc.stdout else "")
            with socket.create_connection(("127.0.0.1", free), timeout=5) as client:
                server, _ = listener.accept()
                client.sendall(b"hello")
                server.settimeout(5)
                assert server.recv(5) == b"hello"
                server.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0

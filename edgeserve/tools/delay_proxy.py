"""A TCP proxy that adds one-way delay (and optionally caps bandwidth) in each direction.

For tests and benchmarks of offload on one machine: put it between the edge server and its
upstream to make loopback look like a LAN or WAN link, without root (netem needs a network
namespace). Bytes keep their order; each chunk is released `delay_ms` after it was read, and
with `bandwidth_mbps` no faster than the cap (a token-free pacing: the next chunk starts when the
previous one would have finished on the capped link).

    python -m edgeserve.tools.delay_proxy --listen 127.0.0.1:9000 --to 127.0.0.1:8000 --delay-ms 5

In process: `proxy = await DelayProxy(("127.0.0.1", 0), ("127.0.0.1", 8000), delay_s=0.005).start()`,
`proxy.port`, `await proxy.close()`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass

CHUNK = 65536


@dataclass
class DelayProxy:
    """Listen on `listen` (port 0: any free port) and forward every connection to `target`."""

    listen: tuple[str, int]
    target: tuple[str, int]
    delay_s: float = 0.0
    bandwidth_bps: float | None = None  # bytes per second, per direction and connection
    connections: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] | None = None

    async def start(self) -> DelayProxy:
        self._tasks = set()
        self._server = await asyncio.start_server(self._accept, self.listen[0], self.listen[1])
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.port}"

    async def close(self) -> None:
        """Stop listening and cut every open connection."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for task in list(self._tasks or ()):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self._tasks is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a side hung up, or close() cut the connection
        finally:
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction: a reader stamps chunks, a writer releases each at stamp + delay."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            free_at = 0.0  # when the capped link finishes the previous chunk
            while True:
                stamp, data = await queue.get()
                due = stamp + self.delay_s
                if self.bandwidth_bps:
                    due = max(due, free_at) + len(data) / self.bandwidth_bps
                    free_at = due
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        releaser = asyncio.ensure_future(release())
        try:
            while True:
                data = await reader.read(CHUNK)
                queue.put_nowait((time.monotonic(), data))
                if not data:
                    break
            await releaser
        finally:
            releaser.cancel()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgeserve.tools.delay_proxy",
        description="Forward TCP connections, adding a one-way delay (and optionally a bandwidth cap) in "
        "each direction. Use it to put an upstream 'far away' on one machine.",
        epilog="example: python -m edgeserve.tools.delay_proxy --listen 127.0.0.1:9000 --to 127.0.0.1:8000 "
        "--delay-ms 5   (10 ms added to every round trip; stop it with Ctrl-C or SIGTERM)",
    )
    parser.add_argument("--listen", type=_address, required=True, help="host:port to accept on")
    parser.add_argument("--to", type=_address, required=True, help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per direction (ms)")
    parser.add_argument("--bandwidth-mbps", type=float, default=None, help="cap per direction (Mbit/s)")
    args = parser.parse_args(argv)

    async def serve() -> None:
        bandwidth = None if args.bandwidth_mbps is None else args.bandwidth_mbps * 1e6 / 8.0
        proxy = await DelayProxy(args.listen, args.to, args.delay_ms / 1000.0, bandwidth).start()
        print(
            f"delay proxy {proxy.address} -> {args.to[0]}:{args.to[1]}, +{args.delay_ms} ms each way",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await proxy.close()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

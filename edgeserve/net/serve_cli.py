"""`edgeserve serve --config FILE`: run the server on its UNIX and/or TCP listeners until signalled."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

READY_PREFIX = "edgeserve: ready, listening on"

EPILOG = """\
examples:
  edgeserve serve --config serve.toml
  edgeserve serve --config serve.toml --log-level debug

The config is the runtime's TOML file (docs/runtime.md) with a [listen] table:
  [listen]
  unix = "/run/edgeserve/edgeserve.sock"   # and/or
  tcp = "127.0.0.1:7070"                  # ":7070" also binds 127.0.0.1
  unix_mode = "0660"
  token = "change-me"                     # clients send it in their hello

Once every listener is open it prints one line that scripts can wait for:
  edgeserve: ready, listening on unix:///run/edgeserve/edgeserve.sock tcp://127.0.0.1:7070
SIGTERM or SIGINT stops accepting, answers the requests in flight, removes the socket file.
The wire protocol is in docs/protocol.md; clients: edgeserve.net.AsyncClient / BlockingClient.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the configured models over UNIX/TCP sockets",
        description="Load the configured models and serve them over the msgpack socket protocol "
        "(docs/protocol.md), scheduling every request against its deadline.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True, help="server TOML file with a [listen] table")
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"), help="default: info"
    )
    parser.set_defaults(func=run)


async def serve(config_path: Path) -> None:
    """Run until SIGTERM/SIGINT, then shut down cleanly."""
    from edgeserve.net.service import NetServer
    from edgeserve.runtime.config import ServerConfig

    config = ServerConfig.from_toml(config_path)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log = logging.getLogger("edgeserve.serve")
    async with NetServer(config) as net:
        for url in net.urls:
            log.info("listening on %s", url)
        print(f"{READY_PREFIX} {' '.join(net.urls)}", flush=True)
        await stop.wait()
        log.info(
            "stopping: answering %d requests in flight", sum(len(c.tasks) for c in net.frontend.connections)
        )
    stats = net.frontend.stats
    log.info(
        "stopped after %d connections, %d requests (%d answers discarded, %d protocol errors)",
        stats.connections,
        stats.requests,
        stats.discarded,
        stats.protocol_errors,
    )


def run(args: argparse.Namespace) -> int:
    from edgeserve.runtime.loop import run as run_loop

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    run_loop(serve(args.config))
    return 0

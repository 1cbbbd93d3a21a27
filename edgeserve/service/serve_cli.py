"""`edgeserve serve --config FILE`: run the server on its UNIX and/or TCP listeners until signalled."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

READY_PREFIX = "edgeserve: ready, listening on"


def ready_urls(line: str) -> list[str] | None:
    """The URLs of `edgeserve serve`'s ready line (what scripts wait for), None for any other line."""
    return line.removeprefix(READY_PREFIX).split() if line.startswith(READY_PREFIX) else None


EPILOG = """\
examples:
  edgeserve serve --config serve.toml
  edgeserve serve --config serve.toml --log-level debug

The config is the runtime's TOML file with a [listen] table; every key, commented, is in the example
installed with the package (`edgeserve install-service --dry-run` prints it as /etc/edgeserve/config.toml):
  [listen]
  unix = "/run/edgeserve/edgeserve.sock"   # and/or
  tcp = "127.0.0.1:7070"                  # ":7070" also binds 127.0.0.1
  http = "127.0.0.1:8000"                 # Open Inference Protocol / KServe v2 (docs/oip.md)
  unix_mode = "0660"
  token = "change-me"                     # clients send it in their hello
  [metrics]                               # optional: Prometheus scrape endpoint (docs/metrics.md)
  listen = "127.0.0.1:8002"               # serves GET /metrics; logged as `metrics url=...`

Once every listener is open it prints one line that scripts can wait for:
  edgeserve: ready, listening on unix:///run/edgeserve/edgeserve.sock tcp://127.0.0.1:7070
SIGTERM or SIGINT stops accepting, answers the requests in flight, removes the socket file.
SIGHUP re-reads the config: SLOs, queue limits, [scheduler], profiles and [logging] change live;
changing the models, [backend], [listen] or the repository is refused (restart instead).
Logs are one logfmt (or JSON) line per event on stderr; under systemd it speaks sd_notify
(READY, WATCHDOG, STATUS, STOPPING): see systemd/README.md.
The wire protocol is in docs/protocol.md; clients: edgeserve.net.AsyncClient / BlockingClient.
docs/*.md and systemd/README.md are in the source repository, not in the installed package.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the configured models over UNIX/TCP sockets and HTTP (Open Inference Protocol)",
        description="Load the configured models and serve them over the msgpack socket protocol "
        "(docs/protocol.md) and, with [listen] http, the Open Inference Protocol (docs/oip.md), "
        "scheduling every request against its deadline; [metrics] adds a Prometheus endpoint and "
        "[[upstreams]] offload (docs/offload.md). Under systemd it notifies READY/WATCHDOG/STOPPING "
        "and reloads on SIGHUP (systemd/README.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True, help="server TOML file with a [listen] table")
    parser.add_argument(
        "--log-level",
        default=None,
        choices=("debug", "info", "warning", "error"),
        help="overrides [logging] level in the config (default: the config's, else info)",
    )
    parser.set_defaults(func=run)


async def serve(config_path: Path, *, log_level: str | None = None) -> None:
    """Run until SIGTERM/SIGINT, then shut down cleanly; SIGHUP reloads the config file.

    Under systemd (Type=notify) it sends READY=1 once the listeners accept, WATCHDOG=1 from the
    loop, STATUS= with the load, RELOADING=1/READY=1 around a reload and STOPPING=1 at shutdown.
    """
    from edgeserve.config.server import ServerConfig
    from edgeserve.service.process import NetServer
    from edgeserve.service.reloader import ConfigReloader
    from edgeserve.service.sd_notify import LoadStatus, Notifier

    config = ServerConfig.from_toml(config_path)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log = logging.getLogger("edgeserve.serve")
    loop.add_signal_handler(signal.SIGHUP, lambda: log.warning("SIGHUP ignored: still starting"))
    async with NetServer(config) as net:
        notifier = Notifier.from_env(LoadStatus(net.server.snapshot))
        reloader = ConfigReloader(config_path, net, notifier, log_level)
        loop.add_signal_handler(signal.SIGHUP, reloader.request)
        net.on_failure(stop.set)
        for url in net.urls:
            log.info("listening", extra={"url": url})
        if net.metrics_url is not None:
            log.info("metrics", extra={"url": net.metrics_url})
        print(f"{READY_PREFIX} {' '.join(net.urls)}", flush=True)
        notifier.start()
        notifier.ready()
        try:
            await stop.wait()
        finally:  # also when the task is cancelled
            loop.remove_signal_handler(signal.SIGHUP)
            notifier.stopping()
        in_flight = net.frontend.in_flight
        log.info("stopping: answering the requests in flight", extra={"in_flight": in_flight})
        await reloader.wait()
    notifier.stop()
    if net.failure is not None:
        from edgeserve.errors import EdgeServeError

        raise EdgeServeError(f"{net.failure}; the server stopped (see the log above)")
    stats = net.frontend.stats
    log.info(
        "stopped",
        extra={
            "connections": stats.connections,
            "requests": stats.requests,
            "discarded": stats.discarded,
            "protocol_errors": stats.protocol_errors,
            "reloads": reloader.reloads,
        },
    )


def run(args: argparse.Namespace) -> int:
    from edgeserve import logs
    from edgeserve.config.server import ServerConfig
    from edgeserve.errors import BackendUnavailableError
    from edgeserve.loop import run as run_loop

    logging_config = ServerConfig.from_toml(args.config).logging  # a bad file fails here, clearly
    logs.configure(args.log_level or logging_config.level, logging_config.format, sys.stderr)
    try:
        run_loop(serve(args.config, log_level=args.log_level))
    except BackendUnavailableError as exc:  # the backends' hints name profile's flag; serve reads its config
        raise BackendUnavailableError(serve_hint(str(exc), args.config)) from None
    return 0


def serve_hint(message: str, config: Path) -> str:
    """A backend hint rewritten for `serve`, which takes [backend] name from the config, not --backend."""
    return message.replace(
        "serve with `--backend onnxruntime`", f'set [backend] name = "onnxruntime" in {config}'
    ).replace("`--backend onnxruntime`", f'[backend] name = "onnxruntime" in {config}')

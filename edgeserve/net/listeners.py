"""Listening sockets for a Frontend: a UNIX socket (mode and group from config) and/or TCP.

A UNIX socket file left behind by a crashed server is removed; one that still answers belongs
to a live server and is refused. TCP binds to 127.0.0.1 unless the config names another host;
TCP_NODELAY is set per connection (answers are small and latency-bound). Each listener tells the
Frontend its name ("unix", "tcp"), which counts connections per listener for
listen.max_connections_per_listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import grp
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

from edgeserve.config.server import ListenConfig
from edgeserve.errors import ListenError, listen_failure
from edgeserve.net.frontend import Frontend

__all__ = ["ListenError", "Listeners", "free_port", "free_ports", "open_listeners", "require_listener"]


@dataclass
class Listeners:
    """The open servers and the URLs clients use to reach them."""

    servers: list[asyncio.AbstractServer] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    unix_path: Path | None = None

    async def close(self) -> None:
        """Stop accepting and remove the UNIX socket file (open connections are left to the caller)."""
        for server in self.servers:
            server.close()
        if self.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.unix_path.unlink()
            self.unix_path = None

    async def wait_closed(self, timeout: float = 2.0) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout)


def _remove_stale_socket(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise ListenError(f"{path}: exists and is not a socket; choose another listen.unix path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # left behind by a server that is gone
        return
    finally:
        probe.close()
    raise ListenError(
        f"{path}: another server is listening there; stop it or choose another listen.unix path"
    )


def _check_socket_dir(path: Path) -> None:
    """ListenError naming the directory when the socket's directory is missing or not writable."""
    parent = path.parent
    if not parent.is_dir():
        raise ListenError(
            f"listen.unix {path}: the directory {parent} does not exist; create it (mkdir -p {parent}) "
            "or set listen.unix to a path in an existing directory"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ListenError(
            f"listen.unix {path}: this user may not create files in {parent}; choose a writable directory "
            "(under systemd: /run/edgeserve) or run as its owner"
        )


def require_listener(listen: ListenConfig) -> None:
    """ListenError unless the config names at least one listener."""
    if listen.unix is None and listen.tcp is None and listen.http is None and listen.grpc is None:
        raise ListenError(
            'no listener configured; add [listen] with unix = "/run/edgeserve.sock", tcp = ":7070", '
            'http = ":8000" or grpc = ":8001"'
        )


async def open_listeners(frontend: Frontend, listen: ListenConfig) -> Listeners:
    """Open every configured listener; on failure, close what was opened and raise ListenError."""
    require_listener(listen)
    loop = asyncio.get_running_loop()
    opened = Listeners()
    try:
        if listen.unix is not None:
            path = listen.unix
            _check_socket_dir(path)
            _remove_stale_socket(path)
            try:
                server = await loop.create_unix_server(
                    functools.partial(frontend.protocol_factory, "unix"), str(path)
                )
            except OSError as exc:
                raise listen_failure("listen.unix", str(path), exc) from None
            opened.servers.append(server)
            opened.unix_path = path
            os.chmod(path, listen.unix_mode)
            if listen.unix_group is not None:
                try:
                    gid = grp.getgrnam(listen.unix_group).gr_gid
                except KeyError:
                    raise ListenError(f"listen.unix_group: no group named {listen.unix_group!r}") from None
                os.chown(path, -1, gid)
            opened.urls.append(f"unix://{path.resolve()}")
        if listen.tcp is not None:
            host, port = listen.tcp
            try:
                server = await loop.create_server(
                    functools.partial(frontend.protocol_factory, "tcp"), host, port
                )
            except OSError as exc:
                raise listen_failure("listen.tcp", f"{host}:{port}", exc) from None
            opened.servers.append(server)
            bound = server.sockets[0].getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            opened.urls.append(f"tcp://{shown}:{bound[1]}")
    except BaseException:
        await opened.close()
        raise
    return opened


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, for configs that must name one ahead of time."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` different free TCP ports (two calls of free_port may return the same one: the
    kernel can hand out a port again as soon as its probe is closed)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]

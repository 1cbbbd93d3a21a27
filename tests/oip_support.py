"""Helpers for the Open Inference Protocol tests: a served tiny repository with an HTTP listener."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from net_support import ServerThread, server_thread
from runtime_support import config_dict

from edgeserve.runtime.server import BackendFactory


def oip_config(root: Path, *, models: dict[str, Any] | None = None, **listen: Any) -> dict[str, Any]:
    """The tiny repository's config with only the HTTP frontend, on a port the OS picks."""
    config = config_dict(root)
    if models is not None:
        config["models"] = models
    return {**config, "listen": {"http": "127.0.0.1:0", **listen}}


def http_url(srv: ServerThread) -> str:
    return next(u for u in srv.net.urls if u.startswith("http://"))


def grpc_address(srv: ServerThread) -> str:
    """host:port of a server's gRPC listener ([listen] grpc)."""
    assert srv.net.grpc is not None and srv.net.grpc.address is not None
    return srv.net.grpc.address


@contextmanager
def oip_server(
    config: dict[str, Any], backend_factory: BackendFactory | None = None
) -> Iterator[tuple[ServerThread, str]]:
    """A started NetServer on its own loop thread and the http:// URL of its OIP frontend."""
    with server_thread(config, backend_factory) as srv:
        yield srv, http_url(srv)


def host_port(url: str) -> tuple[str, int]:
    """(host, port) of an http:// URL."""
    host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


def raw_request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *, close: bool = False
) -> bytes:
    """An HTTP/1.1 request as bytes, for a raw socket (a hostile client sends exactly what it likes)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: edgeserve", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from `sock` (status, lower-case headers, body by Content-Length);
    status 0 and no headers when the server closed (or reset) the connection first."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0, {}, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except ConnectionResetError:
        return 0, {}, data
    return int(lines[0].split()[1]), headers, body


def json_error_of(status: int, headers: dict[str, str], body: bytes) -> str:
    """The {"error": ...} text of an error answer read by read_response, checking its shape."""
    assert headers.get("content-type", "").startswith("application/json"), (status, headers, body[:200])
    decoded = json.loads(body)
    assert set(decoded) == {"error"} and isinstance(decoded["error"], str), decoded
    return decoded["error"]

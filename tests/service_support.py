"""Helpers for the unattended-service tests: `edgeserve serve` as a subprocess, and a real
sd_notify datagram socket standing in for systemd."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from edgeserve.service.serve_cli import ready_urls


def write_serve_config(
    path: Path, repository: Path, sock: Path, *, slo_ms: float = 2000, extra: str = ""
) -> None:
    """A one-model (tiny_a) server config with a UNIX socket and an OS-chosen TCP port."""
    path.write_text(
        f"repository = {json.dumps(str(repository))}\n"
        "shutdown_timeout_s = 10.0\n"
        '[backend]\nname = "onnxruntime"\nthreads = 1\nwarmup = 0\n'
        f"[models.tiny_a]\nslo_ms = {slo_ms}\nmax_queue = 512\n"
        f'[listen]\nunix = {json.dumps(str(sock))}\nunix_mode = "0600"\ntcp = "127.0.0.1:0"\n'
        f"max_in_flight = 512\n{extra}"
    )


@dataclass
class ServeProcess:
    """A running `edgeserve serve`; stdout is read in the background for the ready line."""

    process: subprocess.Popen[str]
    urls: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def wait_ready(self, timeout: float = 60.0) -> list[str]:
        if not self.ready.wait(timeout):
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
            raise AssertionError(f"no ready line within {timeout} s; stderr:\n{err}")
        return self.urls

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        """Wait for exit (killing it after `timeout`); the exit code and all of stderr."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


@contextmanager
def serve_process(config: Path, env: dict[str, str] | None = None, *args: str) -> Iterator[ServeProcess]:
    """Start `python -m edgeserve.cli serve --config CONFIG`; killed on exit if still running."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edgeserve.cli", "serve", "--config", str(config), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    handle = ServeProcess(process)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if (urls := ready_urls(line)) is not None:
                handle.urls.extend(urls)
                handle.ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        yield handle
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


class NotifyListener:
    """A bound AF_UNIX datagram socket, as systemd's NOTIFY_SOCKET; records (time, fields)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []

    def receive(self, timeout: float) -> dict[str, str] | None:
        """The next datagram as a dict of fields, or None after `timeout` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))
            return fields
        return None

    def receive_all(self, duration: float) -> None:
        """Record every datagram for `duration` seconds (run in a thread while the sender works)."""
        end = time.monotonic() + duration
        while (left := end - time.monotonic()) > 0:
            self.receive(left)

    def wait_for(self, key: str, value: str | None = None, timeout: float = 60.0) -> dict[str, str]:
        """Receive until a message carries `key` (with `value` if given); fail after `timeout`."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            fields = self.receive(left)
            if fields is not None and key in fields and (value is None or fields[key] == value):
                return fields
        raise AssertionError(f"no {key}={value or '*'} within {timeout} s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()

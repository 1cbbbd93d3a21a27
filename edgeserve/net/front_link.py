"""The stream between the server process and its socket front process (`[listen] front_process`).

Records are msgpack values, written back to back (msgpack frames itself), batched per loop turn:
the requests a front's read admitted leave in one write, the answers of one batch in one write.
A record whose first item is an int is the hot path (a request from the front, its Result back,
keyed by that token); one whose first item is a str is a control record (setup, ready, stats,
the shutdown steps). No pickle: both ends are this package, but a record is plain data.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from edgeserve.config.server import ListenConfig, ModelConfig, PreprocessConfig, ServerConfig
from edgeserve.manifest import Manifest
from edgeserve.runtime import FrontendStats, Result, Status

READ_SIZE = 1 << 20
SOCKET_BUFFER = 4 << 20  # both ways: a turn's records never wait on a full socket in practice
_STATUS = {status.value: status for status in Status}

Record = list[Any]


class Link:
    """One end of the stream: `on_record` gets each record read; `send` queues one, and the
    records queued in a loop turn leave in one write (the rest, if the socket is full, when it
    drains). `closed` is set when the other end has gone. `before_read` runs before each read
    the loop makes (the server process answers the batches that ended first: Server.run_completed),
    `after_records` after the records of a read were handed over (the front process writes the
    answers they brought: RemoteServer.release_answers)."""

    def __init__(
        self,
        sock: socket.socket,
        on_record: Callable[[Record], None],
        before_read: Callable[[], None] | None = None,
        after_records: Callable[[], None] | None = None,
    ) -> None:
        sock.setblocking(False)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        self.sock = sock
        self.on_record = on_record
        self.closed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 31)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._out: list[bytes] = []
        self._pending = b""  # written in part: the socket was full
        self._before_read = before_read
        self._after_records = after_records
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        if self._before_read is not None:
            self._before_read()
        self.pump()

    def pump(self) -> None:
        """Read what has arrived (without blocking) and hand over its records."""
        if self.closed.is_set():
            return
        while True:
            try:
                data = self.sock.recv(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self._lost()
                break
            self._unpacker.feed(data)
            if len(data) < READ_SIZE:
                break
        for record in self._unpacker:
            self.on_record(record)
        if self._after_records is not None:
            self._after_records()

    def send(self, record: Record) -> None:
        if self.closed.is_set():
            return
        if not self._out:
            self._loop.call_soon(self.flush)
        self._out.append(self._packer.pack(record))

    def flush(self) -> None:
        if not self._out or self.closed.is_set():
            self._out.clear()
            return
        data = b"".join(self._out)
        self._out.clear()
        if self._pending:  # the writer callback sends it, in order
            self._pending += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._lost()
            return
        if sent < len(data):
            self._pending = data[sent:]
            self._loop.add_writer(self.sock.fileno(), self._drain)

    def _drain(self) -> None:
        try:
            sent = self.sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._lost()
            return
        self._pending = self._pending[sent:]
        if not self._pending:
            self._loop.remove_writer(self.sock.fileno())

    def _lost(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._loop.remove_reader(self.sock.fileno())
            if self._pending:
                self._loop.remove_writer(self.sock.fileno())

    def close(self) -> None:
        self.flush()
        self._lost()
        self.sock.close()


# -- requests and results ---------------------------------------------------------------------------


def _array(a: np.ndarray | None) -> list[Any] | None:
    """Any array as it is (not wire.tensors.encode_tensor, whose dtype allow-list is for clients:
    a Result crosses whatever it holds, so the front answers exactly as the in-process one)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return [a.dtype.str, list(a.shape), a.tobytes()]


def _from_array(v: list[Any] | None) -> np.ndarray | None:
    if v is None:
        return None
    return np.frombuffer(v[2], dtype=np.dtype(v[0])).reshape(v[1])


def request_record(
    token: int,
    model: str,
    x: np.ndarray,
    deadline_ms: float | None,
    capture_ts: float | None,
    margin_s: float,
    received: float | None,
) -> Record:
    shape = list(x.shape)
    return [token, model, x.dtype.str, shape, x.tobytes(), deadline_ms, capture_ts, margin_s, received]


def result_record(token: int, r: Result) -> Record:
    outputs = None if r.outputs is None else {k: _array(v) for k, v in r.outputs.items()}
    return [
        token,
        r.status.value,
        r.model,
        None if outputs else _array(r.output),  # else the first of outputs
        r.exit_index,
        r.exit_name,
        r.expected_accuracy,
        r.batch_size,
        r.queued,
        r.dispatch,
        r.start,
        r.end,
        r.deadline,
        r.error,
        r.served_by,
        outputs,
        time.monotonic(),  # sent: the front times the answer's way to it (RemoteServer.way_back_s)
    ]


def result_of(v: Record) -> Result:
    outputs = None if v[15] is None else {k: _from_array(a) for k, a in v[15].items()}
    output = _from_array(v[3]) if outputs is None else next(iter(outputs.values()), None)
    return Result(_STATUS[v[1]], v[2], output, *v[4:15], outputs)


# -- what the front process needs to know of the server ---------------------------------------------


def setup_record(config: ServerConfig, manifests: Mapping[str, Manifest], log_level: str) -> Record:
    """The listen table, the served models (SLO, preprocess) and their manifests: enough for the
    front to greet, check and refuse as the server would, without loading anything itself."""
    listen = {f.name: getattr(config.listen, f.name) for f in fields(ListenConfig)}
    listen["unix"] = None if listen["unix"] is None else str(listen["unix"])
    models = {
        name: {
            "slo_ms": m.slo_ms,
            "max_queue": m.max_queue,
            "preprocess": None if m.preprocess is None else asdict(m.preprocess),
        }
        for name, m in config.models.items()
    }
    return [
        "setup",
        {
            "listen": listen,
            "models": models,
            "manifests": {name: manifests[name].to_dict() for name in config.models},
            "log": {"level": log_level, "format": config.logging.format},
        },
    ]


def config_of(setup: Mapping[str, Any]) -> tuple[ServerConfig, dict[str, Manifest]]:
    listen = dict(setup["listen"])
    listen["unix"] = None if listen["unix"] is None else Path(listen["unix"])
    for key in ("tcp", "http"):
        listen[key] = None if listen[key] is None else tuple(listen[key])
    models = {}
    for name, m in setup["models"].items():
        pre = m["preprocess"]
        if pre is not None:  # msgpack gives lists where the config holds tuples
            resize = None if pre["resize"] is None else tuple(pre["resize"])
            pre = PreprocessConfig(
                **pre | {"resize": resize, "mean": tuple(pre["mean"]), "std": tuple(pre["std"])}
            )
        models[name] = ModelConfig(slo_ms=m["slo_ms"], max_queue=m["max_queue"], preprocess=pre)
    config = ServerConfig(models=models, listen=ListenConfig(**listen))
    manifests = {name: Manifest.from_dict(d) for name, d in setup["manifests"].items()}
    return config, manifests


def stats_record(kind: str, stats: FrontendStats) -> Record:
    return [kind, asdict(stats)]


def update_stats(stats: FrontendStats, values: Mapping[str, Any]) -> None:
    for f in fields(FrontendStats):
        if f.name in values:
            setattr(stats, f.name, values[f.name])

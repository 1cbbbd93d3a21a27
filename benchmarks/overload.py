"""Overload: in-deadline goodput of `edgeserve serve` under open-loop Poisson load up to 10x capacity.

Starts `edgeserve serve` (the digits models of `make demo` at 3:2:1, or `--model`s; ONNX Runtime
on one thread, a UNIX socket, a TCP port, /metrics) and drives it from a separate load-generator
process (spawn, uvloop, raw sockets; frames encoded once per model, all requests due at a wake-up
in one write; in the open loop, replies stamped as they arrive and decoded once the level's sending
is over, or with `--decode live` decoded as they arrive, as most clients do, which costs the client
about twice the CPU on the cores it shares with the server).
A closed loop (`--window` in flight per connection, at most the server's window and an even share
of its in-flight total; `--capacity-seconds`) measures the capacity in
`ok`/s; then open-loop Poisson load at each of `--levels` times it for `--seconds`, over
`--connections` (half UNIX, half TCP), sent on schedule whatever the answers. Each request carries
`deadline_ms` (its model's SLO, 5/8/10 ms, unless `--deadline-ms`); "in deadline" = `ok` and back at
the client within it, timed from the client's write. Per level: offered/s as sent, in-deadline/s,
rejected/s (`max_in_flight` or a full queue), expired/s, late/s (`ok` past the deadline), lost (no
answer `--grace` s after the last send), P50/P95/P99 of `ok` answers, the server's own mean latency
of `ok` answers, the mean batch (`ok` answers per batch) and its compute time, the executor's
busy fraction and the share of it its thread was on a CPU (`oncpu`: the rest it waited for the GIL
or a core), the seconds per second the executor's and the loop's threads were ready to run but
had no CPU (`exwait`, `lpwait`: Linux schedstat), idle-gap and decision P50/P99 (n/a without
those histograms), client CPU while sending and server CPU (100% = one core), the share of the
wall time the loop polled while idle (`poll%`, `[backend] idle_poll_us`), the median wait of a
request in its socket before the front read it as the phase ended (`rdwus`); every rate also as
a multiple of the capacity. Last, fairness: one connection floods at 10x (`--flood`; `--floods N`
shares it among N) while another, from a second process, sends at 0.1x (`--polite http`: over the
Open Inference Protocol instead, the project's OipClient; `--polite grpc`: over its gRPC form,
tritonclient.grpc.aio). `--flood-over grpc` sends the flood over gRPC instead (grpc.aio's generic
calls on bytes serialised once, over N channels with `--floods N`), arrivals more than 0.1 s overdue
at a sender that falls behind counted as unsent; `--flood-over http` over the Open Inference
Protocol's HTTP front, the same way (aiohttp, each model's binary-tensor body encoded once, 64
connections per `--floods` share, only the HTTP status read).
`--split` shares a level's load unevenly among the connections (one busy camera, three quiet). Goals:
goodput >= 0.8x capacity at 2x and up (client included); the polite connection >= 99% in deadline.

    make demo                                                      # once: digits models in ./engines
    .venv/bin/python benchmarks/overload.py                        # ~1.5 minutes
    .venv/bin/python benchmarks/overload.py --seconds 5 --capacity-seconds 4 --plot out/overload.png
    .venv/bin/python benchmarks/overload.py --levels 1 10 --deadline-ms 20 --json out/overload.json
    .venv/bin/python benchmarks/overload.py --late-tasks expire --capacity 12000   # fixed offered rates
    .venv/bin/python benchmarks/overload.py --connections 16 --no-fairness         # many clients
    .venv/bin/python benchmarks/overload.py --decode live --no-fairness            # a decoding client
    .venv/bin/python benchmarks/overload.py --split 0.7,0.1,0.1,0.1 --flood 3      # uneven clients
    .venv/bin/python benchmarks/overload.py --levels 1 --polite http --deadline-ms 20  # polite over HTTP
    .venv/bin/python benchmarks/overload.py --levels 1 --polite grpc --deadline-ms 20  # polite over gRPC
    .venv/bin/python benchmarks/overload.py --levels 1 --flood-over grpc --deadline-ms 20  # flood over gRPC
    .venv/bin/python benchmarks/overload.py --levels 1 --flood-over http --deadline-ms 20  # flood over HTTP
    edgeserve export --model resnet50 --model resnet101 --model resnet152 --width 0.25 --repository rn
    edgeserve-profile --threads 1 --repeats 30 --repository rn    # heavier models (SLO 50 ms), then:
    .venv/bin/python benchmarks/overload.py --repository rn --model resnet50-cifar-w0.25 \
        --model resnet101-cifar-w0.25 --model resnet152-cifar-w0.25
    edgeserve-profile --backend torch --device cuda --threads 1                    # a GPU box, then:
    .venv/bin/python benchmarks/overload.py --backend torch --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from soak import read_exposition, start_server, stop_server  # benchmarks/soak.py, next to this file

from edgeserve.config.server import DEFAULT_TOTAL_WINDOWS
from edgeserve.loop import new_event_loop
from edgeserve.net.listeners import free_ports
from edgeserve.repository import ModelRepository
from edgeserve.tools.bench import default_ratios, split_rate
from edgeserve.tools.demo import DEMO_SLO_MS
from edgeserve.wire.frames import HEADER, encode_frame, parse_infer
from edgeserve.wire.oip_client import OipClient, OipError
from edgeserve.wire.oip_codec import InferRequest, Tensor, encode_request
from edgeserve.wire.tensors import encode_tensor

STATUS = {"ok": 0, "rejected": 1, "expired": 2}  # anything else (error, invalid, shutdown): 3
PACK_ID = struct.Struct(">I").pack  # ids as msgpack uint32 (0xce + 4 bytes): a fixed frame length
WRITE_CAP = 64 * 2**20  # past this many unsent bytes on a connection, new arrivals count as unsent
TICK = 0.001  # a sender sleeps at least this long: sub-ms sleeps would spin the loop per request
HISTOGRAMS = {  # buckets scraped for quantiles
    "edgeserve_executor_idle_gap_seconds_bucket": "gap",
    "edgeserve_scheduler_decision_seconds_bucket": "decision",
}
SCRAPED = {  # summed over models
    "edgeserve_executor_busy_seconds_total": "busy",
    "edgeserve_executor_busy_cpu_seconds_total": "busy_cpu",
    "process_cpu_seconds_total": "cpu",
    "edgeserve_frontend_process_cpu_seconds_total": "front_cpu",  # the socket front's own process
    "edgeserve_request_duration_seconds_count": "ok_n",  # the server's arrival-to-answer, `ok` only
    "edgeserve_request_duration_seconds_sum": "ok_s",
    "edgeserve_batches_total": "batches",
    "edgeserve_batches_decided_ahead_total": "ahead",
    "edgeserve_compute_duration_seconds_sum": "compute_s",
    "edgeserve_idle_poll_seconds_total": "idle_poll",
    "edgeserve_frontend_read_wait_seconds": "read_wait",  # a gauge: the socket front's (HTTP's is 0)
    "edgeserve_violations_total": "violations",  # the server's own view: late or expired answers
    "edgeserve_executor_idle_gap_seconds_sum": "gap_s",
}
THREAD_WAITS = {"executor": "executor_wait", "loop": "loop_wait"}  # edgeserve_thread_cpu_wait_seconds_total

# -- the load generator (its own process) ----------------------------------------------------------


def frame_head(model: str, spec: dict[str, Any], deadline_ms: float, seed: int) -> bytes:
    """A whole infer frame but the id's 4 bytes: length, map header, fields, "id", 0xce."""
    x = np.random.default_rng(seed).standard_normal(spec["input"]["shape"]).astype(spec["input"]["dtype"])
    fields = {"type": "infer", "model": model, "tensor": encode_tensor(x), "deadline_ms": float(deadline_ms)}
    packer = msgpack.Packer(use_bin_type=True)
    body = packer.pack_map_header(len(fields) + 1)
    body += b"".join(packer.pack(k) + packer.pack(v) for k, v in fields.items()) + packer.pack("id") + b"\xce"
    head = HEADER.pack(len(body) + 4) + body
    assert parse_infer(msgpack.unpackb(head[4:] + PACK_ID(7))).id == 7  # what the server will parse
    return head


class Conn(asyncio.Protocol):
    """One connection: writes pre-encoded frames, decodes replies, records send/answer times."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.hello: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.heads: list[bytes] = []
        self.sent_at: list[float] = []  # by id
        self.model: list[int] = []  # by id
        self.ans_id: list[int] = []
        self.ans_t: list[float] = []
        self.ans_st: list[int] = []
        self.unsent, self.lag_sum, self.lag_max = 0, 0.0, 0.0
        self.refill: list[int] | None = None  # closed loop: model draws, one more sent per answer
        # open loop: (arrival time, bytes) of the replies while sending, so that the loop's time
        # goes to sending on schedule and stamping answers, not to decoding ~90k refusals a second
        self.deferred: list[tuple[float, bytes]] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.hello.done():
            self.hello.set_exception(ConnectionError(f"closed during the hello: {exc}"))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.deferred is not None:  # sending on schedule: stamp the bytes now, decode them later
            self.deferred.append((now, data))
            return
        answered = self.decode(data, now)
        if answered and self.refill is not None:
            start = len(self.sent_at)
            self.write([self.refill[(start + k) & 0xFFFF] for k in range(answered)], now)

    def decode(self, data: bytes, now: float) -> int:
        """Record every whole reply in the buffer as answered at `now`; the number of answers."""
        buf = self.buf
        buf += data
        pos, end, answered = 0, len(buf), 0
        with memoryview(buf) as view:
            while end - pos >= 4:
                size = int.from_bytes(view[pos : pos + 4], "big")
                if end - pos - 4 < size:
                    break
                message = msgpack.unpackb(view[pos + 4 : pos + 4 + size])
                pos += 4 + size
                if not self.hello.done():
                    self.hello.set_result(message)
                    continue
                self.ans_id.append(message["id"])
                self.ans_t.append(now)
                self.ans_st.append(STATUS.get(message["status"], 3))
                self.record(message)
                answered += 1
        del buf[:pos]
        return answered

    def record(self, message: dict[str, Any]) -> None:
        """One answer's message, for a subclass that keeps more of it than its status."""

    def catch_up(self) -> None:
        """Decode the replies stamped while sending; from now on each is decoded as it comes."""
        deferred, self.deferred = self.deferred or [], None
        for now, data in deferred:
            self.decode(data, now)

    def write(self, models: list[int], now: float) -> None:
        if self.transport.get_write_buffer_size() > WRITE_CAP or self.transport.is_closing():
            self.unsent += len(models)
            return
        start, heads = len(self.sent_at), self.heads
        self.transport.write(b"".join([heads[m] + PACK_ID(start + k) for k, m in enumerate(models)]))
        self.sent_at.extend([now] * len(models))
        self.model.extend(models)

    async def open_loop(self, t0: float, times: list[float], models: list[int], live: bool) -> None:
        """Send each request at its scheduled time; those due at one wake-up go in one write.
        `live`: decode the replies as they come instead of after the last send."""
        i, n, csum = 0, len(times), np.concatenate([[0.0], np.cumsum(times)])
        self.deferred = None if live else []
        while i < n:
            now = time.monotonic()
            j = bisect.bisect_right(times, now - t0, i)
            if j > i:
                self.write(models[i:j], now)
                self.lag_sum += (now - t0) * (j - i) - (csum[j] - csum[i])
                self.lag_max = max(self.lag_max, now - t0 - times[i])
                i = j
            if i < n:
                await asyncio.sleep(max(TICK, t0 + times[i] - time.monotonic()))

    async def closed_loop(self, window: int, seconds: float) -> None:
        assert self.refill is not None
        self.write(self.refill[:window], time.monotonic())
        await asyncio.sleep(seconds)
        self.refill = None

    def summary(self, deadlines_s: np.ndarray) -> dict[str, Any]:
        sent_at, model = np.array(self.sent_at), np.array(self.model, dtype=np.int64)
        ids, st = np.array(self.ans_id, dtype=np.int64), np.array(self.ans_st, dtype=np.int64)
        lat = np.array(self.ans_t) - sent_at[ids] if len(ids) else np.zeros(0)
        ok = st == 0
        in_time = ok & (lat <= deadlines_s[model[ids]]) if len(ids) else np.zeros(0, dtype=bool)
        good = int(in_time.sum())
        by_model = np.bincount(model[ids][in_time], minlength=len(deadlines_s)).tolist() if len(ids) else []
        counts = np.bincount(st, minlength=4).tolist()
        counts = dict(zip(("ok", "rejected", "expired", "other"), counts, strict=True))
        n = len(sent_at)
        return counts | {
            **{"sent": n, "unsent": self.unsent, "lost": n - len(ids), "in_deadline": good},
            "in_deadline_by_model": by_model,
            **{"late": counts["ok"] - good, "ok_ms": (lat[ok] * 1e3).astype(np.float32)},
            **{"lag_mean_ms": 1e3 * self.lag_sum / max(n + self.unsent, 1), "lag_max_ms": 1e3 * self.lag_max},
        }


async def open_conn(target: str) -> tuple[Conn, dict[str, Any]]:
    loop = asyncio.get_running_loop()
    kind, _, where = target.partition("://")
    if kind == "unix":
        transport, conn = await loop.create_unix_connection(Conn, where)
    else:
        host, _, port = where.rpartition(":")
        transport, conn = await loop.create_connection(Conn, host, int(port))
    conn.transport = transport
    transport.write(encode_frame({"type": "hello", "version": 1, "client": "overload.py"}))
    hello = await asyncio.wait_for(conn.hello, 10.0)
    if hello.get("type") != "hello":
        raise ConnectionError(f"server refused the hello: {hello}")
    return conn, hello


def closed_window(window: int, max_in_flight: int | None, total: int | None, connections: int) -> int:
    """A closed-loop connection's requests in flight: `window`, at most the server's window and an
    even share of its in-flight total (`[listen] max_in_flight_total`, by default DEFAULT_TOTAL_WINDOWS
    windows): past them the server refuses, and a closed loop that resends each refusal at once
    measures its own spinning, not the capacity (with 32 connections, 44 % of its answers `ok`)."""
    if not window or not max_in_flight:
        return window
    share = (total or DEFAULT_TOTAL_WINDOWS * max_in_flight) // max(connections, 1)
    return min(window, max_in_flight, max(1, share))


async def run_phase(spec: dict[str, Any], pipe: Connection) -> dict[str, Any]:
    """This process's connections: connect, plan, 'ready', wait for 'go', send, 'sent', drain."""
    names, seconds = spec["models"], spec["seconds"]
    opened = [await open_conn(c["target"]) for c in spec["conns"]]
    plans = []
    for i, (conn, hello) in enumerate(opened):
        conn.heads = [
            frame_head(m, hello["models"][m], spec["deadlines_ms"][k], k) for k, m in enumerate(names)
        ]
        rng = np.random.default_rng(spec["seed"] + i)
        rate, window = spec["conns"][i].get("rate", 0.0), spec["conns"][i].get("window", 0)
        window = closed_window(window, hello.get("max_in_flight"), spec.get("total"), len(spec["conns"]))
        n = int(rate * seconds + 6 * math.sqrt(rate * seconds) + 10) if rate else 0  # >= the arrivals
        times = np.cumsum(rng.exponential(1.0 / rate, n)) if rate else np.zeros(0)
        times = times[times < seconds].tolist()
        draws = rng.choice(len(names), size=max(len(times), 1 << 16), p=spec["weights"]).tolist()
        conn.refill = draws if window else None
        plans.append((times, draws[: len(times)], window))
    pipe.send(("ready", opened[0][1].get("max_in_flight")))
    assert pipe.recv() == "go"
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(
        *(
            c.closed_loop(window, seconds) if window else c.open_loop(t0, times, models, spec["live"])
            for (c, _), (times, models, window) in zip(opened, plans, strict=True)
        )
    )
    pipe.send(("sent", time.monotonic() - t0, time.process_time() - cpu0))
    for c, _ in opened:  # every connection has sent its last: no schedule left to delay
        c.catch_up()
    give_up = time.monotonic() + spec["grace"]
    while time.monotonic() < give_up and any(len(c.ans_id) < len(c.sent_at) for c, _ in opened):
        await asyncio.sleep(0.01)
    for c, _ in opened:
        c.transport.close()
    deadlines_s = np.array(spec["deadlines_ms"]) / 1e3
    return {"conns": [c.summary(deadlines_s) for c, _ in opened]}


# gRPC status -> the HTTP status OipClient would have raised (docs/oip.md, "gRPC": status codes)
GRPC_AS_HTTP = {"StatusCode.UNAVAILABLE": 429, "StatusCode.DEADLINE_EXCEEDED": 504}


class GrpcOip:
    """tritonclient.grpc.aio behind OipClient's two calls: the polite client with `--polite grpc`."""

    def __init__(self, url: str) -> None:
        import tritonclient.grpc.aio as grpcclient  # the interop extra; only this client needs it

        self.grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(url.removeprefix("grpc://"))

    async def __aenter__(self) -> GrpcOip:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def model_metadata(self, model: str) -> dict[str, Any]:
        return await self.client.get_model_metadata(model, as_json=True)  # int64 shapes as strings

    async def infer(
        self, model: str, inputs: dict[str, np.ndarray], parameters: dict[str, Any], timeout_s: float
    ) -> None:
        from tritonclient.utils import InferenceServerException

        tensors = []
        for name, x in inputs.items():
            tensor = self.grpc.InferInput(name, list(x.shape), str(x.dtype).upper().replace("FLOAT", "FP"))
            tensor.set_data_from_numpy(x)
            tensors.append(tensor)
        try:
            await self.client.infer(model, tensors, parameters=parameters, client_timeout=timeout_s)
        except InferenceServerException as exc:
            status = GRPC_AS_HTTP.get(str(exc.status()), 500)
            raise OipError(str(exc), kind="http", status=status) from None


async def run_http_phase(spec: dict[str, Any], pipe: Connection) -> dict[str, Any]:
    """An open-loop client of the Open Inference Protocol (the project's OipClient, binary tensors,
    `deadline_ms` as a request parameter): the fairness case's polite client with `--polite http`
    (`--polite grpc`: tritonclient.grpc.aio instead, through GrpcOip).
    Same messages to the orchestrator as `run_phase`; its sends and answers are recorded in a Conn
    (never connected) for the same summary."""
    names, seconds, rate = spec["models"], spec["seconds"], spec["http"]["rate"]
    rng = np.random.default_rng(spec["seed"])
    times = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.5 + 100)))
    times = times[times < seconds].tolist()
    models = rng.choice(len(names), size=len(times), p=spec["weights"]).tolist()
    record = Conn()
    statuses = {429: STATUS["rejected"], 504: STATUS["expired"]}
    url = spec["http"]["url"]
    opened = GrpcOip(url) if url.startswith("grpc://") else OipClient(url, max_connections=64)
    async with opened as client:
        inputs = []
        for k, model in enumerate(names):
            (tensor,) = (await client.model_metadata(model))["inputs"]
            shape = [1 if int(d) < 0 else int(d) for d in tensor["shape"]]
            dtype = f"{tensor['datatype'].lower().replace('fp', 'float')}"  # FP32 -> float32, UINT8 -> uint8
            x = np.random.default_rng(k).standard_normal(shape).astype(dtype)
            inputs.append({tensor["name"]: x})

        async def one(i: int, k: int) -> None:
            parameters = {"deadline_ms": spec["deadlines_ms"][k]}
            try:
                # gRPC: the deadline set as the client's gRPC deadline too, as a camera would
                # (docs/oip.md: only it counts the call's wait before it reaches the server)
                timeout_s = spec["deadlines_ms"][k] / 1e3 if isinstance(client, GrpcOip) else 30.0
                await client.infer(names[k], inputs[k], parameters=parameters, timeout_s=timeout_s)
                status = STATUS["ok"]
            except OipError as exc:
                status = statuses.get(exc.status or 0, 3)
            record.ans_id.append(i)
            record.ans_st.append(status)
            record.ans_t.append(time.monotonic())

        pipe.send(("ready", None))
        assert pipe.recv() == "go"
        cpu0, t0 = time.process_time(), time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        for i, (t, k) in enumerate(zip(times, models, strict=True)):
            if (wait := t0 + t - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            record.lag_sum += now - t0 - t
            record.lag_max = max(record.lag_max, now - t0 - t)
            record.sent_at.append(now)
            record.model.append(k)
            task = asyncio.ensure_future(one(i, k))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        pipe.send(("sent", time.monotonic() - t0, time.process_time() - cpu0))
        if tasks:
            await asyncio.wait(tasks, timeout=spec["grace"])
        for task in list(tasks):  # no answer within the grace: lost
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"conns": [record.summary(np.array(spec["deadlines_ms"]) / 1e3)]}


GRPC_METHOD = "/inference.GRPCInferenceService/"
FLOOD_BEHIND = 0.1  # a gRPC or HTTP flood's arrival this long overdue and not yet sent counts as unsent
FLOOD_CHUNK = 128  # requests such a flood starts per turn of the loop: its answers are stamped in between


async def flood_open_loop(
    send: Callable[[int], Awaitable[int]],
    record: Conn,
    t0: float,
    times: list[float],
    models: list[int],
    tasks: set[asyncio.Task[None]],
) -> None:
    """One gRPC channel's or HTTP flood's open loop, as Conn.open_loop: each request started at its
    scheduled time by `send(model index)` (at most FLOOD_CHUNK per turn of the loop, the rest on the
    turns after), which answers its STATUS; its send and answer times (only the status of the
    answer) in `record`. A sender that falls behind drops what is more than FLOOD_BEHIND overdue as
    unsent, as a socket flood whose server stops reading does."""

    async def one(answer: Awaitable[int], i: int) -> None:
        status = await answer
        record.ans_id.append(i)
        record.ans_st.append(status)
        record.ans_t.append(time.monotonic())

    i, n, csum = 0, len(times), np.concatenate([[0.0], np.cumsum(times)])
    while i < n:
        now = time.monotonic()
        due = bisect.bisect_right(times, now - t0, i)
        stale = bisect.bisect_right(times, now - t0 - FLOOD_BEHIND, i, due)
        j = min(due, stale + FLOOD_CHUNK)
        if j > i:
            record.lag_sum += (now - t0) * (j - i) - (csum[j] - csum[i])
            record.lag_max = max(record.lag_max, now - t0 - times[i])
            record.unsent += stale - i
            for k in models[stale:j]:
                task = asyncio.ensure_future(one(send(k), len(record.sent_at)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                record.sent_at.append(now)
                record.model.append(k)
            i = j
        if i < n:
            await asyncio.sleep(0 if i < due else max(TICK, t0 + times[i] - time.monotonic()))


def grpc_sender(rpc: Callable[[bytes], Any], requests: list[bytes]) -> Callable[[int], Awaitable[int]]:
    """flood_open_loop's `send` for a gRPC channel: the RPC started at once (as the call is made) on
    model k's request serialised once; the awaitable answers the status of its answer."""
    import grpc

    statuses = {
        grpc.StatusCode.UNAVAILABLE: STATUS["rejected"],
        grpc.StatusCode.DEADLINE_EXCEEDED: STATUS["expired"],
    }

    async def status_of(call: Any) -> int:
        try:
            await call
            return STATUS["ok"]
        except grpc.aio.AioRpcError as exc:
            return statuses.get(exc.code(), 3)

    def send(k: int) -> Awaitable[int]:
        return status_of(rpc(requests[k]))

    return send


def flood_plans(spec: dict[str, Any]) -> list[tuple[list[float], list[int]]]:
    """Each flood connection's (or channel's) Poisson arrival times and model draws."""
    names, seconds, plans = spec["models"], spec["seconds"], []
    for i, c in enumerate(spec["conns"]):
        rng, rate = np.random.default_rng(spec["seed"] + i), c["rate"]
        times = np.cumsum(
            rng.exponential(1.0 / rate, int(rate * seconds + 6 * math.sqrt(rate * seconds) + 10))
        )
        times = times[times < seconds].tolist()
        plans.append((times, rng.choice(len(names), size=len(times), p=spec["weights"]).tolist()))
    return plans


async def run_grpc_phase(spec: dict[str, Any], pipe: Connection) -> dict[str, Any]:
    """The fairness case's flood with `--flood-over grpc`: an open loop per gRPC channel (each its own
    connection) on grpc.aio's generic calls, each model's ModelInferRequest serialised once, only the
    status of each answer read. Same messages to the orchestrator as `run_phase`, and one Conn (never
    connected) per channel for the same summary."""
    import grpc
    from tritonclient.grpc import service_pb2  # the interop extra, as GrpcOip's

    names = spec["models"]
    channels = [
        grpc.aio.insecure_channel(
            c["target"].removeprefix("grpc://"), options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for c in spec["conns"]
    ]
    tasks: set[asyncio.Task[None]] = set()
    try:
        metadata = channels[0].unary_unary(
            GRPC_METHOD + "ModelMetadata",
            request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
            response_deserializer=service_pb2.ModelMetadataResponse.FromString,
        )
        requests = []
        for k, model in enumerate(names):
            (tensor,) = (await metadata(service_pb2.ModelMetadataRequest(name=model), timeout=10.0)).inputs
            shape = [1 if d < 0 else d for d in tensor.shape]
            dtype = tensor.datatype.lower().replace("fp", "float")  # FP32 -> float32, UINT8 -> uint8
            request = service_pb2.ModelInferRequest(model_name=model)
            request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=shape)
            request.raw_input_contents.append(
                np.random.default_rng(k).standard_normal(shape).astype(dtype).tobytes()
            )
            request.parameters["deadline_ms"].double_param = spec["deadlines_ms"][k]
            requests.append(request.SerializeToString())
        for channel in channels:  # connected before the clock starts
            await asyncio.wait_for(channel.channel_ready(), 10.0)
        records, plans = [Conn() for _ in channels], flood_plans(spec)
        pipe.send(("ready", None))
        assert pipe.recv() == "go"
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.gather(
            *(
                flood_open_loop(
                    grpc_sender(channel.unary_unary(GRPC_METHOD + "ModelInfer"), requests),
                    record,
                    t0,
                    times,
                    models,
                    tasks,
                )
                for channel, record, (times, models) in zip(channels, records, plans, strict=True)
            )
        )
        pipe.send(("sent", time.monotonic() - t0, time.process_time() - cpu0))
        if tasks:
            await asyncio.wait(set(tasks), timeout=spec["grace"])
    finally:
        for task in list(tasks):  # no answer within the grace: lost
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()
    deadlines_s = np.array(spec["deadlines_ms"]) / 1e3
    return {"conns": [record.summary(deadlines_s) for record in records]}


HTTP_STATUS = {200: STATUS["ok"], 429: STATUS["rejected"], 503: STATUS["rejected"], 504: STATUS["expired"]}


def http_sender(
    session: Any, url: str, names: list[str], requests: list[tuple[bytes, dict[str, str]]]
) -> Callable[[int], Awaitable[int]]:
    """flood_open_loop's `send` for the HTTP flood: POST model k's body (encoded once) and headers;
    only the HTTP status is read (the body is read and discarded), any other status or a failure of
    the exchange is an error."""
    import aiohttp

    paths = [f"{url}/v2/models/{name}/infer" for name in names]

    async def send(k: int) -> int:
        body, headers = requests[k]
        try:
            async with session.post(paths[k], data=body, headers=headers) as resp:
                await resp.read()
                return HTTP_STATUS.get(resp.status, 3)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return 3

    return send


async def run_http_flood_phase(spec: dict[str, Any], pipe: Connection) -> dict[str, Any]:
    """The fairness case's flood with `--flood-over http`: the Open Inference Protocol's HTTP front, an
    open loop per `--floods` share (each its own Conn, never connected, for the same summary) on one
    aiohttp session; each model's request encoded once (edgeserve's encode_request, binary tensors,
    `deadline_ms` a request parameter), only the status of each answer read. Same messages to the
    orchestrator as `run_phase`."""
    import aiohttp

    names, url = spec["models"], spec["conns"][0]["target"]
    # An HTTP/1.1 client needs a connection per request in flight (no pipelining in aiohttp), and the
    # server's window per connection does not apply to HTTP: 64 connections per flood share, as the
    # polite HTTP client's pool (run_http_phase makes its OipClient with max_connections=64; OipClient's
    # own default, edgeserve/wire/oip_client.py, is 16). Arrivals past them wait in aiohttp's pool,
    # counted as sent: their wait for a free connection is part of their latency.
    connections = 64 * len(spec["conns"])
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=30.0), raise_for_status=False
    ) as session:
        try:
            requests = []
            for k, model in enumerate(names):
                async with session.get(f"{url}/v2/models/{model}") as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"GET {url}/v2/models/{model}: HTTP {resp.status}")
                    (tensor,) = (await resp.json())["inputs"]
                shape = [1 if int(d) < 0 else int(d) for d in tensor["shape"]]
                dtype = tensor["datatype"].lower().replace("fp", "float")  # FP32 -> float32, UINT8 -> uint8
                x = np.random.default_rng(k).standard_normal(shape).astype(dtype)
                # binary_data_output: the outputs raw, as OipClient.infer asks with binary=True
                parameters = {"deadline_ms": spec["deadlines_ms"][k], "binary_data_output": True}
                requests.append(
                    encode_request(InferRequest([Tensor(tensor["name"], x)], [], None, parameters))
                )

            async def ready() -> None:
                async with session.get(f"{url}/v2/health/ready") as resp:
                    await resp.read()

            # the pool's connections opened before the clock starts (the gRPC flood's channel_ready)
            await asyncio.wait_for(asyncio.gather(*(ready() for _ in range(connections))), 10.0)
            records, plans = [Conn() for _ in spec["conns"]], flood_plans(spec)
            send = http_sender(session, url, names, requests)
            pipe.send(("ready", None))
            assert pipe.recv() == "go"
            cpu0, t0 = time.process_time(), time.monotonic()
            await asyncio.gather(
                *(
                    flood_open_loop(send, record, t0, times, models, tasks)
                    for record, (times, models) in zip(records, plans, strict=True)
                )
            )
            pipe.send(("sent", time.monotonic() - t0, time.process_time() - cpu0))
            if tasks:
                await asyncio.wait(set(tasks), timeout=spec["grace"])
        finally:
            for task in list(tasks):  # no answer within the grace: lost
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    deadlines_s = np.array(spec["deadlines_ms"]) / 1e3
    return {"conns": [record.summary(deadlines_s) for record in records]}


def phase_for(spec: dict[str, Any]) -> Callable[[dict[str, Any], Connection], Awaitable[dict[str, Any]]]:
    if "http" in spec:
        return run_http_phase
    if spec["conns"] and all(c["target"].startswith("grpc://") for c in spec["conns"]):
        return run_grpc_phase  # the flood with --flood-over grpc
    if spec["conns"] and all(c["target"].startswith("http://") for c in spec["conns"]):
        return run_http_flood_phase  # the flood with --flood-over http
    return run_phase


def pin(pid: int, cpus: list[int]) -> None:
    """Every thread of process `pid` on `cpus` (Linux; the threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def worker_main(pipe: Connection, choose: Callable[..., Any] = phase_for) -> None:
    """The load-generator process: one phase per spec received (`choose` picks how), until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the orchestrator's: it ends this process
    loop = new_event_loop()
    try:
        while (spec := pipe.recv()) is not None:
            try:
                pipe.send(("done", loop.run_until_complete(choose(spec)(spec, pipe))))
            except Exception as exc:  # the orchestrator raises it
                pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        loop.close()


# -- the orchestrator (main process) ---------------------------------------------------------------


def scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=15) as response:
        text = response.read().decode()
    out: dict[str, Any] = {name: 0.0 for name in SCRAPED.values()} | {h: {} for h in HISTOGRAMS.values()}
    out |= {key: math.nan for key in THREAD_WAITS.values()}  # (not on every OS)
    for name, labels, value in read_exposition(text):
        if name == "edgeserve_thread_cpu_wait_seconds_total" and labels.get("thread") in THREAD_WAITS:
            out[THREAD_WAITS[labels["thread"]]] = value
        elif name in SCRAPED:
            out[SCRAPED[name]] += value
        elif name in HISTOGRAMS:
            out[HISTOGRAMS[name]][float(labels["le"])] = value
    return out | {"t": time.monotonic()}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile over cumulative {le: count}: linear within the bucket."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank, below, lower = q * buckets[bounds[-1]], 0.0, 0.0
    for i, le in enumerate(bounds):
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):  # as Prometheus: the highest finite bound
                return bounds[i - 1] if i else math.nan
            return lower + (le - lower) * (rank - below) / (count - below) if count > below else lower
        below, lower = count, le
    return math.nan


def _recv(pipe: Connection, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise TimeoutError(f"the load generator did not answer in {timeout:.0f} s")
    message = pipe.recv()
    if message[0] == "error":
        raise RuntimeError(f"load generator: {message[1]}")
    return message


def phase(pipes: list[Connection], specs: list[dict[str, Any]], metrics: str) -> dict[str, Any]:
    """One phase on the load generators together; two scrapes bracket the sending window."""
    limit = specs[0]["seconds"] + specs[0]["grace"] + 60
    for pipe, spec in zip(pipes, specs, strict=True):
        pipe.send(spec)
    readies = [_recv(pipe, 60) for pipe in pipes]
    before = scrape(metrics)
    for pipe in pipes:
        pipe.send("go")
    sent = [_recv(pipe, limit) for pipe in pipes]
    after = scrape(metrics)
    conns = [c for pipe in pipes for c in _recv(pipe, limit)[1]["conns"]]
    window, seconds = after["t"] - before["t"], max(s[1] for s in sent)
    batches = max(after["batches"] - before["batches"], 1)
    spans = {h: {le: n - before[h].get(le, 0.0) for le, n in after[h].items()} for h in HISTOGRAMS.values()}
    return {
        "conns": conns,
        "seconds": seconds,
        "max_in_flight": readies[0][1],
        "client_cpu": sum(s[2] for s in sent) / seconds,
        "server_cpu": (after["cpu"] + after["front_cpu"] - before["cpu"] - before["front_cpu"]) / window,
        "busy": (after["busy"] - before["busy"]) / window,
        "poll": (after["idle_poll"] - before["idle_poll"]) / window,
        "read_wait_us": 1e6 * after["read_wait"],  # the front's measured wait before a read, at the end
        # the executor thread's CPU time within its batches, per busy second: the rest it waited
        # (for the GIL as the backend's run returned, or for a core)
        "on_cpu": (after["busy_cpu"] - before["busy_cpu"]) / max(after["busy"] - before["busy"], 1e-9),
        # per second, how long the executor's and the loop's threads were ready but had no CPU
        **{key: (after[key] - before[key]) / window for key in THREAD_WAITS.values()},
        "server_ok_ms": 1e3 * (after["ok_s"] - before["ok_s"]) / max(after["ok_n"] - before["ok_n"], 1),
        # what the executor did per batch: its mean size (ok answers per batch) and compute time
        "batch_mean": (after["ok_n"] - before["ok_n"]) / batches,
        "batch_us": 1e6 * (after["compute_s"] - before["compute_s"]) / batches,
        "ahead": (after["ahead"] - before["ahead"]) / batches,  # decided while the one before ran
        "server_violations": after["violations"] - before["violations"],  # late by the server's clock
        # the executor's idle time between batches while work waited, per second it was busy
        "gap_share": (after["gap_s"] - before["gap_s"]) / max(after["busy"] - before["busy"], 1e-9),
        **quantiles("gap", spans["gap"]),
        **quantiles("decision", spans["decision"]),
    }


def quantiles(name: str, buckets: dict[float, float]) -> dict[str, Any]:
    """P50/P99 in us of one histogram (nan without it). Where one lies past the highest finite
    bucket, histogram_quantile answers that bound: flagged `_capped`, shown as ">bound"."""
    total = buckets.get(math.inf, 0.0)
    beyond = total - max((n for le, n in buckets.items() if le != math.inf), default=0.0)
    out: dict[str, Any] = {}
    for q in (50, 99):
        out[f"{name}_p{q}_us"] = 1e6 * histogram_quantile(q / 100, buckets)
        out[f"{name}_p{q}_us_capped"] = total > 0 and beyond > (1 - q / 100) * total
    return out


RATES = ("ok", "in_deadline", "rejected", "expired", "late", "other")


def row(name: str, result: dict[str, Any], capacity: float, target: float | None) -> dict[str, Any]:
    """One phase summed over its connections; every rate also as a multiple of the capacity."""
    conns, seconds = result["conns"], result["seconds"]
    total = {k: sum(c[k] for c in conns) for k in ("sent", "unsent", "lost", *RATES)}
    ok_ms = np.concatenate([c["ok_ms"] for c in conns])
    p50, p95, p99 = np.percentile(ok_ms, [50, 95, 99]).tolist() if len(ok_ms) else [math.nan] * 3
    out: dict[str, Any] = {"level": name, "target_per_s": target, "target_x": (target or 0.0) / capacity}
    out["offered_per_s"] = (total["sent"] + total["unsent"]) / seconds
    out |= {f"{k}_per_s": total[k] / seconds for k in RATES}
    out |= {f"{k}_x": out[f"{k}_per_s"] / capacity for k in ("offered", *RATES)}
    out |= {"lost": total["lost"], "unsent": total["unsent"], "p50_ms": p50, "p95_ms": p95, "p99_ms": p99}
    out |= {k: max(c[k] for c in conns) for k in ("lag_mean_ms", "lag_max_ms")}
    by_model = np.sum([c["in_deadline_by_model"] for c in conns if c["in_deadline_by_model"]], axis=0)
    out["in_deadline_by_model_per_s"] = (by_model / seconds).tolist()
    return out | {k: v for k, v in result.items() if k not in ("conns", "max_in_flight")}


_COLUMNS = (  # header|row key|format: every rate followed by its multiple of the capacity
    "level|level|>6 offered/s|offered_per_s|>9.0f x|offered_x|>5.2f in-dl/s|in_deadline_per_s|>8.0f "
    "x|in_deadline_x|>5.2f rej/s|rejected_per_s|>7.0f x|rejected_x|>5.2f exp/s|expired_per_s|>6.0f "
    "x|expired_x|>5.2f late/s|late_per_s|>6.0f x|late_x|>5.2f lost|lost|>5 p50ms|p50_ms|>6.2f "
    "p95ms|p95_ms|>6.2f p99ms|p99_ms|>7.2f srvms|server_ok_ms|>5.2f batch|batch_mean|>5.1f "
    "batchus|batch_us|>7.0f ahead|ahead|>5.0% busy|busy|>5.3f oncpu|on_cpu|>5.2f "
    "exwait|executor_wait|>6.2f lpwait|loop_wait|>6.2f gap50us|gap_p50_us|>7.0f "
    "gap99us|gap_p99_us|>7.0f dec50us|decision_p50_us|>7.0f cli%|client_cpu|>5.0% srv%|server_cpu|>5.0% "
    "poll%|poll|>5.1% rdwus|read_wait_us|>5.0f"
)
COLUMNS = [column.split("|") for column in _COLUMNS.split()]
HEAD = " ".join(f"{h:{f.split('.')[0]}}" for h, _, f in COLUMNS)


def show(r: dict[str, Any]) -> str:
    cells = []
    for _, key, spec in COLUMNS:
        value = r[key]
        bad = isinstance(value, float) and not math.isfinite(value)
        if spec.endswith("%"):  # a share as a percentage, without the sign
            value, spec = 100 * value, spec[:-1] + "f"
        text = "n/a" if bad else f">{value:.0f}" if r.get(f"{key}_capped") else f"{value:{spec}}"
        cells.append(f"{text:{spec.split('.')[0]}}")
    return " ".join(cells)


def write_plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("overload: --plot needs matplotlib (pip install matplotlib); no plot written", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["offered_x"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    top = max([*x, 1.0]) * 1.05
    ax.plot([0, 1, top], [0, 1, 1], color="grey", lw=1, label="ideal: min(offered, capacity)")
    ax.axhline(0.8, color="tab:red", ls="--", lw=1, label="target: 0.8x capacity")
    ax.plot(x, [r["in_deadline_x"] for r in rows], marker="o", label="answered ok within deadline")
    ax.set(xscale="symlog", xlabel="offered load (x measured capacity)", title=title, xlim=(0, top))
    ax.set_xticks(sorted({round(v, 1) for v in x}), [f"{v:.2g}" for v in sorted({round(v, 1) for v in x})])
    ax.set(ylabel="in-deadline goodput (x measured capacity)", ylim=(0, 1.15))
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_config(
    path: Path, args: argparse.Namespace, slos: dict[str, float], sock: Path, ports: list[int], admission: str
) -> None:
    lines = [f"repository = {json.dumps(str(args.repository.resolve()))}", "shutdown_timeout_s = 5.0"]
    lines += ["[backend]", f"name = {json.dumps(args.backend)}", "threads = 1"]  # as profiled: 1 thread
    lines += [f"device = {json.dumps(args.device)}"] if args.device else []
    lines += [
        "[listen]",
        f"unix = {json.dumps(str(sock))}",
        'unix_mode = "0600"',
        f'tcp = "127.0.0.1:{ports[0]}"',
        *([f'http = "127.0.0.1:{ports[2]}"'] if "http" in (args.polite, args.flood_over) else []),
        *([f'grpc = "127.0.0.1:{ports[3]}"'] if "grpc" in (args.polite, args.flood_over) else []),
        *([f"max_in_flight = {args.max_in_flight}"] if args.max_in_flight else []),
        *([f"max_in_flight_total = {args.max_in_flight_total}"] if args.max_in_flight_total else []),
        *([f"reply_margin_ms = {args.reply_margin_ms}"] if args.reply_margin_ms is not None else []),
        *([f"front_process = {str(args.front == 'process').lower()}"] if args.front else []),
    ]
    lines += ["[metrics]", f'listen = "127.0.0.1:{ports[1]}"']
    scheduler = {"late_tasks": args.late_tasks, "admission": admission, "policy": args.policy}
    lines += ["[scheduler]", *(f'{k} = "{v}"' for k, v in scheduler.items() if v)]
    if args.no_calibration:
        lines += ["calibration = false"]
    for model, slo_ms in slos.items():
        lines += [f"[models.{json.dumps(model)}]", f"slo_ms = {slo_ms}"]
    path.write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--levels", type=float, nargs="+", default=[0.5, 1, 2, 5, 10], help="x capacity")
    parser.add_argument("--seconds", type=float, default=8.0, help="per level (default 8)")
    parser.add_argument("--capacity-seconds", type=float, default=5.0, help="closed loop (default 5)")
    parser.add_argument("--window", type=int, default=32, help="closed loop: in flight per connection")
    parser.add_argument("--connections", type=int, default=4, help="half UNIX, half TCP (default 4)")
    parser.add_argument("--deadline-ms", type=float, help="deadline_ms of every request (default: its SLO)")
    parser.add_argument("--late-tasks", choices=("serve", "expire"), help="[scheduler] late_tasks (serve)")
    parser.add_argument(
        "--admission",
        choices=("all", "deadline"),
        default="deadline",
        help="[scheduler] admission (deadline)",
    )
    parser.add_argument("--capacity", type=float, help="req/s: use instead of the closed loop's ok/s")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between levels")
    parser.add_argument("--grace", type=float, default=2.0, help="drain: wait this long for answers")
    parser.add_argument(
        "--split",
        type=lambda text: [float(x) for x in text.split(",")],
        help="each connection's share of a level's load, e.g. 0.7,0.1,0.1,0.1 (default: even)",
    )
    parser.add_argument(
        "--decode",
        choices=("after", "live"),
        default="after",
        help="open loop: decode the replies after the level's last send (default), or as they come",
    )
    parser.add_argument("--no-fairness", action="store_true", help="skip the flood-vs-polite case")
    parser.add_argument(
        "--flood", type=float, default=10.0, help="fairness: the flood's rate, x capacity (default 10)"
    )
    parser.add_argument(
        "--floods",
        type=int,
        default=1,
        help="fairness: connections (gRPC: channels; HTTP: open loops, 64 connections each) sharing the "
        "flood's rate (default 1)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the server on the first CPU, the load generators on the others (Linux, 2+ CPUs): on a "
        "box with few cores, what the server does, apart from the generators' competing for its CPU",
    )
    parser.add_argument(
        "--flood-over",
        choices=("socket", "grpc", "http"),
        default="socket",
        help="fairness: the flood as raw socket frames (default), or over gRPC (grpc.aio's generic calls, "
        "each model's request serialised once; the server then listens on gRPC too), or over HTTP (the "
        "Open Inference Protocol, aiohttp with 64 connections per --floods share, each model's "
        "binary-tensor body encoded once; the server then listens on HTTP too): a sender that falls "
        "behind shows as unsent and send lag",
    )
    parser.add_argument(
        "--polite",
        choices=("socket", "http", "grpc"),
        default="socket",
        help="fairness: the polite client on a socket connection (TCP), or over HTTP (the Open "
        "Inference Protocol, OipClient with binary tensors; the server then listens on HTTP too), or "
        "over gRPC (tritonclient.grpc.aio, its deadline also as the gRPC deadline, client_timeout; the "
        "server then listens on gRPC too)",
    )
    parser.add_argument("--no-calibration", action="store_true", help="[scheduler] calibration = false")
    parser.add_argument("--policy", help="[scheduler] policy (default: the server's)")
    parser.add_argument("--max-in-flight", type=int, help="[listen] max_in_flight (default: the server's)")
    parser.add_argument(
        "--max-in-flight-total", type=int, help="[listen] max_in_flight_total (default: the server's)"
    )
    parser.add_argument(
        "--front",
        choices=("process", "loop"),
        help="[listen] front_process: the socket front in its own process or on the server's loop "
        "(default: the server's)",
    )
    parser.add_argument(
        "--reply-margin-ms", type=float, help="[listen] reply_margin_ms (default: the server's)"
    )
    parser.add_argument(
        "--backend",
        choices=("onnxruntime", "torch", "tensorrt"),
        default="onnxruntime",
        help="[backend] name (default onnxruntime); profile it first with --threads 1",
    )
    parser.add_argument("--device", help="[backend] device, e.g. cuda (torch: default cuda if available)")
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument(
        "--model",
        action="append",
        help="a model of --repository, at ratios 3:2:1... in the order given (repeatable; default: "
        "digits-s, digits-m, digits-l)",
    )
    parser.add_argument(
        "--slo-ms", type=float, default=50.0, help="slo_ms of models other than the digits ones (50)"
    )
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    parser.add_argument("--plot", type=Path, help="goodput vs offered load to this PNG (matplotlib)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    bounded = 1 <= args.connections <= 64 and 1 <= args.window <= 4096 and 0 < args.grace <= 60
    bounded &= 0 < args.seconds <= 600 and 0 < args.capacity_seconds <= 600 and 0 <= args.pause <= 60
    bounded &= len(args.levels) <= 20 and all(0 < level <= 100 for level in args.levels)
    bounded &= 0 < args.flood <= 100 and 1 <= args.floods <= 64
    if not bounded or min(args.deadline_ms or 1, args.capacity or 1, args.slo_ms) <= 0:
        parser.error(
            "bounds: --connections 1..64, --window 1..4096, --seconds/--capacity-seconds (0, 600], --grace "
            "(0, 60], --pause [0, 60], at most 20 --levels in (0, 100], --flood (0, 100], --floods 1..64, "
            "--deadline-ms/--capacity/--slo-ms > 0"
        )
    if args.split is not None:
        if len(args.split) != args.connections or min(args.split) < 0 or sum(args.split) <= 0:
            parser.error(f"--split: {args.connections} shares (one per connection), none negative")
        args.split = [share / sum(args.split) for share in args.split]
    return args


def sweep(
    pipes: list[Connection], base: dict[str, Any], args: argparse.Namespace, admit: Callable[[], None]
) -> list[dict[str, Any]]:
    """The closed-loop capacity, then one row per open-loop level and, last, the fairness case."""
    targets, metrics = base["targets"], base["metrics"]
    # Capacity is what the box serves flat out: the closed loop runs with admission = "all" (a
    # closed loop that resends each refusal at once would only measure its own spinning); then
    # `admit` reloads the server with the admission under test.
    closed = base | {"seconds": args.capacity_seconds, "seed": args.seed}
    closed["conns"] = [{"target": t, "window": args.window} for t in targets]
    closed["total"] = args.max_in_flight_total
    cap = phase(pipes[:1], [closed], metrics)
    measured = sum(c["ok"] for c in cap["conns"]) / cap["seconds"]
    capacity = args.capacity or measured
    if capacity <= 0:
        raise RuntimeError("the closed loop got no `ok` answer; see the server log")
    answered = sum(c["sent"] - c["lost"] for c in cap["conns"]) / cap["seconds"]
    if measured < 0.9 * answered:
        print(
            f"warning: only {measured / answered:.0%} of the closed loop's answers were `ok`, so its ok/s "
            "understates the capacity: try a smaller --window, or --capacity"
        )
    split = split_rate(base["models"], default_ratios(len(base["models"])), capacity)
    window = closed_window(args.window, cap["max_in_flight"], args.max_in_flight_total, len(targets))
    print(
        f"capacity (closed loop, {len(targets)} connections x {window} in flight, {cap['seconds']:.1f} "
        f"s): {measured:.0f} ok/s{f'; using --capacity {capacity:.0f}' if args.capacity else ''} = "
        f"{', '.join(f'{m} {r:.0f}/s' for m, r in split.items())}; the server allows "
        f"{cap['max_in_flight']} in flight per connection\n{HEAD}"
    )
    rows = [row("closed", cap, capacity, None) | {"capacity_per_s": capacity, "measured_per_s": measured}]
    print(show(rows[-1]), flush=True)
    admit()
    for k, level in enumerate(args.levels):
        time.sleep(args.pause)
        rate = level * capacity
        spec = base | {"seconds": args.seconds, "seed": args.seed + 100 * (k + 1)}
        shares = args.split or [1 / len(targets)] * len(targets)
        spec["conns"] = [{"target": t, "rate": rate * f} for t, f in zip(targets, shares, strict=True)]
        rows.append(r := row(f"{level:g}x", result := phase(pipes[:1], [spec], metrics), capacity, rate))
        print(show(r), flush=True)
        if args.split:  # who got what: a quiet connection beside busy ones
            shares = [
                f"{c['in_deadline'] / n:.2%} (rejected {c['rejected'] / n:.1%}, late {c['late'] / n:.1%})"
                for c in result["conns"]
                if (n := max(c["sent"] + c["unsent"], 1))
            ]
            print(f"{'':>6} in deadline by connection: {', '.join(shares)}")
        if r["offered_per_s"] < 0.95 * rate or r["lag_max_ms"] > 50:
            print(
                f"{'':>6} client {'behind' if r['offered_per_s'] < 0.95 * rate else 'stalled'}: offered "
                f"{r['offered_per_s'] / rate:.0%} of {rate:.0f}/s; send lag mean {r['lag_mean_ms']:.1f} ms, "
                f"max {r['lag_max_ms']:.0f} ms"
            )
        if r["unsent"]:
            print(
                f"{'':>6} server not reading: {r['unsent']} arrivals unsent "
                f"({WRITE_CAP // 2**20} MiB already buffered on a connection)"
            )
    if not args.no_fairness:
        time.sleep(args.pause)
        flood = base | {"seconds": args.seconds, "seed": args.seed + 7}
        rate = args.flood * capacity / args.floods
        flooded = targets  # --flood-over socket: the connections of the levels
        if args.flood_over in ("grpc", "http"):
            flooded = [f"{args.flood_over}://127.0.0.1:{base[f'{args.flood_over}_port']}"]
        flood["conns"] = [{"target": flooded[k % len(flooded)], "rate": rate} for k in range(args.floods)]
        polite = flood | {"seed": args.seed + 8, "conns": [{"target": targets[-1], "rate": 0.1 * capacity}]}
        if args.polite in ("http", "grpc"):
            url = f"{args.polite}://127.0.0.1:{base[f'{args.polite}_port']}"
            polite |= {
                "conns": [{"target": url, "rate": 0.1 * capacity}],
                "http": polite["conns"][0] | {"url": url},
            }
        fair = phase(pipes, [flood, polite], metrics)
        names = ["flood"] * args.floods + ["polite"]
        for name, c, spec in zip(names, fair["conns"], flood["conns"] + polite["conns"], strict=True):
            rate, via = spec["rate"], spec["target"].split(":")[0]
            n = c["sent"] + c["unsent"]
            print(
                f"fairness {name:>6} ({via}): offered {n / fair['seconds']:.0f}/s of {rate:.0f}/s, "
                f"in deadline {c['in_deadline']}/{n} = {c['in_deadline'] / max(n, 1):.2%}; "
                f"rejected {c['rejected']}, expired {c['expired']}, late {c['late']}, lost {c['lost']}, "
                f"unsent {c['unsent']}, send lag max {c['lag_max_ms']:.0f} ms{ok_quantiles(c['ok_ms'])}"
            )
        polite_c = fair["conns"][-1]
        share = polite_c["in_deadline"] / max(polite_c["sent"] + polite_c["unsent"], 1)
        offered = (args.flood + 0.1) * capacity
        rows.append(row("fair", fair, capacity, offered) | {"polite_in_deadline": share})
        print(show(rows[-1]))
    return rows


def ok_quantiles(ok_ms: np.ndarray) -> str:
    if not len(ok_ms):
        return ""
    p50, p99 = np.quantile(ok_ms, (0.5, 0.99))
    return f"; ok P50 {p50:.2f} ms, P99 {p99:.2f} ms"


def verdicts(rows: list[dict[str, Any]], grace: float) -> list[str]:
    lost = [f"{r['level']} {r['lost']}" for r in rows if r["lost"]]
    lines = [f"lost (no answer {grace:g} s after the last send): {', '.join(lost) or 'none'}"]
    for r in rows[1:]:
        if r["level"] == "fair":
            share = r["polite_in_deadline"]
            verdict = "PASS" if share >= 0.99 else "FAIL"
            lines.append(f"goal, fairness: the polite connection {share:.2%} in deadline (>= 99%): {verdict}")
        elif r["target_x"] >= 2:
            verdict = "PASS" if r["in_deadline_x"] >= 0.8 else "FAIL"
            lines.append(
                f"goal at {r['level']}: goodput {r['in_deadline_x']:.2f}x capacity (>= 0.8): {verdict}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = args.model or list(DEMO_SLO_MS)
    slos = {m: DEMO_SLO_MS.get(m, args.slo_ms) for m in models}
    missing = [m for m in models if not ModelRepository(args.repository).manifest_path(m).exists()]
    if missing:
        hint = "run `make demo` first" if args.model is None else "export and profile them first"
        print(f"overload: no model {', '.join(missing)} in {args.repository}: {hint}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="edgeserve-overload-"))  # short: UNIX socket paths are limited
    config, sock, log = workdir / "serve.toml", workdir / "edgeserve.sock", workdir / "serve.log"
    tcp, metrics_port, http, grpc = free_ports(4)
    write_config(config, args, slos, sock, [tcp, metrics_port, http, grpc], "all")
    ratios = default_ratios(len(models))
    base: dict[str, Any] = {"models": models, "weights": [r / sum(ratios) for r in ratios]}
    base["live"] = args.decode == "live"
    base["deadlines_ms"] = [args.deadline_ms or slos[m] for m in models]
    base["targets"] = [f"unix://{sock}", f"tcp://127.0.0.1:{tcp}"] * (args.connections // 2)
    base["targets"] += [f"unix://{sock}"] * (args.connections % 2)
    base |= {"metrics": f"http://127.0.0.1:{metrics_port}/metrics", "grace": args.grace}
    base |= {"http_port": http, "grpc_port": grpc}
    print(
        f"overload: server log {log}; deadline_ms {dict(zip(models, base['deadlines_ms'], strict=True))}; "
        f"late_tasks {args.late_tasks or 'serve (default)'}; admission {args.admission} (closed loop: all)"
    )
    ctx = mp.get_context("spawn")
    pipes, ends = zip(*(ctx.Pipe() for _ in range(2)), strict=True)  # the 2nd process: the polite client
    procs = [ctx.Process(target=worker_main, args=(end,), daemon=True) for end in ends]
    server = start_server(config, log)
    try:
        for proc in procs:
            proc.start()
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            pin(server.pid, cpus[:1])
            for proc in procs:
                assert proc.pid is not None
                pin(proc.pid, cpus[1:])

        def admit() -> None:
            """Reload the server with the admission under test (SIGHUP), and wait until it has."""
            write_config(config, args, slos, sock, [tcp, metrics_port, http, grpc], args.admission)
            server.send_signal(signal.SIGHUP)
            give_up = time.monotonic() + 30
            while '"reloaded"' not in log.read_text() and "reloaded" not in log.read_text():
                if time.monotonic() > give_up:
                    raise RuntimeError(f"the server did not reload its config; see {log}")
                time.sleep(0.05)

        rows = sweep(list(pipes), base, args, admit)
    except KeyboardInterrupt:
        rows = []
        print("overload: interrupted", file=sys.stderr)
    finally:
        for pipe, proc in zip(pipes, procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    pipe.send(None)
                proc.join(5)
            if proc.is_alive():
                proc.kill()
        code = stop_server(server)
        print(f"server exited with code {code}")
    if code == 0:  # else keep the log
        shutil.rmtree(workdir, ignore_errors=True)
    if not rows:
        return 130
    print("\n".join(verdicts(rows, args.grace)))
    capacity = rows[0]["capacity_per_s"]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"capacity_per_s": capacity, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        levels = [r for r in rows if r["level"] not in ("closed", "fair")]
        write_plot(levels, args.plot, f"edgeserve under open-loop overload (capacity {capacity:.0f} ok/s)")
        print(f"wrote {args.plot}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Overload as a docs-only client sees it: in-deadline goodput of `edgeserve serve` up to 10x capacity.

A load generator written from docs/protocol.md alone, the way independent checkers write one:
asyncio (uvloop if installed), one asyncio.Protocol per connection, every request encoded with
msgpack.packb and written with its own transport.write (drain never awaited: pause_writing is
counted, the write buffer's high-water mark kept), answers split on the 4-byte big-endian length
prefix and decoded as they arrive with msgpack.Unpacker. benchmarks/overload.py is the project's
leaner generator (frames encoded once, batched writes, decoding deferred); the two bracket what
clients see on the cores they share with the server.
It starts `edgeserve serve` (the digits models of `make demo` at 3:2:1, ONNX Runtime on one thread,
a UNIX socket, a TCP port, /metrics) and measures the capacity C in `ok`/s in a closed loop
(`--inflight` per connection over 2 UNIX + 2 TCP connections, 1 s warm-up, `--capacity-seconds`),
then open-loop Poisson load at each of `--levels` times C for `--seconds`. Every request carries
`deadline_ms` = its model's SLO (5/8/10 ms); "in deadline" = `ok` and back at the client within it,
timed from the client's write. Per level: offered/s, in-deadline/s and as a multiple of C,
rejected/s, expired/s, other statuses, late `ok` answers, lost (unanswered 2 s after the last send),
duplicate or unknown ids, P50/P99 of `ok` answers, client and server CPU (100% = one core). Goal
(informational): in deadline >= 0.8x C at every level. Exits 1 if an answer was lost or duplicated
or the server exited non-zero.

    make demo                                                          # once: digits models in ./engines
    .venv/bin/python benchmarks/overload_docs_client.py                # ~40 s
    .venv/bin/python benchmarks/overload_docs_client.py --reply-margin-ms 1.5 --json out/docs-client.json
    .venv/bin/python benchmarks/overload_docs_client.py --levels 2 10 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import msgpack
import numpy as np
from soak import start_server, stop_server  # benchmarks/soak.py, next to this file

from edgeserve.errors import EdgeServeError
from edgeserve.loop import run
from edgeserve.metrics.process import sample
from edgeserve.net.listeners import free_ports
from edgeserve.repository import ModelRepository
from edgeserve.tools.bench import default_ratios
from edgeserve.tools.demo import DEMO_MODELS, DEMO_SLO_MS

LEN = struct.Struct(">I")
KINDS = ("unix", "tcp", "unix", "tcp")  # the connections, in order
POOL = 64  # random inputs per model; request id `i` sends input `i & 63`
BURST = 32  # open loop: a sender yields to the loop after this many writes
DRAIN_S = 2.0  # wait this long for the last answers
GOAL_X = 0.8


class Answer(NamedTuple):
    status: str
    latency_ms: float  # from the client's write to the answer's arrival
    deadline_ms: float
    late: bool  # the server's own flag
    t: float  # perf_counter at arrival
    server_ms: float  # timings.total_ms


@dataclass(frozen=True)
class Load:
    models: list[str]
    weights: np.ndarray  # the 3:2:1 mix
    deadline_ms: dict[str, float]
    inputs: dict[str, list[dict[str, Any]]]  # POOL tensor maps per model


@dataclass(frozen=True)
class Target:
    unix: Path
    tcp_port: int


@dataclass
class Session:
    """What every phase shares: the server's addresses and pid, the SLOs, one request id counter."""

    target: Target
    pid: int
    slo_ms: dict[str, float]
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))


def frame(message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return LEN.pack(len(body)) + body


def make_load(hello: dict[str, Any], slo_ms: dict[str, float], seed: int = 0) -> Load:
    """Random float32 in [0, 1) of each model's input shape, as the hello reply gives it."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for model in slo_ms:
        spec = hello["models"][model]["input"]
        if spec is None or spec["dtype"] != "float32":
            raise EdgeServeError(f"{model}: expected one float32 input, the hello says {spec}")
        shape = list(spec["shape"])
        data = (rng.random(shape, dtype=np.float32).tobytes() for _ in range(POOL))
        inputs[model] = [{"dtype": "float32", "shape": shape, "data": d} for d in data]
    ratios = np.array(default_ratios(len(slo_ms)))
    return Load(list(slo_ms), ratios / ratios.sum(), dict(slo_ms), inputs)


class Conn(asyncio.Protocol):
    """One connection: sends without awaiting drain, decodes every answer as it arrives."""

    def __init__(self, ids: Iterator[int], loop: asyncio.AbstractEventLoop) -> None:
        self.ids = ids  # shared by all connections
        self.transport: asyncio.Transport  # set by connection_made
        self.buf = bytearray()
        self.unpacker = msgpack.Unpacker(raw=False)
        self.hello: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.pending: dict[int, tuple[float, float]] = {}  # id -> (sent at, deadline_ms)
        self.answered: set[int] = set()
        self.answers: list[Answer] = []
        self.dup = self.unknown = self.pauses = self.max_wbuf = 0
        self.errors: list[tuple[str, Any]] = []
        self.closed = False
        self.on_answer: Callable[[], None] | None = None  # the closed loop's refill
        self.all_done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(frame({"type": "hello", "version": 1, "client": "docs-client"}))

    def pause_writing(self) -> None:
        self.pauses += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        buf = self.buf
        buf += data
        off, n = 0, len(buf)
        while n - off >= 4:
            size = LEN.unpack_from(buf, off)[0]
            if n - off - 4 < size:
                break
            self.unpacker.feed(buf[off + 4 : off + 4 + size])
            off += 4 + size
        if off:
            del buf[:off]
        for msg in self.unpacker:
            kind = msg.get("type")
            if kind == "result":
                self._result(msg, t)
            elif kind == "hello" and not self.hello.done():
                self.hello.set_result(msg)
            else:
                self.errors.append(("frame", msg))

    def _result(self, msg: dict[str, Any], t: float) -> None:
        rid = msg["id"]
        sent = self.pending.pop(rid, None)
        if sent is None:
            if rid in self.answered:
                self.dup += 1
            else:
                self.unknown += 1
            return
        self.answered.add(rid)
        status = msg["status"]
        ts, deadline = sent
        self.answers.append(
            Answer(status, (t - ts) * 1000.0, deadline, msg["late"], t, msg["timings"]["total_ms"])
        )
        if status not in ("ok", "rejected", "expired") and len(self.errors) < 5:
            self.errors.append((status, msg.get("error")))
        if self.on_answer is not None:
            self.on_answer()
        if not self.pending and self.all_done is not None and not self.all_done.done():
            self.all_done.set_result(None)

    def send(self, model: str, load: Load) -> None:
        rid = next(self.ids)
        deadline = load.deadline_ms[model]
        tensor = load.inputs[model][rid & (POOL - 1)]
        data = frame({"type": "infer", "id": rid, "model": model, "deadline_ms": deadline, "tensor": tensor})
        self.pending[rid] = (time.perf_counter(), deadline)
        self.transport.write(data)
        unsent = self.transport.get_write_buffer_size()
        if unsent > self.max_wbuf:
            self.max_wbuf = unsent


async def open_conns(session: Session) -> tuple[list[Conn], Load]:
    loop, target, ids = asyncio.get_running_loop(), session.target, session.ids
    conns, hello = [], {}
    for kind in KINDS:
        if kind == "unix":
            _, conn = await loop.create_unix_connection(lambda: Conn(ids, loop), str(target.unix))
        else:
            _, conn = await loop.create_connection(lambda: Conn(ids, loop), "127.0.0.1", target.tcp_port)
            conn.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = await asyncio.wait_for(conn.hello, 5)
        conns.append(conn)
    return conns, make_load(hello, session.slo_ms)


async def drain(conns: list[Conn]) -> None:
    loop = asyncio.get_running_loop()
    for conn in conns:
        conn.all_done = loop.create_future()
        if not conn.pending:
            conn.all_done.set_result(None)
    await asyncio.wait([c.all_done for c in conns if c.all_done is not None], timeout=DRAIN_S)


def server_cpu_s(pid: int) -> float:
    """The server process's CPU seconds (all threads), from /proc."""
    return sample(pid).cpu_seconds or 0.0


def pct(values: list[float], q: float, digits: int = 2) -> float:
    return round(float(np.percentile(values, q)), digits) if values else float("nan")


async def capacity(session: Session, inflight: int, secs: float, warm_s: float = 1.0) -> dict[str, Any]:
    """Closed loop: `inflight` requests per connection, each answer replaced by a new request."""
    conns, load = await open_conns(session)
    rng = np.random.default_rng(1)
    picks = itertools.cycle(
        [load.models[i] for i in rng.choice(len(load.models), size=100_000, p=load.weights)]
    )
    running = True

    def refill(conn: Conn) -> None:
        if running:
            conn.send(next(picks), load)

    for conn in conns:
        conn.on_answer = functools.partial(refill, conn)
        for _ in range(inflight):
            conn.send(next(picks), load)
    await asyncio.sleep(warm_s)
    cpu0, s0, w0 = time.process_time(), server_cpu_s(session.pid), time.perf_counter()
    await asyncio.sleep(secs)
    cpu1, s1, w1 = time.process_time(), server_cpu_s(session.pid), time.perf_counter()
    running = False
    await drain(conns)
    window = [a for c in conns for a in c.answers if w0 <= a.t < w1]
    ok_ms = [a.latency_ms for a in window if a.status == "ok"]
    in_deadline = sum(a.status == "ok" and a.latency_ms <= a.deadline_ms for a in window)
    for conn in conns:
        conn.transport.close()
    return {
        "C_ok_per_s": round(len(ok_ms) / (w1 - w0), 1),
        "in_deadline_per_s": round(in_deadline / (w1 - w0), 1),
        "statuses": dict(Counter(a.status for a in window)),
        "p50_ms": pct(ok_ms, 50, 3),
        "p99_ms": pct(ok_ms, 99, 3),
        "lost": sum(len(c.pending) for c in conns),
        "dup": sum(c.dup + c.unknown for c in conns),
        "client_cpu_pct": round(100 * (cpu1 - cpu0) / (w1 - w0), 1),
        "server_cpu_pct": round(100 * (s1 - s0) / (w1 - w0), 1),
        "errors": [e for c in conns for e in c.errors][:5],
    }


def schedules(
    load: Load, n_conns: int, rate: float, secs: float, seed: int
) -> list[tuple[list[float], list[str]]]:
    """Per connection: Poisson send times in [0, secs) at rate / n_conns, and a model for each."""
    per, rng, out = rate / n_conns, np.random.default_rng(seed), []
    for _ in range(n_conns):
        t = np.cumsum(rng.exponential(1.0 / per, int(per * secs * 1.3) + 100))
        t = t[t < secs]
        out.append(
            (t.tolist(), [load.models[i] for i in rng.choice(len(load.models), size=len(t), p=load.weights)])
        )
    return out


async def send_on_schedule(
    conn: Conn, load: Load, times: list[float], models: list[str], t0: float, secs: float
) -> tuple[int, float]:
    """Writes each request once its time has come, whatever the answers; returns (sent, max lag s)."""
    i, lag, n = 0, 0.0, len(times)
    if n and times[0] > time.perf_counter() - t0:
        await asyncio.sleep(times[0] - (time.perf_counter() - t0))
    while i < n:
        now = time.perf_counter() - t0
        if now >= secs:
            break
        burst = 0
        while i < n and times[i] <= now and burst < BURST:
            conn.send(models[i], load)
            i += 1
            burst += 1
        if i < n:
            lag = max(lag, now - times[i - 1]) if i else lag
            await asyncio.sleep(max(times[i] - (time.perf_counter() - t0), 0))
    return i, lag


async def open_loop(session: Session, level: float, rate: float, secs: float, seed: int) -> dict[str, Any]:
    conns, load = await open_conns(session)
    scheds = schedules(load, len(conns), rate, secs, seed)
    t0 = time.perf_counter() + 0.05
    cpu0, s0 = time.process_time(), server_cpu_s(session.pid)
    sent_lag = await asyncio.gather(
        *(send_on_schedule(c, load, *s, t0, secs) for c, s in zip(conns, scheds, strict=True))
    )
    wall, cpu, srv = time.perf_counter() - t0, time.process_time() - cpu0, server_cpu_s(session.pid) - s0
    await drain(conns)
    await asyncio.sleep(0.05)  # catch duplicates that might trail
    answers = [a for c in conns for a in c.answers]
    row = summarize(answers, sum(s for s, _ in sent_lag), secs)
    row = {
        "level": f"{level:g}x",
        **row,
        "dup": sum(c.dup for c in conns),
        "unknown_id": sum(c.unknown for c in conns),
        "client_cpu_pct": round(100 * cpu / wall, 1),
        "server_cpu_pct": round(100 * srv / wall, 1),
        "scheduled": sum(len(t) for t, _ in scheds),
        "target_per_s": round(rate, 1),
        "max_sched_lag_ms": round(1000 * max(lag for _, lag in sent_lag), 1),
        "pause_writing": sum(c.pauses for c in conns),
        "max_write_buf": max(c.max_wbuf for c in conns),
        "closed_by_server": sum(c.closed for c in conns),
        "errors": [e for c in conns for e in c.errors][:5],
    }
    for conn in conns:
        conn.transport.close()
    return row


def summarize(answers: list[Answer], sent: int, secs: float) -> dict[str, Any]:
    statuses = Counter(a.status for a in answers)
    ok = [a for a in answers if a.status == "ok"]
    ok_ms = [a.latency_ms for a in ok]
    late = [a for a in ok if a.latency_ms > a.deadline_ms]
    gap_ms = [a.latency_ms - a.server_ms for a in ok]  # transport and client: client latency - server total
    return {
        "sent": sent,
        "offered_per_s": round(sent / secs, 1),
        "answered": len(answers),
        "lost": sent - len(answers),
        "in_deadline_per_s": round((len(ok) - len(late)) / secs, 1),
        "ok_per_s": round(len(ok) / secs, 1),
        "rejected_per_s": round(statuses["rejected"] / secs, 1),
        "expired_per_s": round(statuses["expired"] / secs, 1),
        "other": {k: v for k, v in statuses.items() if k not in ("ok", "rejected", "expired")},
        "late_ok": len(late),
        "server_late_flag": sum(a.late for a in ok),
        "late_ok_server_in_time": sum(a.server_ms <= a.deadline_ms for a in late),
        "p50_ms": pct(ok_ms, 50),
        "p99_ms": pct(ok_ms, 99),
        "gap_p50_ms": pct(gap_ms, 50),
        "gap_p99_ms": pct(gap_ms, 99),
        # Per deadline (ms): the late `ok` answers, by how much they missed, how much of the deadline
        # the server had left when it answered them, and their way outside the server (P50/P90).
        "late_by_deadline": {
            str(d): {
                "ok": sum(a.deadline_ms == d for a in ok),
                "late": len(ls),
                "late_by_p50": pct([a.latency_ms - d for a in ls], 50),
                "late_by_p90": pct([a.latency_ms - d for a in ls], 90),
                "slack_p50": pct([d - a.server_ms for a in ls], 50),
                "gap_p50": pct([a.latency_ms - a.server_ms for a in ls], 50),
                "gap_p90": pct([a.latency_ms - a.server_ms for a in ls], 90),
            }
            for d in sorted({a.deadline_ms for a in ok})
            for ls in [[a for a in late if a.deadline_ms == d]]
        },
    }


async def measure(args: argparse.Namespace, session: Session) -> dict[str, Any]:
    cap = await capacity(session, args.inflight, args.capacity_seconds)
    c = cap["C_ok_per_s"]
    print(
        f"capacity C = {c} ok/s: in deadline {cap['in_deadline_per_s']}/s, P50/P99 {cap['p50_ms']}/"
        f"{cap['p99_ms']} ms, client/server CPU {cap['client_cpu_pct']}/{cap['server_cpu_pct']}%",
        flush=True,
    )
    rows = []
    for k, level in enumerate(args.levels):
        await asyncio.sleep(0.5)
        row = await open_loop(session, level, level * c, args.seconds, seed=100 + k)
        row["x_of_C"] = round(row["in_deadline_per_s"] / c, 3) if c else float("nan")
        rows.append(row)
        print(f"{row['level']}: offered {row['offered_per_s']}/s, in deadline {row['x_of_C']}x C", flush=True)
    return {"capacity": cap, "rows": rows}


def cells(r: dict[str, Any]) -> dict[str, Any]:
    """A level's row as the table shows it."""
    return {
        "level": r["level"],
        "sent/s": r["offered_per_s"],
        "in-dl/s": r["in_deadline_per_s"],
        "xC": r["x_of_C"],
        "rej/s": r["rejected_per_s"],
        "exp/s": r["expired_per_s"],
        "other": r["other"] or "-",
        "late_ok": r["late_ok"],
        "lost": r["lost"],
        "dup": r["dup"] + r["unknown_id"],
        "p50": r["p50_ms"],
        "p99": r["p99_ms"],
        "cliCPU%": r["client_cpu_pct"],
        "srvCPU%": r["server_cpu_pct"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    shown = [cells(r) for r in rows]
    lines = ["| " + " | ".join(shown[0]) + " |", "|" + "---|" * len(shown[0])]
    lines += ["| " + " | ".join(map(str, r.values())) + " |" for r in shown]
    return "\n".join(lines)


def write_config(
    path: Path, args: argparse.Namespace, target: Target, metrics_port: int, slo_ms: dict[str, float]
) -> None:
    lines = [f"repository = {json.dumps(str(args.repository.resolve()))}", "shutdown_timeout_s = 5.0"]
    lines += ["[backend]", 'name = "onnxruntime"', "threads = 1"]
    lines += ["[listen]", f"unix = {json.dumps(str(target.unix))}", f'tcp = "127.0.0.1:{target.tcp_port}"']
    lines += [f"reply_margin_ms = {args.reply_margin_ms}"] if args.reply_margin_ms is not None else []
    lines += ["[metrics]", f'listen = "127.0.0.1:{metrics_port}"']
    for model, slo in slo_ms.items():
        lines += [f"[models.{json.dumps(model)}]", f"slo_ms = {slo}"]
    path.write_text("\n".join(lines) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repository", type=Path, default=Path("engines"), help="the digits models (default engines)"
    )
    parser.add_argument(
        "--levels",
        type=float,
        nargs="+",
        default=[2, 5, 10],
        metavar="X",
        help="open-loop rates as multiples of the capacity C (default 2 5 10)",
    )
    parser.add_argument("--seconds", type=float, default=6.0, metavar="S", help="per level (default 6)")
    parser.add_argument(
        "--capacity-seconds",
        type=float,
        default=4.0,
        metavar="S",
        help="closed loop, after 1 s warm-up (default 4)",
    )
    parser.add_argument(
        "--inflight",
        type=int,
        default=4,
        metavar="N",
        help="closed loop: requests in flight per connection (default 4)",
    )
    parser.add_argument(
        "--reply-margin-ms",
        type=float,
        metavar="MS",
        help="written into [listen] reply_margin_ms of the generated config (default: the server's)",
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the capacity and the rows to OUT")
    args = parser.parse_args(argv)
    bounded = 0 < args.seconds <= 600 and 0 < args.capacity_seconds <= 600 and 1 <= args.inflight <= 4096
    bounded &= len(args.levels) <= 20 and all(0 < level <= 100 for level in args.levels)
    if not bounded or (args.reply_margin_ms or 0) < 0:
        parser.error(
            "bounds: --seconds/--capacity-seconds (0, 600], --inflight 1..4096, at most 20 --levels "
            "in (0, 100], --reply-margin-ms >= 0"
        )
    return args


def report(result: dict[str, Any], args: argparse.Namespace, code: int) -> int:
    cap, rows = result["capacity"], result["rows"]
    print(f"C = {cap['C_ok_per_s']} ok/s (closed loop, {args.inflight} in flight x {len(KINDS)} conns)")
    print(table(rows))
    for row in rows:
        verdict = "PASS" if row["x_of_C"] >= GOAL_X else "FAIL"
        print(f"goal at {row['level']}: in deadline {row['x_of_C']:.2f}x of C (>= {GOAL_X}x): {verdict}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**result, "server_exit": code}, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    broken = cap["lost"] + cap["dup"] + sum(r["lost"] + r["dup"] + r["unknown_id"] for r in rows)
    if broken:
        print(f"FAIL: {broken} answers lost, duplicated or with unknown ids", file=sys.stderr)
    return 0 if code == 0 and not broken else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    slo_ms = {m: DEMO_SLO_MS[m] for m in DEMO_MODELS}
    if any(not ModelRepository(args.repository).manifest_path(m).exists() for m in slo_ms):
        print(
            f"overload_docs_client: no digits models in {args.repository}: run `make demo`", file=sys.stderr
        )
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="edgeserve-docs-client-"))  # short: UNIX socket paths are limited
    config, log = workdir / "serve.toml", workdir / "serve.log"
    tcp_port, metrics_port = free_ports(2)
    target = Target(workdir / "edgeserve.sock", tcp_port)
    write_config(config, args, target, metrics_port, slo_ms)
    try:
        server = start_server(config, log)
    except EdgeServeError as exc:
        print(f"{exc}\n{log.read_text()[-2000:]}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
        return 1
    result = None
    try:
        result = run(measure(args, Session(target, server.pid, slo_ms)))
    except KeyboardInterrupt:
        print("overload_docs_client: interrupted", file=sys.stderr)
    finally:
        t0 = time.monotonic()
        code = stop_server(server)
        print(f"server exited with code {code} in {time.monotonic() - t0:.2f} s")
        if code != 0:
            print(log.read_text()[-2000:], file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    return 130 if result is None else report(result, args, code)


if __name__ == "__main__":
    sys.exit(main())

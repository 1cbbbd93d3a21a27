"""The event loop's CPU time per request, served and refused: the number that decides overload.

Under overload the loop thread is the bottleneck (docs/runtime.md, "The path under overload"): a
request it serves costs S of its time, one it refuses R, and at k times capacity the goodput is
about (1 - k C R) / (S - R). This benchmark measures S and R directly, as CPU time of the server's
loop thread (from /proc, so a busy machine changes them little, unlike wall-clock rates):

- served: closed loop, `--window` requests in flight on each of `--connections` UNIX connections;
- refused: the server allows 1 request in flight per connection and the client sends bursts of
  `--burst` frames, so nearly every frame is refused `rejected` (window full) from its id; frames
  alike but for their id and tensor, which the server learns the shape of and refuses a block at
  a time (net/frame_shape.py); with `--varying`, frames whose structure changes (an int
  `deadline_ms` that differs from frame to frame), which it must refuse one by one.

It starts `edgeserve serve` on the digits models of `make demo` (ONNX Runtime, 1 thread) and
prints microseconds of loop CPU per request and per refusal, and the executor thread's CPU per
served request. Linux only (/proc).

    .venv/bin/python benchmarks/loop_cost.py                      # ~20 s
    .venv/bin/python benchmarks/loop_cost.py --model digits-s --seconds 10
    .venv/bin/python benchmarks/loop_cost.py --varying              # refusals with no shape
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
from soak import start_server, stop_server  # benchmarks/soak.py, next to this file

from edgeserve.repository import ModelRepository
from edgeserve.wire.frames import HEADER, encode_frame
from edgeserve.wire.tensors import encode_tensor

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of `pid`, by thread name (the main thread as "main")."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
        name = "main" if int(tid) == pid else stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


class Client:
    """A blocking UNIX-socket client writing pre-encoded frames and counting answers by status."""

    def __init__(
        self, path: str, model: str, shape: list[int], deadline_ms: float, varying: bool = False
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.sendall(encode_frame({"type": "hello", "version": 1, "client": "loop_cost.py"}))
        self.buf = b""
        self.next_messages(1)  # the hello reply
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        fields = {"type": "infer", "model": model, "tensor": encode_tensor(x), "deadline_ms": deadline_ms}
        body = msgpack.packb(fields)  # "id" goes last, as a 4-byte uint32 (a fixed frame length)
        body = bytes([body[0] + 1]) + body[1:] + msgpack.packb("id") + b"\xce"
        self.head, self.pack_id, self.sent = HEADER.pack(len(body) + 4) + body, struct.Struct(">I").pack, 0
        self.fields = fields if varying else None
        self.status: dict[str, int] = {}

    def send(self, n: int) -> None:
        if self.fields is None:
            self.sock.sendall(b"".join(self.head + self.pack_id(self.sent + k) for k in range(n)))
        else:  # an int deadline_ms that changes: the frames' structure differs from one to the next
            ids = range(self.sent, self.sent + n)
            self.sock.sendall(
                b"".join(encode_frame({**self.fields, "deadline_ms": 900 + k % 50, "id": k}) for k in ids)
            )
        self.sent += n

    def next_messages(self, n: int, more: bool = False) -> list[dict[str, object]]:
        """At least `n` messages (`more`: and every complete one already received)."""
        out: list[dict[str, object]] = []
        while len(out) < n or (more and len(self.buf) >= 4):
            while len(self.buf) >= 4 and len(self.buf) - 4 >= (size := HEADER.unpack_from(self.buf)[0]):
                out.append(msgpack.unpackb(self.buf[4 : 4 + size]))
                self.buf = self.buf[4 + size :]
            if len(out) < n:
                self.buf += self.sock.recv(1 << 20)
            elif more:
                break
        for message in out:
            if message.get("type") == "result":
                status = str(message["status"])
                self.status[status] = self.status.get(status, 0) + 1
        return out

    def answered(self) -> int:
        return sum(self.status.values())


def write_config(path: Path, sock: Path, repository: Path, max_in_flight: int) -> None:
    models = "\n".join(f'[models."{m}"]\nslo_ms = 1000\n' for m in ModelRepository(repository).models())
    path.write_text(
        f'repository = "{repository.resolve()}"\n[backend]\nname = "onnxruntime"\nthreads = 1\n'
        f'[listen]\nunix = "{sock}"\nmax_in_flight = {max_in_flight}\n{models}'
    )


def measure(args: argparse.Namespace, tmp: Path, refused: bool) -> dict[str, float]:
    sock = tmp / ("refused.sock" if refused else "served.sock")
    config = tmp / ("refused.toml" if refused else "served.toml")
    write_config(config, sock, args.repository, 1 if refused else 4096)
    server = start_server(config, tmp / "serve.log")
    try:
        spec = ModelRepository(args.repository).load_manifest(args.model).input
        clients = [
            Client(str(sock), args.model, list(spec.shape), 1000.0, varying=refused and args.varying)
            for _ in range(args.connections)
        ]
        window = args.burst if refused else args.window
        for c in clients:  # warm up
            c.send(window)
            c.next_messages(window)
        cpu0, t0 = thread_cpu(server.pid), time.monotonic()
        n0 = sum(c.answered() for c in clients)
        for c in clients:
            c.send(window)
        while time.monotonic() - t0 < args.seconds:
            for c in clients:
                c.send(len(c.next_messages(window if refused else 1, more=True)))
        for c in clients:
            c.next_messages(c.sent - c.answered())
        cpu1, seconds = thread_cpu(server.pid), time.monotonic() - t0
        n = sum(c.answered() for c in clients) - n0
        status: dict[str, int] = {}
        for c in clients:
            for k, v in c.status.items():
                status[k] = status.get(k, 0) + v
    finally:
        stop_server(server)
    others = sum(v for k, v in cpu1.items() if k != "main") - sum(v for k, v in cpu0.items() if k != "main")
    return {
        "requests": n,
        "per_s": n / seconds,
        "loop_us": 1e6 * (cpu1["main"] - cpu0["main"]) / n,
        "executor_us": 1e6 * others / n,  # the executor thread, mostly (ONNX Runtime runs on it)
        "rejected_share": status.get("rejected", 0) / max(sum(status.values()), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--model", default="digits-m")
    parser.add_argument("--seconds", type=float, default=6.0, help="per scenario (default 6)")
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--window", type=int, default=32, help="served: in flight per connection")
    parser.add_argument("--burst", type=int, default=512, help="refused: frames per burst")
    parser.add_argument(
        "--varying", action="store_true", help="refused: frames whose structure changes (no shape holds)"
    )
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        parser.error("needs Linux (/proc)")
    with tempfile.TemporaryDirectory(prefix="edgeserve-loopcost-") as tmp:
        served = measure(args, Path(tmp), refused=False)
        refused = measure(args, Path(tmp), refused=True)
    kind = "frames of changing structure" if args.varying else "frames alike but for id and tensor"
    print(
        f"model {args.model}, {args.connections} UNIX connections, refused: {kind}; "
        "loop = the server's event-loop thread"
    )
    print(
        f"served : {served['per_s']:8.0f} req/s  loop {served['loop_us']:6.1f} us/request  "
        f"executor {served['executor_us']:6.1f} us/request"
    )
    print(
        f"refused: {refused['per_s']:8.0f} req/s  loop {refused['loop_us']:6.1f} us/frame   "
        f"({100 * refused['rejected_share']:.1f}% answered rejected)"
    )
    ratio = refused["loop_us"] / served["loop_us"]
    print(f"R/S = {ratio:.3f}: goodput can hold 0.8x capacity up to {0.8 + 0.2 / ratio:.1f}x offered load")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

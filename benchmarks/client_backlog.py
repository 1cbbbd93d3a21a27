"""The project's AsyncClient under open-loop overload: does it send work its callers gave up on?

Each arrival (Poisson, `--load` x the capacity measured first in a closed loop) is one caller that
waits for its answer at most its deadline (`asyncio.wait_for(client.infer(...), deadline)`, the
model's SLO unless `--deadline-ms`) and then gives up. Past the capacity the server's window fills
and requests wait in the client. Two clients on the same trace, one after the other:

  withdraws   AsyncClient as it is: a request whose caller gave up while it waited in the client is
              withdrawn before it is written; at most `max_backlog` wait (past it: `rejected` at once)
  sends-all   the client before (issue 65): every request is written in turn, given up or not, and
              nothing bounds the backlog, so a fresh request waits behind the dead ones

Printed per client: in-deadline answers per second (ok and back at the caller within its
deadline), what was written to the server, what was withdrawn or refused in the client, the
largest backlog seen and the P95 of the in-deadline answers. The server is `edgeserve serve` on
the digits models of `make demo` (ONNX Runtime, 1 thread), as in benchmarks/overload.py, with a
window of `--window` per connection (`share_total = false`), so that the overload waits in the client.

    .venv/bin/python benchmarks/client_backlog.py                 # ~30 s
    .venv/bin/python benchmarks/client_backlog.py --load 3 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import numpy as np
from soak import start_server, stop_server  # benchmarks/soak.py, next to this file

from edgeserve.loop import run
from edgeserve.repository import ModelRepository
from edgeserve.wire.client import AsyncClient


class SendsAll(AsyncClient):
    """The client before: writes every held request in turn, its caller waiting or not."""

    def _withdraw(self, request_id: int) -> None:
        pass

    def _flush(self, unlimited: bool = False) -> None:
        while self._held and (unlimited or self._on_wire < self._limit):
            self._write(*self._held.popitem(last=False))


async def capacity(url: str, model: str, x: np.ndarray, seconds: float) -> float:
    """ok answers per second with a few requests always in flight (a closed loop)."""
    client = await AsyncClient.connect(url)
    ok, stop = 0, time.monotonic() + seconds

    async def worker() -> None:
        nonlocal ok
        while time.monotonic() < stop:
            ok += (await client.infer(model, x)).ok

    try:
        await asyncio.gather(*(worker() for _ in range(8)))
    finally:
        await client.close()
    return ok / seconds


async def drive(
    url: str, model: str, x: np.ndarray, rate: float, seconds: float, deadline_s: float, old: bool
):
    kind = SendsAll if old else AsyncClient
    client = await kind.connect(url, max_backlog=None if old else 4096)
    draw = random.Random(0)
    good: list[float] = []
    statuses: dict[str, int] = {}
    biggest = 0

    async def caller() -> None:
        nonlocal biggest
        start = time.monotonic()
        biggest = max(biggest, client.backlog + 1)
        try:
            reply = await asyncio.wait_for(client.infer(model, x), deadline_s)
        except asyncio.TimeoutError:
            statuses["gave up"] = statuses.get("gave up", 0) + 1
            return
        took = time.monotonic() - start
        statuses[reply.status] = statuses.get(reply.status, 0) + 1
        if reply.ok and took <= deadline_s:
            good.append(took * 1000.0)

    callers = []
    due = time.monotonic()
    end = due + seconds
    written = 0
    write = client._write

    def counted(request_id: int, frame: bytes) -> None:
        nonlocal written
        written += 1
        write(request_id, frame)

    client._write = counted  # type: ignore[method-assign]
    try:
        while due < end:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            callers.append(asyncio.ensure_future(caller()))
            due += draw.expovariate(rate)
        await asyncio.gather(*callers)
        await asyncio.sleep(min(2.0, 20 * deadline_s))  # let the written ones come back
    finally:
        await client.close()
    return {
        "sent": len(callers),
        "in_deadline_per_s": len(good) / seconds,
        "p95_ms": float(np.percentile(good, 95)) if good else float("nan"),
        "written": written,
        "withdrawn": client.withdrawn,
        "refused_in_client": client.backlog_full,
        "largest_backlog": biggest,
        "statuses": statuses,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--model", default="digits-m")
    parser.add_argument("--slo-ms", type=float, default=10.0)
    parser.add_argument("--deadline-ms", type=float, default=None, help="the callers' (default: the SLO)")
    parser.add_argument("--load", type=float, default=2.0, help="offered x the measured capacity")
    parser.add_argument("--seconds", type=float, default=5.0, help="of arrivals per client (default 5)")
    parser.add_argument("--capacity-seconds", type=float, default=3.0)
    parser.add_argument(
        "--window", type=int, default=4, help="the server's max_in_flight per connection (default 4)"
    )
    args = parser.parse_args(argv)
    if args.model not in ModelRepository(args.repository).models():
        parser.error(f"no model {args.model} in {args.repository}: run `make demo` first")
    deadline_s = (args.deadline_ms or args.slo_ms) / 1000.0
    with tempfile.TemporaryDirectory(prefix="edgeserve-backlog-") as tmp:
        sock, config = Path(tmp) / "s.sock", Path(tmp) / "serve.toml"
        config.write_text(
            f'repository = "{args.repository.resolve()}"\n[backend]\nname = "onnxruntime"\nthreads = 1\n'
            f'[listen]\nunix = "{sock}"\nmax_in_flight = {args.window}\nshare_total = false\n'
            f'[models."{args.model}"]\nslo_ms = {args.slo_ms}\n'
        )
        server = start_server(config, Path(tmp) / "serve.log")
        try:
            url = f"unix://{sock}"

            async def sample() -> np.ndarray:
                client = await AsyncClient.connect(url)
                spec = client.models[args.model]["input"]
                await client.close()
                return np.random.default_rng(0).random(spec["shape"]).astype(spec["dtype"])

            x = run(sample())
            cap = run(capacity(url, args.model, x, args.capacity_seconds))
            rate = args.load * cap
            rows = {
                name: run(drive(url, args.model, x, rate, args.seconds, deadline_s, old))
                for name, old in (("withdraws", False), ("sends-all", True))
            }
        finally:
            stop_server(server)
    print(
        f"{args.model}: capacity {cap:.0f} ok/s (closed loop); offered {rate:.0f}/s ({args.load:g}x) "
        f"for {args.seconds:g} s, callers give up after {deadline_s * 1000:g} ms"
    )
    print(
        f"{'client':<10} {'in-dl/s':>8} {'P95 ms':>7} {'sent':>7} {'written':>8} {'withdrawn':>9} "
        f"{'refused':>8} {'backlog':>8}  statuses"
    )
    for name, r in rows.items():
        print(
            f"{name:<10} {r['in_deadline_per_s']:8.0f} {r['p95_ms']:7.2f} {r['sent']:7d} {r['written']:8d} "
            f"{r['withdrawn']:9d} {r['refused_in_client']:8d} {r['largest_backlog']:8d}  {r['statuses']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

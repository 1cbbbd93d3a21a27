"""What the project's own client gets from the server's default windows: `ok` answers per second
for one or a few `AsyncClient` connections, each with many requests pending (`asyncio.gather`).

The server keeps its defaults (`[listen] max_in_flight = 8`, a total of 4 windows shared among
the clients sending, `share_total = true`): one connection alone may fill the total, and the
client's window grows toward the hello's `max_in_flight_total` (wire/client.py). `--fixed`
keeps the client to the hello's `max_in_flight`, as it did before: the baseline of the same run.
Rounds alternate the two, so machine noise hits them alike.

It starts `edgeserve serve` on the digits models of `make demo` (ONNX Runtime, 1 thread, SLO
`--slo-ms`) and prints, per layout (connections x pending), the ok/s of each client mode, the
ratio, the other statuses and the windows the clients ended with.

    .venv/bin/python benchmarks/client_window.py                     # ~1 minute
    .venv/bin/python benchmarks/client_window.py --layouts 1x32 4x16 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from soak import start_server, stop_server  # benchmarks/soak.py, next to this file

from edgeserve.loop import run
from edgeserve.net import AsyncClient
from edgeserve.repository import ModelRepository


async def drive(url: str, model: str, connections: int, pending: int, seconds: float, fixed: bool) -> dict:
    clients = [await AsyncClient.connect(url) for _ in range(connections)]
    if fixed:  # the client before: never past the hello's max_in_flight
        for client in clients:
            client.hello = {k: v for k, v in client.hello.items() if k != "max_in_flight_total"}
    spec = clients[0].models[model]["input"]
    x = np.random.default_rng(0).random(spec["shape"]).astype(spec["dtype"])
    statuses: dict[str, int] = {}
    stop = time.monotonic() + seconds

    async def worker(client: AsyncClient) -> None:
        while time.monotonic() < stop:
            reply = await client.infer(model, x)
            statuses[reply.status] = statuses.get(reply.status, 0) + 1

    try:
        await asyncio.gather(*(worker(c) for c in clients for _ in range(pending)))
        windows = [c._limit for c in clients]
    finally:
        for client in clients:
            await client.close()
    return {"statuses": statuses, "seconds": seconds, "windows": windows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--model", default="digits-m")
    parser.add_argument("--slo-ms", type=float, default=8.0)
    parser.add_argument("--seconds", type=float, default=5.0, help="per layout and mode (default 5)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--layouts", nargs="+", default=["1x32", "2x32", "4x16"], help="CONNECTIONSxPENDING, each"
    )
    args = parser.parse_args(argv)
    layouts = [tuple(int(n) for n in layout.split("x")) for layout in args.layouts]
    models = "\n".join(
        f'[models."{m}"]\nslo_ms = {args.slo_ms}\n' for m in ModelRepository(args.repository).models()
    )
    with tempfile.TemporaryDirectory(prefix="edgeserve-window-") as tmp:
        sock, config = Path(tmp) / "s.sock", Path(tmp) / "serve.toml"
        config.write_text(
            f'repository = "{args.repository.resolve()}"\n[backend]\nname = "onnxruntime"\nthreads = 1\n'
            f'[listen]\nunix = "{sock}"\n{models}'
        )
        server = start_server(config, Path(tmp) / "serve.log")
        try:
            rows: dict[tuple[int, int], dict[bool, list[dict]]] = {
                layout: {True: [], False: []} for layout in layouts
            }
            for _ in range(args.rounds):
                for layout in layouts:
                    for fixed in (True, False):
                        result = run(drive(f"unix://{sock}", args.model, *layout, args.seconds, fixed))
                        rows[layout][fixed].append(result)
        finally:
            stop_server(server)
    print(f"{args.model}, SLO {args.slo_ms:g} ms, the server's default windows; ok answers per second:")
    print(f"{'layout':>8} {'fixed':>8} {'growing':>8} {'ratio':>6}  other statuses, windows (growing)")
    for (connections, pending), modes in rows.items():
        ok = {fixed: [r["statuses"].get("ok", 0) / r["seconds"] for r in modes[fixed]] for fixed in modes}
        others: dict[str, int] = {}
        for r in modes[False]:
            for status, n in r["statuses"].items():
                if status != "ok":
                    others[status] = others.get(status, 0) + n
        fixed_ok, growing_ok = float(np.mean(ok[True])), float(np.mean(ok[False]))
        print(
            f"{connections:>3}x{pending:<4} {fixed_ok:8.0f} {growing_ok:8.0f} {growing_ok / fixed_ok:6.2f}  "
            f"{others or '-'!s:<24} {modes[False][-1]['windows']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

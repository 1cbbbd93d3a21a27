"""What each front adds: the UNIX and TCP socket paths, the Open Inference Protocol over HTTP
(binary and JSON tensors) and over gRPC (tritonclient.grpc.aio, raw tensors) against calling the
embedding API directly, and against the physical limit: the same model's ONNX Runtime sessions
alone in a loop at batch 1 (`session`, the final exit, no server at all).

The socket and HTTP clients run in a second process with its own event loop, as a camera or an
application would (`--same-process`: on the server's own loop, as before, which charges the
client's encode/decode to the server's loop and GIL). Rounds interleave the paths so machine noise
hits them alike. Two measurements per path:

- latency: one request at a time (batch 1), p50/p99 in microseconds; "added" is the difference
  from the direct path's percentile;
- throughput: `--concurrency` requests kept in flight for `--seconds`, requests/s (the server
  batches, so the served paths may pass the session alone at batch 1).

The last lines print each path's throughput as a ratio of `session` and of `direct`, and each HTTP
path's against `http-stack-*`: an aiohttp app on the server's loop that reads the same request and
answers the bytes the real front answered once, with no decoding and no model (the HTTP stack's own
ceiling, client included).

Needs a profiled repository (`make demo` makes `engines/` with the digits models):

    .venv/bin/python benchmarks/socket_overhead.py                       # digits-s, ~30 s
    .venv/bin/python benchmarks/socket_overhead.py --model digits-l --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tritonclient.grpc.aio as grpc_aio
from aiohttp import web
from tritonclient.utils import InferenceServerException

from edgeserve.loop import new_event_loop, run
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeserve.service.process import NetServer
from edgeserve.wire.client import AsyncClient
from edgeserve.wire.oip_client import OipClient
from edgeserve.wire.oip_codec import InferRequest, Tensor, datatype_of, encode_request

Call = Callable[[np.ndarray], Awaitable[str]]


async def latencies(call: Call, xs: np.ndarray, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        status = await call(xs[i % len(xs)])
        out.append((time.perf_counter() - t0) * 1e6)
        assert status == "ok", status
    return out


async def throughput(call: Call, xs: np.ndarray, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < stop:
            status = await call(xs[i % len(xs)])
            assert status == "ok", status
            done += 1
            i += concurrency

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return done / (time.perf_counter() - t0)


def client_calls(
    unix: AsyncClient,
    tcp: AsyncClient,
    oip: OipClient,
    stack: OipClient,
    grpc: grpc_aio.InferenceServerClient,
    model: str,
) -> dict[str, Call]:
    """The served paths as the project's own clients call them."""

    def over(client: AsyncClient) -> Call:
        async def call(x: np.ndarray) -> str:
            return (await client.infer(model, x)).status

        return call

    def over_http(client: OipClient, binary: bool) -> Call:
        async def call(x: np.ndarray) -> str:
            reply = await client.infer(model, {"x": x[None]}, binary=binary)
            return "ok" if reply.status == 200 else str(reply.status)

        return call

    def over_grpc(client: grpc_aio.InferenceServerClient) -> Call:
        async def call(x: np.ndarray) -> str:
            tensor = grpc_aio.InferInput("x", [1, *x.shape], datatype_of(x))
            tensor.set_data_from_numpy(x[None])
            try:
                await client.infer(model, [tensor])
            except InferenceServerException as exc:
                return str(exc.status())
            return "ok"

        return call

    return {
        "unix": over(unix),
        "tcp": over(tcp),
        "http-bin": over_http(oip, True),
        "http-json": over_http(oip, False),
        "http-stack-bin": over_http(stack, True),
        "http-stack-json": over_http(stack, False),
        "grpc": over_grpc(grpc),
    }


async def stack_ceiling(url: str, model: str, x: np.ndarray) -> web.AppRunner:
    """An aiohttp app that answers an infer as the real front at `url` answered it once, with no work.

    It reads the whole request, as the front must, and writes the recorded bytes: what is left is the
    HTTP stack itself (aiohttp's server and client, on the same loops and sockets as the front).
    """
    recorded: dict[str, tuple[bytes, dict[str, str]]] = {}
    async with aiohttp.ClientSession() as session:
        for binary in (True, False):
            parameters = {"binary_data_output": True} if binary else {}
            body, headers = encode_request(
                InferRequest([Tensor("x", x[None])], [], None, parameters), binary=binary
            )
            async with session.post(f"{url}/v2/models/{model}/infer", data=body, headers=headers) as resp:
                assert resp.status == 200, resp.status
                kept = {
                    k: v
                    for k, v in resp.headers.items()
                    if k.lower() in ("content-type", "inference-header-content-length")
                }
                recorded[headers["Content-Type"]] = (await resp.read(), kept)

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        body, headers = recorded[request.headers["Content-Type"]]
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_post("/v2/models/{name}/infer", infer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def runner_url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


async def _client(pipe: Connection, urls: list[str], model: str, xs: np.ndarray, concurrency: int) -> None:
    unix, tcp = await AsyncClient.connect(urls[0]), await AsyncClient.connect(urls[1])
    oip = OipClient(urls[2], max_connections=concurrency)
    stack = OipClient(urls[3], max_connections=concurrency)
    grpc = grpc_aio.InferenceServerClient(urls[4])
    calls = client_calls(unix, tcp, oip, stack, grpc, model)
    pipe.send("ready")
    while (command := pipe.recv()) is not None:  # blocking: nothing else runs here meanwhile
        kind, name, amount = command
        if kind == "latencies":
            pipe.send(await latencies(calls[name], xs, amount))
        else:
            pipe.send(await throughput(calls[name], xs, concurrency, amount))
    await unix.close()
    await tcp.close()
    await oip.close()
    await stack.close()
    await grpc.close()


def client_main(pipe: Connection, urls: list[str], model: str, xs: np.ndarray, concurrency: int) -> None:
    """The client process: measures what the server process asks for, one command at a time."""
    loop = new_event_loop()
    try:
        loop.run_until_complete(_client(pipe, urls, model, xs, concurrency))
    finally:
        loop.close()


async def main(args: argparse.Namespace) -> None:
    sock_dir = Path(tempfile.mkdtemp(prefix="edgeserve-bench-"))
    config = {
        "repository": str(args.repository),
        "backend": {"name": "onnxruntime", "threads": args.threads, "warmup": 3}
        | ({} if args.idle_poll_us is None else {"idle_poll_us": args.idle_poll_us}),
        "models": {args.model: {"slo_ms": 1000, "max_queue": 4096}},
        "listen": {
            "unix": str(sock_dir / "s.sock"),
            "tcp": "127.0.0.1:0",
            "http": "127.0.0.1:0",
            "grpc": "127.0.0.1:0",
            "max_in_flight": 4096,
        },
    }
    repository = ModelRepository(args.repository)
    manifest = repository.load_manifest(args.model)
    alone = OnnxRuntimeBackend(repository, threads=args.threads, warmup=3)
    alone.load(manifest)  # the sessions alone, on this thread: nothing else runs while they do
    final = len(manifest.exits) - 1

    async with NetServer(config) as net:
        server = net.server
        spec = server.manifest(args.model).input
        xs = np.random.default_rng(0).standard_normal((64, *spec.shape)).astype(spec.dtype)

        async def direct(x: np.ndarray) -> str:
            return (await server.infer(args.model, x)).status.value

        async def session(x: np.ndarray) -> str:
            alone.run(args.model, final, x[None])
            return "ok"

        local: dict[str, Call] = {"session": session, "direct": direct}
        ceiling = await stack_ceiling(net.urls[2], args.model, xs[0])
        urls = [*net.urls[:3], runner_url(ceiling), net.urls[3].removeprefix("grpc://")]
        if args.same_process:
            unix, tcp = await AsyncClient.connect(urls[0]), await AsyncClient.connect(urls[1])
            oip = OipClient(urls[2], max_connections=args.concurrency)
            stack = OipClient(urls[3], max_connections=args.concurrency)
            grpc = grpc_aio.InferenceServerClient(urls[4])
            local |= client_calls(unix, tcp, oip, stack, grpc, args.model)
            remote = None
        else:
            pipe, child_end = mp.get_context("spawn").Pipe()
            child = mp.get_context("spawn").Process(
                target=client_main, args=(child_end, urls, args.model, xs, args.concurrency), daemon=True
            )
            child.start()
            child_end.close()  # the child's end lives in the child only: its exit ends our reads

            async def answer() -> Any:
                try:
                    return await asyncio.to_thread(pipe.recv)
                except EOFError:
                    child.join(5)
                    raise SystemExit(
                        f"the client process exited ({child.exitcode}) mid-measurement; its error is above"
                    ) from None

            assert await answer() == "ready"

            async def remote(kind: str, name: str, amount: Any) -> Any:
                pipe.send((kind, name, amount))  # the server's loop runs while the client measures
                return await answer()

        names = [*local, "unix", "tcp", "http-bin", "http-json", "http-stack-bin", "http-stack-json", "grpc"]

        async def measure_latencies(name: str, n: int) -> list[float]:
            if name in local:
                return await latencies(local[name], xs, n)
            assert remote is not None
            return list(await remote("latencies", name, n))

        async def measure_throughput(name: str, seconds: float) -> float:
            if name in local:
                return await throughput(local[name], xs, args.concurrency, seconds)
            assert remote is not None
            return float(await remote("throughput", name, seconds))

        for name in names:  # warm-up
            await measure_latencies(name, 50)
        lat: dict[str, list[float]] = {name: [] for name in names}
        rps: dict[str, list[float]] = {name: [] for name in names}
        polled = dict.fromkeys(names, 0.0)  # the loop's idle polling during the sequential requests
        per_round = max(1, args.requests // args.rounds)
        for _ in range(args.rounds):
            for name in names:
                before = server.snapshot().get("idle_poll_s", 0.0)
                lat[name] += await measure_latencies(name, per_round)
                polled[name] += server.snapshot().get("idle_poll_s", 0.0) - before
                rps[name].append(await measure_throughput(name, args.seconds / args.rounds))
        if args.same_process:
            await unix.close()
            await tcp.close()
            await oip.close()
            await stack.close()
            await grpc.close()
        else:
            pipe.send(None)
            await asyncio.to_thread(child.join, 30)
        await ceiling.cleanup()
    sock_dir.rmdir()
    paths = names
    alone.close()

    base50, base99 = (float(np.percentile(lat["direct"], q)) for q in (50, 99))
    print(
        f"{args.model}: {len(lat['direct'])} sequential requests per path, throughput at concurrency "
        f"{args.concurrency}; ONNX Runtime {args.threads} thread(s); socket and HTTP clients "
        f"{'on the server loop' if args.same_process else 'in a second process'}"
    )
    header = (
        f"{'path':<15} {'req/s':>9} {'p50 us':>9} {'p99 us':>9} {'added p50 us':>13} {'added p99 us':>13}"
    )
    print("(added: over the direct path's percentile)")
    print(header)
    print("-" * len(header))
    for name in paths:
        p50, p99 = (float(np.percentile(lat[name], q)) for q in (50, 99))
        print(
            f"{name:<15} {float(np.mean(rps[name])):>9.0f} {p50:>9.0f} {p99:>9.0f} "
            f"{p50 - base50:>13.0f} {p99 - base99:>13.0f}"
        )
    alone50 = float(np.percentile(lat["session"], 50))
    throughput_of = {name: float(np.mean(rps[name])) for name in paths}
    for name in ("unix", "tcp", "http-bin", "http-json", "grpc"):
        stack = throughput_of[name.replace("http-", "http-stack-")] if name.startswith("http") else 0.0
        of_stack = f", {throughput_of[name] / stack:.2f}x the HTTP stack alone" if stack else ""
        print(
            f"{name}: {throughput_of[name] / throughput_of['session']:.2f}x the session alone, "
            f"{throughput_of[name] / throughput_of['direct']:.2f}x direct{of_stack}; "
            f"p50 {float(np.percentile(lat[name], 50)) - alone50:.0f} us above the session alone"
        )
    spent = ", ".join(f"{name} {1e6 * polled[name] / len(lat[name]):.0f}" for name in paths[1:])
    print(f"the loop's idle polling per sequential request ([backend] idle_poll_us), us: {spent}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("engines"))
    parser.add_argument("--model", default="digits-s")
    parser.add_argument("--threads", type=int, default=1, help="must match the profile's (default 1)")
    parser.add_argument("--requests", type=int, default=3000, help="sequential requests per path")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput time per path")
    parser.add_argument(
        "--same-process", action="store_true", help="clients on the server's own loop (the old setup)"
    )
    parser.add_argument(
        "--idle-poll-us",
        type=float,
        help="[backend] idle_poll_us for the server (default: the config's default; 0: the loop sleeps)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    run(main(parse_args()))

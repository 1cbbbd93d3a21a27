"""Offload failure modes, against a real HTTP upstream that misbehaves on demand.

The upstream is a small aiohttp app speaking the Open Inference Protocol (health + infer) whose
infer answers, hangs past the timeout or fails with HTTP 500. Whatever it does, every request gets
exactly one answer: failed batches fall back to the local queue, the breaker opens after repeated
failures, and shutdown answers what is still upstream.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from offload_support import profile_with_delay, write_mlp_model
from runtime_support import HookedFactory

from edgeserve.repository import ModelRepository
from edgeserve.runtime.results import Status
from edgeserve.runtime.server import Server
from edgeserve.wire.oip_codec import HEADER_LENGTH, InferResponse, Tensor, decode_request, encode_response

LOCAL_DELAY_S = 0.004


class FlakyUpstream:
    """`mode`: "ok" (answers logits = 7.0), "hang" (never answers) or "error" (HTTP 500)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0
        self.release = asyncio.Event()  # set at teardown: hanging handlers end (an error answer)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_post("/v2/models/{model}/infer", self.infer)
        return app

    async def ready(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def infer(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.read()
        infer = decode_request(body, request.headers.get(HEADER_LENGTH))
        if self.mode == "hang":
            await self.release.wait()
        if self.mode in ("error", "hang"):
            return web.json_response({"error": "injected failure"}, status=500)
        n = infer.inputs[0].data.shape[0]
        response = InferResponse(
            request.match_info["model"], [Tensor("logits", np.full((n, 10), 7.0, np.float32))]
        )
        payload, headers = encode_response(response, binary=True)
        return web.Response(body=payload, headers=headers)


@asynccontextmanager
async def flaky_upstream() -> AsyncIterator[tuple[FlakyUpstream, str]]:
    upstream = FlakyUpstream()
    runner = web.AppRunner(upstream.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield upstream, f"http://127.0.0.1:{port}"
    finally:
        upstream.release.set()
        await runner.cleanup()


def _config(root: Path, url: str, **upstream: Any) -> dict[str, Any]:
    return {
        "repository": str(root),
        "shutdown_timeout_s": 5,
        "backend": {"name": "onnxruntime", "threads": 1, "warmup": 0},
        "scheduler": {"late_tasks": "serve"},
        "models": {"digits-mlp": {"slo_ms": 40, "max_queue": 256}},
        "upstreams": [
            {
                "name": "flaky",
                "url": url,
                "timeout_ms": 150,
                "probe_interval_s": 0.1,
                "models": {"digits-mlp": {}},
                **upstream,
            }
        ],
    }


def _repository(tmp_path: Path) -> Path:
    root = tmp_path / "engines"
    profile_with_delay(root, [write_mlp_model(ModelRepository(root), "digits-mlp")], LOCAL_DELAY_S)
    return root


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _probed(server: Server) -> bool:
    return not math.isnan(server.snapshot()["upstreams"]["flaky"]["rtt_ms"])


def test_a_working_upstream_answers_with_served_by_and_counts(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    x = np.random.default_rng(0).standard_normal((60, 64)).astype(np.float32)

    async def main() -> None:
        async with (
            flaky_upstream() as (_, url),
            Server(_config(root, url), backend_factory=HookedFactory(delay_s=LOCAL_DELAY_S)) as server,
        ):
            await _until(lambda: _probed(server))
            results = await server.infer_batch("digits-mlp", x)
            snapshot = server.snapshot()
        remote = [r for r in results if r.served_by == "flaky"]
        assert remote and all(r.ok and np.all(r.output == 7.0) for r in remote)
        assert all(math.isnan(r.start) and not math.isnan(r.dispatch) and r.batch_size >= 1 for r in remote)
        assert snapshot["served"]["digits-mlp"]["flaky"] == len(remote)
        assert snapshot["served"]["digits-mlp"]["local"] == len(results) - len(remote)
        assert snapshot["upstreams"]["flaky"]["sent"] == len(remote)

    asyncio.run(main())


def test_timeouts_fall_back_to_local_serving_and_open_the_breaker(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    x = np.random.default_rng(1).standard_normal((60, 64)).astype(np.float32)

    async def main() -> None:
        async with flaky_upstream() as (upstream, url):
            config = _config(root, url, failures_to_open=2, cooldown_s=5.0, max_in_flight=4)
            async with Server(config, backend_factory=HookedFactory(delay_s=LOCAL_DELAY_S)) as server:
                await _until(lambda: _probed(server))
                upstream.mode = "hang"
                results = await server.infer_batch("digits-mlp", x)
                snapshot = server.snapshot()
                calls = upstream.calls
                again = await server.infer_batch("digits-mlp", x)  # breaker open: nothing goes
                assert upstream.calls == calls
        assert [r.status for r in results] == [Status.OK] * len(x)  # late (serve mode), never lost
        assert all(r.served_by == "local" for r in results + again)
        up = snapshot["upstreams"]["flaky"]
        assert up["state"] == "open" and up["failed"] == up["fallbacks"] == up["sent"] > 0
        assert sum(snapshot["requests"]["digits-mlp"].values()) == len(x)

    asyncio.run(main())


def test_a_half_open_breaker_probes_with_one_batch_and_closes_on_success(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    x = np.random.default_rng(2).standard_normal((40, 64)).astype(np.float32)

    async def main() -> None:
        async with flaky_upstream() as (upstream, url):
            config = _config(root, url, failures_to_open=1, cooldown_s=0.3, max_in_flight=1)
            async with Server(config, backend_factory=HookedFactory(delay_s=LOCAL_DELAY_S)) as server:
                await _until(lambda: _probed(server))
                upstream.mode = "error"
                await server.infer_batch("digits-mlp", x)
                assert server.snapshot()["upstreams"]["flaky"]["state"] == "open"
                upstream.mode = "ok"
                await asyncio.sleep(0.35)
                assert server.snapshot()["upstreams"]["flaky"]["state"] == "half-open"
                results = await server.infer_batch("digits-mlp", x)
                assert server.snapshot()["upstreams"]["flaky"]["state"] == "closed"
        assert any(r.served_by == "flaky" for r in results)

    asyncio.run(main())


def test_shutdown_answers_batches_still_upstream_exactly_once(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    x = np.random.default_rng(3).standard_normal((60, 64)).astype(np.float32)

    async def main() -> None:
        async with flaky_upstream() as (upstream, url):
            config = _config(root, url, timeout_ms=10_000)
            server = await Server(config, backend_factory=HookedFactory(delay_s=LOCAL_DELAY_S)).start()
            await _until(lambda: _probed(server))
            upstream.mode = "hang"
            pending = asyncio.ensure_future(server.infer_batch("digits-mlp", x))
            await _until(lambda: server.snapshot()["upstreams"]["flaky"]["sent"] > 0)
            started = time.monotonic()
            await server.close(timeout_s=0.5)
            assert time.monotonic() - started < 3.0  # the hanging upstream did not hold shutdown up
            results = await pending
            snapshot = server.snapshot()
        statuses = [r.status for r in results]
        assert Status.SHUTDOWN in statuses and set(statuses) <= {Status.OK, Status.SHUTDOWN}
        assert sum(snapshot["requests"]["digits-mlp"].values()) == len(x)

    asyncio.run(main())

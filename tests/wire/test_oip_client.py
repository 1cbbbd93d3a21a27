"""OipClient against the real OIP frontend (and against sockets that misbehave on purpose).

Also the frontend's statuses that need a busy or failing backend: 429 when a queue is full, 504
when a deadline cannot be met, 500 when the backend raises, 503 once the server shuts down, and
a client that gives up cancels its queued samples.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from oip_support import oip_config
from runtime_support import HookedFactory, profiled_tiny_repository

from edgeserve.config.server import ServerConfig
from edgeserve.errors import EdgeServeError
from edgeserve.loop import run
from edgeserve.net.listeners import free_port
from edgeserve.oip.frontend import OipFrontend
from edgeserve.runtime.server import Server
from edgeserve.wire.oip_client import OipClient, OipError


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oip-client") / "engines"
    profiled_tiny_repository(root)
    return root


@asynccontextmanager
async def serving(
    config: dict[str, Any], factory: HookedFactory | None = None
) -> AsyncIterator[tuple[Server, str]]:
    """A started Server with its OIP frontend on this loop; yields (server, url)."""
    parsed = ServerConfig.from_dict(config)
    server = Server(parsed, backend_factory=factory)
    await server.start()
    frontend = OipFrontend(server, parsed.listen)
    try:
        yield server, await frontend.start()
    finally:
        await frontend.stop_accepting()
        await server.close()
        await frontend.close()


def sample(model: str = "tiny_a", n: int = 1, seed: int = 0) -> np.ndarray:
    shape = (1, 8, 8) if model == "tiny_a" else (3, 16, 16)
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def test_client_reads_health_metadata_config_and_infers_in_both_encodings(served_root: Path) -> None:
    async def scenario() -> None:
        async with serving(oip_config(served_root)) as (server, url), OipClient(url) as client:
            assert await client.live() and await client.ready() and await client.ready("tiny_b")
            assert not await client.ready("no-such-model")
            assert (await client.server_metadata())["name"] == "edgeserve"
            assert (await client.model_metadata("tiny_b"))["inputs"][0]["shape"] == [-1, 3, 16, 16]
            assert (await client.model_config("tiny_a"))["max_batch_size"] == 4
            index = await client.repository_index()
            assert [(e["name"], e["state"]) for e in index] == [("tiny_a", "READY"), ("tiny_b", "READY")]
            x = sample(n=3)
            replies = {
                b: await client.infer("tiny_a", {"x": x}, binary=b, request_id=f"id-{b}")
                for b in (True, False)
            }
            for binary, reply in replies.items():
                assert reply.status == 200 and reply.response.id == f"id-{binary}"
                assert reply.response.output("logits").shape == (3, 5)
                assert (
                    0 < reply.rtt_s < 5
                    and reply.server_ms is not None
                    and 0 < reply.server_ms < reply.rtt_s * 1000
                )
                assert reply.response.parameters["edgeserve_served_by"] == "local"
            # raw float32 bytes are smaller than their decimal JSON text, both ways
            assert replies[True].request_bytes < replies[False].request_bytes
            assert replies[True].response_bytes < replies[False].response_bytes
            np.testing.assert_allclose(
                replies[True].response.output("logits"), replies[False].response.output("logits"), atol=1e-6
            )
            direct = await server.infer("tiny_a", x[0])
            if direct.exit_index == replies[True].response.parameters["edgeserve_exit_index"]:
                np.testing.assert_allclose(
                    replies[True].response.output("logits")[0], direct.output, atol=1e-5
                )

    run(scenario())


def test_unknown_model_is_an_http_error_carrying_the_servers_message(served_root: Path) -> None:
    async def scenario() -> None:
        async with serving(oip_config(served_root)) as (_, url), OipClient(url) as client:
            with pytest.raises(OipError) as info:
                await client.infer("tiny_z", {"x": sample()})
            assert info.value.kind == "http" and info.value.status == 404
            assert "unknown model 'tiny_z'; served: tiny_a, tiny_b" in str(info.value)
            with pytest.raises(OipError) as info:
                await client.infer("tiny_a", {"x": sample("tiny_b")})
            assert info.value.status == 400 and "[N, 1, 8, 8]" in str(info.value)

    run(scenario())


def test_connection_refused_is_kind_connect() -> None:
    async def scenario() -> None:
        async with OipClient(f"http://127.0.0.1:{free_port()}", timeout_s=2) as client:
            with pytest.raises(OipError) as info:
                await client.live()
        assert info.value.kind == "connect" and info.value.status is None

    run(scenario())


async def with_raw_server(answer: bytes | None, body: Callable[[str], Awaitable[None]]) -> None:
    """Run `body(url)` against a TCP server that sends `answer` to every request (None: never answers)."""

    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        await reader.readuntil(b"\r\n\r\n")
        if answer is None:
            await asyncio.sleep(30)
        else:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        await body(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()
        for task in handlers:  # a handler still sleeping must not outlive the loop
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def test_no_answer_within_the_timeout_is_kind_timeout() -> None:
    async def body(url: str) -> None:
        async with OipClient(url, timeout_s=5) as client:
            with pytest.raises(OipError) as info:
                await client.infer("m", {"x": sample()}, timeout_s=0.2)
            assert info.value.kind == "timeout"

    run(with_raw_server(None, body))


def test_an_undecodable_answer_is_kind_protocol() -> None:
    garbled = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\nnot json!"

    async def body(url: str) -> None:
        async with OipClient(url) as client:
            with pytest.raises(OipError) as info:
                await client.infer("m", {"x": sample()})
            assert info.value.kind == "protocol" and "not valid JSON" in str(info.value)

    run(with_raw_server(garbled, body))


def test_a_url_that_is_not_http_is_refused_at_once() -> None:
    with pytest.raises(EdgeServeError, match="http://host:port"):
        OipClient("tcp://127.0.0.1:7070")


def test_full_queue_is_429_and_hopeless_deadline_is_504(served_root: Path) -> None:
    models = {"tiny_a": {"slo_ms": 1000, "max_queue": 2}, "tiny_b": {"slo_ms": 1000}}
    config = oip_config(served_root, models=models)
    # Queued whatever its deadline (admission by count), then answered `expired` once hopeless;
    # deadline admission would refuse it at once (429, test_deadline_admission_* in runtime).
    config["scheduler"] = {"late_tasks": "expire", "admission": "all"}
    factory = HookedFactory(delay_s=0.3)

    async def scenario() -> None:
        async with serving(config, factory) as (_, url), OipClient(url) as client:
            busy = asyncio.ensure_future(client.infer("tiny_a", {"x": sample()}))
            await asyncio.to_thread(factory.backend.entered.wait, 5)  # the executor is now busy 0.3 s
            queued = asyncio.ensure_future(client.infer("tiny_a", {"x": sample(n=2)}))
            await asyncio.sleep(0.05)
            with pytest.raises(OipError) as full:
                await client.infer("tiny_a", {"x": sample()})
            with pytest.raises(OipError) as late:
                await client.infer("tiny_b", {"x": sample("tiny_b")}, parameters={"deadline_ms": 5})
            assert (await busy).status == 200 and (await queued).status == 200
        assert full.value.status == 429 and "queue of 'tiny_a' is full" in str(full.value)
        assert late.value.status == 504 and "expired" in str(late.value)

    run(scenario())


def test_a_capture_time_gives_the_slo_from_capture_and_a_stale_frame_is_504(served_root: Path) -> None:
    async def scenario() -> None:
        async with serving(oip_config(served_root)) as (_, url), OipClient(url) as client:
            fresh = await client.infer(
                "tiny_a", {"x": sample()}, parameters={"capture_ts": time.time() - 0.2}
            )
            budget = fresh.response.parameters["edgeserve_deadline_ms"]
            slo_ms = oip_config(served_root)["models"]["tiny_a"]["slo_ms"]
            assert slo_ms - 300 < budget < slo_ms - 190
            with pytest.raises(OipError) as stale:
                await client.infer("tiny_a", {"x": sample()}, parameters={"capture_ts": time.time() - 60})
            assert stale.value.status == 504 and "past the" in str(stale.value)
            with pytest.raises(OipError) as both:
                await client.infer(
                    "tiny_a", {"x": sample()}, parameters={"capture_ts": 1.0, "deadline_ms": 5}
                )
            assert both.value.status == 400 and "not both" in str(both.value)

    run(scenario())


def test_backend_failure_is_500(served_root: Path) -> None:
    async def scenario() -> None:
        factory = HookedFactory(fail_model="tiny_b")
        async with serving(oip_config(served_root), factory) as (_, url), OipClient(url) as client:
            with pytest.raises(OipError) as info:
                await client.infer("tiny_b", {"x": sample("tiny_b", n=2)})
        assert info.value.status == 500 and "injected failure on tiny_b" in str(info.value)

    run(scenario())


def test_shutdown_answers_503_and_ready_turns_false(served_root: Path) -> None:
    async def scenario() -> None:
        config = ServerConfig.from_dict(oip_config(served_root))
        server = await Server(config).start()
        frontend = OipFrontend(server, config.listen)
        url = await frontend.start()
        try:
            async with OipClient(url) as client:
                assert await client.ready()
                await server.close()
                assert await client.live() and not await client.ready() and not await client.ready("tiny_a")
                with pytest.raises(OipError) as info:
                    await client.infer("tiny_a", {"x": sample()})
        finally:
            await frontend.close()
        assert info.value.status == 503 and "shut" in str(info.value)

    run(scenario())


def test_a_client_that_gives_up_cancels_its_queued_samples(served_root: Path) -> None:
    factory = HookedFactory(delay_s=0.3)

    async def scenario() -> dict[str, Any]:
        async with serving(oip_config(served_root), factory) as (server, url), OipClient(url) as client:
            busy = asyncio.ensure_future(client.infer("tiny_a", {"x": sample()}))
            await asyncio.to_thread(factory.backend.entered.wait, 5)
            with pytest.raises(OipError) as info:
                await client.infer("tiny_a", {"x": sample(n=3)}, timeout_s=0.05)
            assert info.value.kind == "timeout"
            await asyncio.sleep(0.05)  # the frontend sees the disconnect and cancels the handler
            counts = {
                "cancelled": server.counters.cancelled["tiny_a"],
                "queued": server.counters.queue_depth["tiny_a"],
            }
            await busy
            return counts

    assert run(scenario()) == {"cancelled": 3, "queued": 0}


def test_bench_drives_an_oip_endpoint_with_the_same_report(served_root: Path, tmp_path: Path, capsys) -> None:
    from oip_support import oip_server

    from edgeserve.cli import main as cli_main
    from edgeserve.tools.bench import BenchSettings, run_bench, summaries

    with oip_server(oip_config(served_root)) as (_, url):
        for binary in (True, False):
            settings = BenchSettings(
                url, {"tiny_a": 40.0, "tiny_b": 20.0}, duration_s=0.5, warmup_s=0.1, binary=binary
            )
            result = run(run_bench(settings))
            rows = {s.name: s for s in summaries(result)}
            assert rows["all"].sent == len(result.records) > 5 and rows["all"].unanswered == 0
            assert all(
                r.status == "ok" and r.exit_name in ("layer1", "layer2", "final", "early")
                for r in result.records
            )
            assert rows["all"].violation_pct == 0.0 and rows["all"].p95_ms > 0
        argv = [
            "bench",
            "--target",
            url,
            "--total-rate",
            "40",
            "--duration",
            "0.3",
            "--warmup",
            "0",
            "--no-progress",
        ]
        assert cli_main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert "tiny_a 20.0/s, tiny_b 20.0/s" in out and any(line.startswith("all ") for line in out.splitlines())
    assert "statuses: ok" in out

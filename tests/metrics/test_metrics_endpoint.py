"""The metrics endpoint over HTTP, scraped while a real NetServer (UNIX socket, tiny ONNX models)
answers load from several connections: counters move, never go back, and end equal to what the
clients received."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from metrics_support import counter_samples, parse_samples, total, value
from net_support import server_thread
from runtime_support import config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.config.server import MetricsConfig
from edgeserve.loop import run
from edgeserve.metrics.endpoint import MetricsEndpoint
from edgeserve.runtime.server import Server
from edgeserve.wire.client import AsyncClient, Reply

CONNECTIONS = 4
PER_CONNECTION = 120


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("metrics") / "engines"
    return root, profiled_tiny_repository(root)


def _config(root: Path, tmp: Path) -> dict:
    return {
        **config_dict(root),
        "listen": {"unix": str(tmp / "edgeserve.sock")},
        "metrics": {"listen": "127.0.0.1:0"},
    }


async def _drive(url: str, models: dict[str, TinyModel], index: int) -> list[Reply]:
    """Paced requests on one connection: mostly good ones, plus some the server must refuse
    (wrong dtype, unknown model) and some with an impossible deadline (served late)."""
    draw = random.Random(index)
    xs = {name: tiny.random_input(8, seed=index) for name, tiny in models.items()}
    futures = []
    async with await AsyncClient.connect(url) as client:
        for i in range(PER_CONNECTION):
            name = draw.choice(sorted(models))
            x = xs[name][i % 8]
            if i % 20 == 7:
                futures.append(client.send(name, x.astype(np.float64)))  # invalid
            elif i % 20 == 13:
                futures.append(client.send("no-such-model", x))  # invalid, counted as (unknown)
            elif i % 10 == 3:
                futures.append(client.send(name, x, deadline_ms=0.001))  # late or expired
            else:
                futures.append(client.send(name, x))
            await asyncio.sleep(0.004)
        return list(await asyncio.gather(*futures))


def test_scrapes_during_load_move_monotonically_and_end_equal_to_the_answers(served, tmp_path: Path) -> None:
    root, models = served
    with server_thread(_config(root, tmp_path)) as srv:
        metrics_url = srv.net.metrics_url
        assert metrics_url is not None and metrics_url.endswith("/metrics")
        base = metrics_url.removesuffix("/metrics")

        async def main() -> tuple[list[str], list[Reply], str, int, str]:
            async with aiohttp.ClientSession() as http:
                scrapes: list[str] = []
                load = asyncio.gather(*(_drive(srv.unix_url, models, i) for i in range(CONNECTIONS)))
                while not load.done():
                    async with http.get(metrics_url) as response:
                        assert response.status == 200
                        content_type = response.headers["Content-Type"]
                        scrapes.append(await response.text())
                    await asyncio.sleep(0.1)
                replies = [r for per_connection in await load for r in per_connection]
                async with http.get(metrics_url) as response:
                    scrapes.append(await response.text())
                async with http.get(base + "/other") as response:
                    missing = response.status
            return scrapes, replies, content_type, missing, base

        scrapes, replies, content_type, missing, _ = run(main())

    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert missing == 404
    assert len(scrapes) >= 4, "the load should last long enough for several scrapes"

    # monotonic: no counter, bucket, sum or count ever goes back between scrapes
    previous = counter_samples(scrapes[0])
    for text in scrapes[1:]:
        current = counter_samples(text)
        for key, before in previous.items():
            assert current[key] >= before, key
        previous = current
    # moving: the answered total grows during the load, not only at the end
    answered = [total(parse_samples(text), "edgeserve_requests_total") for text in scrapes]
    assert len(set(answered[:-1])) >= 3, answered

    # at the end the server's counts equal what the clients received, status by status
    final = parse_samples(scrapes[-1])
    received = Counter(r.status for r in replies)
    assert len(replies) == CONNECTIONS * PER_CONNECTION
    assert received["ok"] > 0 and received["invalid"] > 0
    for status in ("ok", "rejected", "expired", "error", "invalid", "shutdown"):
        assert total(final, "edgeserve_requests_total", status=status) == received[status], status
        assert (
            value(final, "edgeserve_frontend_answers", frontend="socket", status=status) == received[status]
        ), status
    assert value(final, "edgeserve_requests_total", model="(unknown)", status="invalid") == sum(
        r.model == "no-such-model" for r in replies
    )
    late = sum(r.status == "expired" or (r.status == "ok" and r.late) for r in replies)
    assert late > 0
    assert total(final, "edgeserve_deadline_violations_total") == late
    for name in models:
        ok = sum(r.status == "ok" and r.model == name for r in replies)
        assert value(final, "nv_inference_request_success", model=name, version="1") == ok
        assert value(final, "edgeserve_request_duration_seconds_count", model=name) == ok
        assert value(final, "edgeserve_queue_duration_seconds_count", model=name) == ok
        assert value(final, "edgeserve_request_duration_seconds_bucket", model=name, le="+Inf") == ok
        assert total(final, "edgeserve_exit", model=name) == ok
        assert value(final, "nv_inference_count", model=name, version="1") == ok  # no batch failed
        assert value(final, "nv_inference_pending_request_count", model=name, version="1") == 0
        # Triton's cumulative microseconds are the histograms' sums
        assert value(final, "nv_inference_request_duration_us", model=name, version="1") == pytest.approx(
            value(final, "edgeserve_request_duration_seconds_sum", model=name) * 1e6
        )
    batches = total(final, "edgeserve_batches")
    assert total(final, "edgeserve_compute_duration_seconds_count") == batches > 0
    assert value(final, "edgeserve_scheduler_decision_seconds_count") >= batches
    assert 0 < value(final, "edgeserve_executor_busy_seconds") < 60
    # the thread's CPU time within its batches: positive, and never more than their wall time
    busy_cpu = value(final, "edgeserve_executor_busy_cpu_seconds")
    assert 0 < busy_cpu <= value(final, "edgeserve_executor_busy_seconds") + 0.01
    assert 0 < value(final, "edgeserve_executor_utilization") <= 1
    assert value(final, "edgeserve_frontend_requests", frontend="socket") == len(replies)
    assert value(final, "edgeserve_frontend_connections", frontend="socket") == CONNECTIONS
    assert value(final, "process_resident_memory_bytes") > 10 * 2**20


def test_an_embedder_runs_the_endpoint_next_to_its_own_server(served) -> None:
    root, models = served

    async def main() -> tuple[str, str]:
        async with Server(config_dict(root)) as server:
            await server.infer_batch("tiny_b", models["tiny_b"].random_input(5))
            config = MetricsConfig(listen=("127.0.0.1", 0), path="/prom")
            async with MetricsEndpoint(server, config) as endpoint, aiohttp.ClientSession() as http:
                assert endpoint.url is not None and endpoint.url.endswith("/prom")
                async with http.get(endpoint.url) as response:
                    text = await response.text()
                async with http.get(endpoint.url.removesuffix("/prom") + "/metrics") as response:
                    assert response.status == 404
            return text, endpoint.url

    text, _ = run(main())
    samples = parse_samples(text)
    assert value(samples, "nv_inference_request_success", model="tiny_b", version="1") == 5
    assert value(samples, "nv_inference_request_success", model="tiny_a", version="1") == 0
    assert "edgeserve_frontend" not in text  # no frontend given
    if sys.platform.startswith("linux"):  # the kernel's per-thread schedstat
        for thread in ("executor", "loop"):
            assert value(samples, "edgeserve_thread_cpu_wait_seconds_total", thread=thread) >= 0


def test_a_busy_metrics_port_fails_the_start_naming_the_key(served) -> None:
    root, _ = served

    async def main() -> None:
        async with Server(config_dict(root)) as server:
            first = await MetricsEndpoint(server, MetricsConfig(listen=("127.0.0.1", 0))).start()
            try:
                port = int(first.url.rsplit(":", 1)[1].split("/")[0])
                with pytest.raises(OSError, match=f"metrics.listen 127.0.0.1:{port}"):
                    await MetricsEndpoint(server, MetricsConfig(listen=("127.0.0.1", port))).start()
            finally:
                await first.close()

    run(main())


def test_http_inference_requests_are_counted_under_the_http_frontend(served, tmp_path: Path) -> None:
    from edgeserve.service.process import NetServer
    from edgeserve.wire.oip_client import OipClient

    root, models = served
    config = {**_config(root, tmp_path), "listen": {"unix": str(tmp_path / "s.sock"), "http": "127.0.0.1:0"}}

    async def main() -> str:
        async with NetServer(config) as net:
            http_url = next(u for u in net.urls if u.startswith("http://"))
            async with OipClient(http_url) as client:
                for n in (1, 3):
                    await client.infer("tiny_a", {"x": models["tiny_a"].random_input(n)})
            assert net.metrics_url is not None
            async with aiohttp.ClientSession() as http, http.get(net.metrics_url) as response:
                return await response.text()

    samples = parse_samples(run(main()))
    assert value(samples, "edgeserve_frontend_requests", frontend="http") == 2  # HTTP requests
    assert value(samples, "edgeserve_frontend_answers", frontend="http", status="ok") == 4  # samples
    assert value(samples, "edgeserve_frontend_requests", frontend="socket") == 0
    assert value(samples, "nv_inference_request_success", model="tiny_a", version="1") == 4


def _ask(url: str, raw: bytes) -> tuple[bytes, bytes, bytes]:
    """(status, head, body) of one raw request to the host:port of `url`, read to the close."""
    import socket

    host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b" ", 2)[1], head.lower(), body


def test_the_endpoint_answers_errors_as_json_and_serves_under_the_http_limits(served, tmp_path: Path) -> None:
    """Without an OIP front too, NetServer's metrics endpoint is held to the HTTP listeners' caps
    and timeouts (listener "metrics"), and every error is {"error": ...} JSON: 401 (a bearer
    header that is not UTF-8 too), 404, and a request it cannot parse (400, not text/plain)."""
    root, _ = served
    config = {**_config(root, tmp_path), "listen": {"unix": str(tmp_path / "s.sock"), "token": "t0k"}}
    get = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    with server_thread(config) as srv:
        url = srv.net.metrics_url
        assert url is not None
        for raw, expected in (
            (get + b"Authorization: Bearer \xff\r\n\r\n", b"401"),
            (get + b"\r\n", b"401"),
            (
                b"GET /nothing HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\nConnection: close\r\n\r\n",
                b"404",
            ),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", b"400"),
        ):
            status, head, body = _ask(url, raw)
            assert status == expected and b"content-type: application/json" in head, (raw, head)
            assert list(json.loads(body)) == ["error"]
        status, _, body = _ask(url, get + b"Authorization: Bearer t0k\r\n\r\n")
    assert status == b"200"
    samples = parse_samples(body.decode())
    assert value(samples, "edgeserve_http_bad_requests_total", listener="metrics") == 1
    assert value(samples, "edgeserve_http_timeouts_total", listener="metrics", kind="header") == 0
    assert value(samples, "edgeserve_http_open_connections", listener="metrics") == 1  # this scrape


def test_the_http_limit_families_render_from_the_guards_counters() -> None:
    from types import SimpleNamespace

    from edgeserve.metrics import render_metrics
    from edgeserve.runtime.counters import Counters

    http = SimpleNamespace(
        open_by_listener={"http": 3, "metrics": 1},
        refused_connections={"http": 7, "metrics": 0},
        timeouts={("http", "header"): 2, ("http", "body"): 1, ("http", "keepalive"): 4},
        bad_requests={"http": 5, "metrics": 1},
        decode_bytes=1024,
        decode_refused=2,
    )
    samples = parse_samples(render_metrics(Counters().snapshot(), models=["m"], http=http))
    assert value(samples, "edgeserve_http_open_connections", listener="http") == 3
    assert value(samples, "edgeserve_http_refused_connections_total", listener="http") == 7
    assert value(samples, "edgeserve_http_timeouts_total", listener="http", kind="keepalive") == 4
    assert value(samples, "edgeserve_http_bad_requests_total", listener="metrics") == 1
    assert value(samples, "edgeserve_http_decode_bytes") == 1024
    assert value(samples, "edgeserve_http_decode_refused_total") == 2


def test_a_front_process_counters_are_scraped_in_both_formats(served, tmp_path: Path) -> None:
    """`[listen] front_process = true`: the front's counters come over the link (FrontendStats
    updated in place every 0.25 s) and each scrape, text or OpenMetrics, reads them as they are."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics

    root, models = served
    config = _config(root, tmp_path)
    config["listen"] = {**config["listen"], "front_process": True}
    with server_thread(config) as srv:
        metrics_url = srv.net.metrics_url
        assert metrics_url is not None

        async def main() -> tuple[list[Reply], str, str, str]:
            xs = models["tiny_a"].random_input(12, seed=3)
            async with await AsyncClient.connect(srv.unix_url) as client:
                replies = list(await asyncio.gather(*(client.send("tiny_a", x) for x in xs)))
            async with aiohttp.ClientSession() as http:
                for _ in range(100):  # the front reports its counters every 0.25 s
                    async with http.get(metrics_url) as response:
                        text = await response.text()
                    if value(parse_samples(text), "edgeserve_frontend_requests", frontend="socket") == 12:
                        break
                    await asyncio.sleep(0.1)
                accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
                async with http.get(metrics_url, headers=accept) as response:
                    content_type, om_text = response.headers["Content-Type"], await response.text()
            return replies, text, content_type, om_text

        replies, text, content_type, om_text = run(main())
    assert [r.status for r in replies] == ["ok"] * 12
    assert content_type.startswith("application/openmetrics-text")
    om = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in openmetrics(om_text)
        for s in family.samples
    }
    for samples, name in (
        (parse_samples(text), "edgeserve_frontend_requests"),
        (om, "edgeserve_frontend_requests_total"),
    ):
        assert samples[(name, frozenset({("frontend", "socket")}))] == 12
    assert (
        om[("edgeserve_frontend_answers_total", frozenset({("frontend", "socket"), ("status", "ok")}))] == 12
    )
    assert value(parse_samples(text), "edgeserve_frontend_process_cpu_seconds", frontend="socket") > 0

"""The OIP frontend over real HTTP: every bad request gets the protocol's JSON error (aiohttp's own
404/405/400 included), non-finite outputs in JSON, the bearer token, the HTTP connection gauges and
the warning for a listener exposed without a token."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from metrics_support import parse_samples, value
from net_support import ServerThread, server_thread
from oip_support import oip_config, oip_server
from runtime_support import HookedBackend, HookedFactory, profiled_tiny_repository

from edgeserve.config.access import bearer_ok, is_loopback
from edgeserve.config.server import ListenConfig
from edgeserve.wire.oip_client import OipClient, OipError
from edgeserve.wire.oip_codec import decode_request

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oip-errors") / "engines"
    profiled_tiny_repository(root)
    return root


@pytest.fixture(scope="module")
def served(served_root: Path) -> Iterator[tuple[ServerThread, str]]:
    with oip_server(oip_config(served_root)) as pair:
        yield pair


def fetch(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def json_error(status: int, headers: dict[str, str], body: bytes) -> str:
    """The {"error": ...} text of an error answer, checking its shape and content type."""
    assert headers["Content-Type"].startswith("application/json"), (status, headers, body[:200])
    decoded = json.loads(body)
    assert set(decoded) == {"error"} and isinstance(decoded["error"], str)
    return decoded["error"]


def infer_json(data: Any, shape: list[int], name: str = "x") -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": "FP32", "data": data}]}).encode()


# -- every error is JSON -------------------------------------------------------------------------------


def test_a_deeply_nested_body_is_400_json(served: tuple[ServerThread, str]) -> None:
    url = f"{served[1]}/v2/models/tiny_a/infer"
    status, headers, body = fetch("POST", url, b"[" * 100_000 + b"]" * 100_000)
    # counted before it is parsed: far more arrays than a request for tiny_a could hold
    assert status == 400 and "holds 100000 arrays" in json_error(status, headers, body)
    status, headers, body = fetch("POST", url, b"[" * 3000 + b"]" * 3000)  # within the count: parsed
    assert status == 400 and "nested too deeply" in json_error(status, headers, body)
    status, headers, body = fetch("POST", url, b'{"inputs": ' + b"[" * 50_000)
    assert status == 400 and "JSON" in json_error(status, headers, body)


def test_deeply_nested_tensor_data_is_400_json(served: tuple[ServerThread, str]) -> None:
    data: Any = [0.0]
    for _ in range(200):
        data = [data]
    status, headers, body = fetch(
        "POST", f"{served[1]}/v2/models/tiny_a/infer", infer_json(data, [1, 1, 8, 8])
    )
    assert status == 400 and "nested deeper than 64" in json_error(status, headers, body)


def test_unknown_route_and_wrong_method_are_json(served: tuple[ServerThread, str]) -> None:
    status, headers, body = fetch("GET", f"{served[1]}/v2/nothing/here")
    assert status == 404 and json_error(status, headers, body)
    status, headers, body = fetch("GET", f"{served[1]}/v2/models/tiny_a/infer")
    assert status == 405 and json_error(status, headers, body) and "POST" in headers["Allow"]


def test_an_unparsable_http_request_is_400_json(served: tuple[ServerThread, str]) -> None:
    host, port = served[1].removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/tiny_a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split()[1] == b"400"
    assert b"content-type: application/json" in head.lower()
    assert "bad HTTP request" in json.loads(body)["error"]


def test_error_texts_quote_at_most_a_bounded_part_of_client_values(served: tuple[ServerThread, str]) -> None:
    long_name = "m" * 5000
    status, headers, body = fetch("GET", f"{served[1]}/v2/models/{long_name}")
    message = json_error(status, headers, body)
    assert status == 404 and "[cut, 5000 chars]" in message and len(message) < 400
    status, headers, body = fetch(
        "POST", f"{served[1]}/v2/models/tiny_a/infer", infer_json([0.0] * 64, [1, 1, 8, 8], name="n" * 10_000)
    )
    message = json_error(status, headers, body)
    assert status == 400 and "[cut, 10000 chars]" in message and len(message) < 600


# -- compressed answers ------------------------------------------------------------------------------------


def test_answers_are_deflated_only_when_asked_and_worth_a_packet(served: tuple[ServerThread, str]) -> None:
    url = f"{served[1]}/v2/models/tiny_a/infer"
    asks = {"Content-Type": "application/json", "Accept-Encoding": "gzip"}
    rows = np.ones((32, 1, 8, 8), dtype=np.float32).tolist()
    status, headers, body = fetch("POST", url, infer_json(rows, [32, 1, 8, 8]), asks)
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    logits = json.loads(gzip.decompress(body))["outputs"][0]
    assert logits["shape"] == [32, 5] and len(logits["data"]) == 32 * 5
    status, headers, body = fetch("POST", url, infer_json(rows[:1], [1, 1, 8, 8]), asks)
    assert status == 200 and "Content-Encoding" not in headers  # ~300 bytes: one segment either way
    assert json.loads(body)["outputs"][0]["shape"] == [1, 5]
    status, headers, body = fetch("POST", url, infer_json(rows, [32, 1, 8, 8]))  # not asked: plain
    assert status == 200 and "Content-Encoding" not in headers and len(body) >= 1400


# -- non-finite outputs ----------------------------------------------------------------------------------


class NonFiniteFactory(HookedFactory):
    """The tiny models' real logits with classes 0, 1, 2 replaced by NaN, +inf and -inf."""

    def __call__(self, repository: Any, config: Any) -> HookedBackend:
        backend = super().__call__(repository, config)
        run = backend.run_outputs

        def non_finite(model: str, exit: int, batch: np.ndarray) -> dict[str, np.ndarray]:
            outputs = {
                k: np.array(v, dtype=np.float32, copy=True) for k, v in run(model, exit, batch).items()
            }
            for out in outputs.values():
                out[:, :3] = [np.nan, np.inf, -np.inf]
            return outputs

        backend.run_outputs = non_finite  # type: ignore[method-assign]
        return backend


def test_non_finite_outputs_are_null_in_json_and_exact_in_binary(served_root: Path) -> None:
    with oip_server(oip_config(served_root), NonFiniteFactory()) as (_, url):
        x = np.zeros((2, 1, 8, 8), np.float32)
        status, headers, body = fetch(
            "POST", f"{url}/v2/models/tiny_a/infer", infer_json(x.reshape(-1).tolist(), [2, 1, 8, 8])
        )
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        data = json.loads(body)["outputs"][0]["data"]  # strict JSON: no NaN/Infinity tokens
        assert data[:3] == [None, None, None] and all(isinstance(v, float) for v in data[3:5])

        async def both() -> tuple[np.ndarray, np.ndarray]:
            async with OipClient(url) as client:
                as_json = await client.infer("tiny_a", {"x": x}, binary=False)
                as_binary = await client.infer("tiny_a", {"x": x}, binary=True)
            return as_json.response.output("logits"), as_binary.response.output("logits")

        as_json, as_binary = asyncio.run(both())
    assert np.isnan(as_json[:, :3]).all() and np.isfinite(as_json[:, 3:]).all()  # null decodes as NaN
    assert np.isnan(as_binary[:, 0]).all() and (as_binary[:, 1] == np.inf).all()
    assert (as_binary[:, 2] == -np.inf).all()
    np.testing.assert_array_equal(as_json[:, 3:], as_binary[:, 3:])


def test_null_in_float_data_decodes_as_nan_and_is_refused_for_integers() -> None:
    request = decode_request(infer_json([1.0, None], [2]))
    assert np.isnan(request.inputs[0].data[1])
    body = json.dumps({"inputs": [{"name": "i", "shape": [1], "datatype": "INT32", "data": [None]}]})
    with pytest.raises(Exception, match="only INT32 values"):
        decode_request(body.encode())


# -- the bearer token --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(served_root: Path) -> Iterator[tuple[ServerThread, str]]:
    config = {**oip_config(served_root, token=TOKEN), "metrics": {"listen": "127.0.0.1:0"}}
    with oip_server(config) as pair:
        yield pair


def test_with_a_token_every_route_but_health_needs_the_bearer_header(
    guarded: tuple[ServerThread, str],
) -> None:
    srv, url = guarded
    good = {"Authorization": f"Bearer {TOKEN}"}
    body = infer_json([0.0] * 64, [1, 1, 8, 8])
    for method, path, data in (
        ("POST", "/v2/models/tiny_a/infer", body),
        ("GET", "/v2/models/tiny_a", None),
        ("GET", "/v2/models/tiny_a/config", None),
        ("GET", "/v2/models/tiny_a/ready", None),
        ("GET", "/v2", None),
        ("POST", "/v2/repository/index", b""),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            status, answer_headers, answer = fetch(method, url + path, data, headers)
            assert status == 401, (path, headers)
            assert "bearer token" in json_error(status, answer_headers, answer)
            assert answer_headers["WWW-Authenticate"].startswith("Bearer")
        status, _, _ = fetch(method, url + path, data, good)
        assert status == 200, path
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert fetch("GET", url + path)[0] == 200
    status, headers, answer = fetch("GET", url + "/v2/no/such/route")
    assert status == 401 and json_error(status, headers, answer)  # routes are not revealed either
    assert fetch("GET", url + "/v2/no/such/route", None, good)[0] == 404
    assert srv.net.oip is not None and srv.net.oip.stats.refused_auth >= 19


def test_oip_client_sends_its_token(guarded: tuple[ServerThread, str]) -> None:
    url = guarded[1]

    async def calls() -> tuple[int, str]:
        async with OipClient(url, token=TOKEN) as client:
            reply = await client.infer("tiny_a", {"x": np.zeros((1, 1, 8, 8), np.float32)})
        async with OipClient(url) as anonymous:
            with pytest.raises(OipError) as info:
                await anonymous.model_metadata("tiny_a")
        assert info.value.status == 401
        return reply.status, info.value.kind

    assert asyncio.run(calls()) == (200, "http")


def test_metrics_need_the_token_and_count_http_connections(guarded: tuple[ServerThread, str]) -> None:
    srv, url = guarded
    metrics_url = srv.net.metrics_url
    assert metrics_url is not None
    status, headers, body = fetch("GET", metrics_url)
    assert (
        status == 401
        and headers["WWW-Authenticate"].startswith("Bearer")
        and json_error(status, headers, body)
    )
    assert fetch("GET", metrics_url, None, {"Authorization": "Bearer nope"})[0] == 401

    async def scrape_with_connections_open() -> tuple[dict[Any, float], dict[Any, float]]:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=auth) as http:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=False)) as other:
                # two keep-alive connections to the HTTP front (one per session), plus a malformed infer
                async with http.get(f"{url}/v2/models/tiny_a") as response:
                    assert response.status == 200
                async with other.post(f"{url}/v2/models/tiny_a/infer", data=b"{", headers=auth) as response:
                    assert response.status == 400
                async with http.get(metrics_url) as response:
                    assert response.status == 200
                    during = parse_samples(await response.text())
            async with http.get(metrics_url) as response:
                after = parse_samples(await response.text())
        return during, after

    during, after = asyncio.run(scrape_with_connections_open())

    def http(samples: dict[Any, float], name: str) -> float:
        return value(samples, name, frontend="http")

    assert http(during, "edgeserve_frontend_open_connections") >= 2
    assert http(during, "edgeserve_frontend_connections_total") >= 2
    assert http(during, "edgeserve_frontend_protocol_errors_total") >= 1
    # the other session's connection closed before the second scrape
    assert http(after, "edgeserve_frontend_open_connections") < http(
        during, "edgeserve_frontend_open_connections"
    )


# -- exposure warnings -----------------------------------------------------------------------------------


def test_non_loopback_listeners_without_a_token_log_a_warning(
    served_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {
        **oip_config(served_root, http="0.0.0.0:0", tcp="0.0.0.0:0"),
        "metrics": {"listen": "0.0.0.0:0"},
    }
    with caplog.at_level(logging.WARNING), server_thread(config):
        pass
    warned = [r.getMessage() for r in caplog.records if "not a loopback address" in r.getMessage()]
    assert any(m.startswith("listen.http") for m in warned), warned
    assert any(m.startswith("listen.tcp") for m in warned), warned
    assert any(m.startswith("metrics.listen") for m in warned), warned
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING),
        server_thread({**config, "listen": {**config["listen"], "token": TOKEN}}),
    ):
        pass
    assert not [r for r in caplog.records if "not a loopback address" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING), server_thread(oip_config(served_root)):
        pass
    assert not [r for r in caplog.records if "not a loopback address" in r.getMessage()]


def test_loopback_and_bearer_helpers() -> None:
    assert (
        is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    )
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("::")
    assert not is_loopback("192.168.1.2") and not is_loopback("jetson.local")
    assert bearer_ok("Bearer abc", "abc") and bearer_ok("bearer  abc ", "abc")
    assert not bearer_ok(None, "abc") and not bearer_ok("Bearer abd", "abc") and not bearer_ok("abc", "abc")
    assert not bearer_ok("Bearer \udcff", "abc")  # a header byte that is not UTF-8, as aiohttp keeps it
    assert ListenConfig(token="x").token == "x"


def test_an_upstream_token_is_read_kept_out_of_repr_and_checked() -> None:
    from edgeserve.config.server import ConfigError, ServerConfig

    def upstreams(**extra: Any) -> Any:
        upstream = {"url": "http://10.0.0.5:8000", "models": {"tiny_a": {}}, **extra}
        return ServerConfig.from_dict(
            {"models": {"tiny_a": {"slo_ms": 20}}, "upstreams": [upstream]}
        ).upstreams

    (up,) = upstreams(token=TOKEN)
    assert up.token == TOKEN and TOKEN not in repr(up)
    assert upstreams()[0].token is None
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.token"):
        upstreams(token=5)

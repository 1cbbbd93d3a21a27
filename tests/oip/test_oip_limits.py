"""The HTTP front held to the socket front's standards (issue 66), with a real server and raw sockets:
a hostile request on one connection leaves the others' latency alone; idle or half-sent connections
can neither exhaust descriptors nor hold memory past their timeouts; every malformed request is a
4xx in the protocol's JSON error shape, logged without a traceback; /metrics answers the same way."""

from __future__ import annotations

import json
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from metrics_support import parse_samples, value
from net_support import ServerThread, hello_frame, raw_connect, read_frame, valid_infer
from oip_support import host_port, json_error_of, oip_config, oip_server, raw_request, read_response
from runtime_support import profiled_tiny_repository

from edgeserve.config.http_limits import HttpLimits, derived_caps
from edgeserve.config.server import ListenConfig
from edgeserve.manifest import TensorSpec
from edgeserve.oip.decoding import (
    ENVELOPE_ITEMS,
    ITEM_BYTES,
    PER_INPUT_ITEMS,
    READ_COPIES,
    DecodeBudget,
    charge,
    json_size,
    model_inputs,
)
from edgeserve.wire.frames import encode_frame
from edgeserve.wire.oip_codec import clip

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
INFER = "/v2/models/tiny_a/infer"
GOOD = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}]}
).encode()
MiB = 1 << 20


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oip-limits") / "engines"
    profiled_tiny_repository(root)
    return root


@pytest.fixture(scope="module")
def served(served_root: Path) -> Iterator[tuple[ServerThread, str]]:
    """The issue's attacker's server: a token, the socket front on TCP and a metrics endpoint."""
    config = {**oip_config(served_root, token=TOKEN, tcp="127.0.0.1:0"), "metrics": {"listen": "127.0.0.1:0"}}
    with oip_server(config) as pair:
        yield pair


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(host_port(url), timeout=timeout)


def exchange(url: str, raw: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    with connect(url, timeout) as sock:
        sock.sendall(raw)
        return read_response(sock)


def scrape(srv: ServerThread) -> dict[Any, float]:
    assert srv.net.metrics_url is not None
    path = "/" + srv.net.metrics_url.split("/", 3)[3]
    status, _, body = exchange(srv.net.metrics_url, raw_request("GET", path, headers=AUTH, close=True))
    assert status == 200
    return parse_samples(body.decode())


def assert_serves(url: str) -> None:
    """A good infer request on a new connection is answered 200 with logits."""
    status, _, body = exchange(url, raw_request("POST", INFER, GOOD, AUTH, close=True))
    assert status == 200, (status, body[:300])
    assert json.loads(body)["outputs"][0]["shape"] == [1, 5]


# -- hostile bodies (issue items 1, 3, 4) ----------------------------------------------------------------


def binary_bytes_2m() -> tuple[bytes, dict[str, str]]:
    """8 MB binary BYTES tensor of 2 M empty elements: 2.25 s of decoding on the loop before."""
    n = 2_000_000
    entry = {"name": "x", "datatype": "BYTES", "shape": [n], "parameters": {"binary_data_size": 4 * n}}
    header = json.dumps({"inputs": [entry]}).encode()
    return header + bytes(4 * n), {"Inference-Header-Content-Length": str(len(header))}


def json_lists_2m() -> tuple[bytes, dict[str, str]]:
    """2 M `[0]` lists as JSON data: ~2 s and +260 MiB before."""
    data = b",".join([b"[0]"] * 2_000_000)
    head = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2000000,1],"data":['
    return head + data + b"]}]}", {}


def json_objects() -> tuple[bytes, dict[str, str]]:
    """An 8 MiB body of 2.79 M `{}`: +260 MiB while parsed before."""
    return b'{"inputs":[' + b",".join([b"{}"] * 2_790_000) + b"]}", {}


NESTED = "NESTED-1000"  # stands for a list nested 1,000 deep (json.dumps would not write it)


def infer_with(**fields: Any) -> tuple[bytes, dict[str, str]]:
    """A good request for tiny_a with `fields` (and `entry`: fields of its input) replaced."""
    entry = {"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}
    request: dict[str, Any] = {"inputs": [{**entry, **fields.pop("entry", {})}], **fields}
    return json.dumps(request).replace(f'"{NESTED}"', "[" * 1000 + "5" + "]" * 1000).encode(), {}


HOSTILE: dict[str, Callable[[], tuple[bytes, dict[str, str]]]] = {
    "bytes-2m": binary_bytes_2m,
    "lists-2m": json_lists_2m,
    "objects-2.8m": json_objects,
    "outputs-int": lambda: infer_with(outputs=5),
    "shape-nested-1000": lambda: infer_with(entry={"shape": NESTED}),
}


def good_latencies(
    srv: ServerThread, url: str, n: int, until: Callable[[], bool] = lambda: True
) -> list[float]:
    """Seconds per good request, alternating a kept-alive HTTP connection and a greeted socket-front
    connection, `n` of them at least and on until `until()`."""
    http = connect(url)
    sock = raw_connect(srv.tcp_url)
    sock.sendall(hello_frame(TOKEN))
    assert read_frame(sock)["type"] == "hello"  # type: ignore[index]
    took: list[float] = []
    try:
        while len(took) < n or not until():
            started = time.perf_counter()
            if len(took) % 2:
                sock.sendall(encode_frame(valid_infer(len(took))))
                reply = read_frame(sock)
                assert reply is not None and reply["status"] == "ok", reply
            else:
                http.sendall(raw_request("POST", INFER, GOOD, AUTH))
                status, _, body = read_response(http)
                assert status == 200, body[:300]
            took.append(time.perf_counter() - started)
    finally:
        http.close()
        sock.close()
    return took


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@pytest.mark.parametrize("case", [*HOSTILE, "half-sent-8MiB"])
def test_a_hostile_request_is_a_400_json_and_leaves_other_connections_their_latency(
    served: tuple[ServerThread, str], case: str
) -> None:
    """While one connection sends a hostile body (or 8 MB of a body and stalls), good requests on
    others (HTTP and the socket front) stay within 50 ms at P99 (before: 1-2 s). The bound is
    max(50 ms, 5 x this test's own baseline P99), so that a box busy with other work does not
    fail it."""
    srv, url = served
    body, headers = HOSTILE[case]() if case in HOSTILE else (bytes(8_000_000), {})
    raw = raw_request("POST", INFER, body, {**AUTH, **headers}, close=True)
    baseline = p99(good_latencies(srv, url, 20))
    answer: dict[str, Any] = {}

    def hostile() -> None:
        if case in HOSTILE:
            answer["reply"] = exchange(url, raw)
            return
        with connect(url) as sock:  # all but the last byte, then nothing: held until closed
            sock.sendall(raw[:-1])
            time.sleep(0.3)

    thread = threading.Thread(target=hostile)
    thread.start()
    during = good_latencies(srv, url, 20, until=lambda: not thread.is_alive())
    thread.join()
    if case in HOSTILE:
        status, got_headers, got_body = answer["reply"]
        assert status == 400, (status, got_body[:300])
        assert json_error_of(status, got_headers, got_body)
    assert p99(during) < max(0.050, 5 * baseline), (case, p99(during), baseline)
    assert_serves(url)
    wait_for(lambda: value(scrape(srv), "edgeserve_http_decode_bytes") == 0)  # nothing left charged


def test_the_hostile_json_is_refused_from_a_count_of_its_bytes_before_it_is_parsed(
    served: tuple[ServerThread, str],
) -> None:
    body, _ = json_lists_2m()
    status, headers, answer = exchange(served[1], raw_request("POST", INFER, body, AUTH, close=True))
    assert status == 400 and "holds 4000008 arrays, objects and values" in json_error_of(
        status, headers, answer
    )
    body, headers = binary_bytes_2m()  # refused on its datatype, from the header alone
    status, got, answer = exchange(
        served[1], raw_request("POST", INFER, body, {**AUTH, **headers}, close=True)
    )
    assert status == 400 and "datatype must be FP32, got BYTES" in json_error_of(status, got, answer)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outputs": 5}, "outputs: must be a list"),
        ({"outputs": True}, "outputs: must be a list"),
        ({"outputs": 1.5}, "outputs: must be a list"),
        ({"entry": {"shape": NESTED}}, "shape: must be a list of non-negative integers"),
        (
            {"parameters": {"deadline_ms": NESTED}},
            "parameters.deadline_ms: must be a positive number",
        ),
    ],
    ids=["outputs-int", "outputs-bool", "outputs-float", "shape-nested", "deadline-nested"],
)
def test_the_former_500s_are_400_json(
    served: tuple[ServerThread, str], fields: dict[str, Any], message: str
) -> None:
    body, _ = infer_with(**fields)
    status, headers, answer = exchange(served[1], raw_request("POST", INFER, body, AUTH, close=True))
    assert status == 400 and message in json_error_of(status, headers, answer)
    assert_serves(served[1])


def test_a_bearer_header_that_is_not_utf8_is_401_json_on_both_http_listeners(
    served: tuple[ServerThread, str],
) -> None:
    srv, url = served
    assert srv.net.metrics_url is not None
    for where, path in ((url, "/v2/models/tiny_a"), (srv.net.metrics_url, "/metrics")):
        raw = (
            f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
            + b"Authorization: Bearer \xff\r\n\r\n"
        )
        status, headers, body = exchange(where, raw)
        assert status == 401 and "bearer token" in json_error_of(status, headers, body), where
        assert headers["www-authenticate"].startswith("Bearer")
    assert_serves(url)


# -- unparsable requests: JSON, no traceback, counted (issue item 5) ----------------------------------------

UNPARSABLE = b"POST /v2/models/tiny_a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"  # 76 bytes


def test_unparsable_requests_are_400_json_logged_at_debug_without_a_traceback_and_counted(
    served: tuple[ServerThread, str], caplog: pytest.LogCaptureFixture
) -> None:
    srv, url = served
    assert srv.net.metrics_url is not None
    before = scrape(srv)
    with caplog.at_level(logging.DEBUG):
        for where in (url, srv.net.metrics_url):
            with connect(where) as sock:
                sock.sendall(UNPARSABLE)
                status, headers, body = read_response(sock)
                assert sock.recv(1) == b""  # and closed
            message = json_error_of(status, headers, body)
            assert status == 400 and message == "bad HTTP request: Invalid character in Content-Length: " + (
                "b'Content-Length: abc'"
            )
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING], [
        (r.name, r.getMessage()) for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING
    ]
    lines = [r.getMessage() for r in caplog.records if "bad HTTP request" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "bad HTTP request" in r.getMessage())
    after = scrape(srv)
    for listener in ("http", "metrics"):
        moved = value(after, "edgeserve_http_bad_requests_total", listener=listener) - value(
            before, "edgeserve_http_bad_requests_total", listener=listener
        )
        assert moved == 1, listener
    assert_serves(url)


def test_metrics_answers_unknown_paths_and_methods_in_the_json_error_shape(
    served: tuple[ServerThread, str],
) -> None:
    srv = served[0]
    assert srv.net.metrics_url is not None
    for raw, expected in (
        (raw_request("GET", "/nothing", headers=AUTH, close=True), 404),
        (raw_request("POST", "/metrics", headers=AUTH, close=True), 405),
        (raw_request("GET", "/metrics", close=True), 401),
    ):
        status, headers, body = exchange(srv.net.metrics_url, raw)
        assert status == expected and json_error_of(status, headers, body)


# -- connection caps and timeouts (issue items 2, 4) ---------------------------------------------------------

LIMITS = {
    "http_max_connections": 6,
    "http_max_connections_per_listener": 4,  # a flood on the OIP port leaves 2 to /metrics
    "http_header_timeout_s": 0.6,
    "http_keepalive_timeout_s": 0.6,
    "http_body_timeout_s": 0.5,
    "http_body_min_rate": 16 * MiB,  # a 1 MiB body: 0.5 + 1/16 s
}


@pytest.fixture(scope="module")
def limited(served_root: Path) -> Iterator[tuple[ServerThread, str]]:
    listen = {"token": TOKEN, "tcp": "127.0.0.1:0", **LIMITS}
    config = {**oip_config(served_root, **listen), "metrics": {"listen": "127.0.0.1:0"}}
    with oip_server(config) as pair:
        yield pair


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_idle_connections_past_the_cap_are_refused_503_and_the_rest_time_out(
    limited: tuple[ServerThread, str],
) -> None:
    """A flood of idle connections on the OIP port: past its listener's cap each is answered 503
    and closed at once; /metrics and the socket front keep serving; the admitted ones get a 408
    at the header timeout, after which HTTP serves again."""
    srv, url = limited
    before = scrape(srv)
    idle = [connect(url) for _ in range(4)]
    time.sleep(0.1)  # admitted, idle
    refused = [connect(url) for _ in range(10)]
    for sock in refused:
        status, headers, body = read_response(sock)
        assert status == 503 and "too many HTTP connections" in json_error_of(status, headers, body)
        assert headers["retry-after"] == "1"
        assert sock.recv(1) == b""  # closed
        sock.close()
    # /metrics still has its share of the cap (this scrape is its connection)
    assert value(scrape(srv), "edgeserve_http_open_connections", listener="http") == 4
    sock = raw_connect(srv.tcp_url)  # the socket front is untouched by the HTTP flood
    sock.sendall(hello_frame(TOKEN))
    assert read_frame(sock)["type"] == "hello"  # type: ignore[index]
    sock.sendall(encode_frame(valid_infer(1)))
    assert read_frame(sock)["status"] == "ok"  # type: ignore[index]
    sock.close()
    for conn in idle:  # the header timeout (0.6 s) closes them with a 408
        status, headers, body = read_response(conn)
        assert status == 408 and "not received within 0.6 s" in json_error_of(status, headers, body)
        conn.close()
    wait_for(lambda: value(scrape(srv), "edgeserve_http_open_connections", listener="http") == 0)
    assert_serves(url)
    after = scrape(srv)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("edgeserve_http_refused_connections_total", listener="http") == 10
    assert moved("edgeserve_http_timeouts_total", listener="http", kind="header") == 4


def test_a_trickled_request_head_is_cut_off_at_the_header_timeout(limited: tuple[ServerThread, str]) -> None:
    url = limited[1]
    head = raw_request("GET", "/v2/health/live", headers={"X-Slow": "a" * 200})
    started = time.monotonic()
    with connect(url) as sock:
        try:
            for byte in head[:-4]:  # never finished: slowloris
                sock.send(bytes([byte]))
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status = read_response(sock)[0]
    assert status in (0, 408), status  # 0: the 408 was lost to a reset while we still sent
    assert time.monotonic() - started < 0.6 + 1.0
    assert_serves(url)


def test_an_idle_kept_alive_connection_is_closed_at_the_keepalive_timeout(
    limited: tuple[ServerThread, str],
) -> None:
    srv, url = limited
    before = scrape(srv)
    with connect(url) as sock:
        sock.sendall(raw_request("POST", INFER, GOOD, AUTH))
        assert read_response(sock)[0] == 200
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closes it
        assert 0.4 < time.monotonic() - started < 2.0
    after = scrape(srv)
    kept = value(after, "edgeserve_http_timeouts_total", listener="http", kind="keepalive")
    assert kept == value(before, "edgeserve_http_timeouts_total", listener="http", kind="keepalive") + 1


def test_half_sent_bodies_hold_nothing_past_their_body_timeout(limited: tuple[ServerThread, str]) -> None:
    """Connections declaring 1 MiB bodies and sending all but one byte are answered 408 after
    0.5 s + 1 MiB / 16 MiB/s and closed; the decode budget they held is free again."""
    srv, url = limited
    before = scrape(srv)
    socks = []
    for _ in range(3):
        sock = connect(url)
        body = b"x" * MiB
        sock.sendall(raw_request("POST", INFER, body, AUTH)[:-1])
        socks.append(sock)
    time.sleep(0.2)
    assert value(scrape(srv), "edgeserve_http_decode_bytes") > 0
    for sock in socks:
        status, headers, answer = read_response(sock)
        assert status == 408 and "request body not received" in json_error_of(status, headers, answer)
        sock.close()
    wait_for(lambda: value(scrape(srv), "edgeserve_http_open_connections", listener="http") == 0)
    after = scrape(srv)
    assert value(after, "edgeserve_http_decode_bytes") == 0
    timeouts = value(after, "edgeserve_http_timeouts_total", listener="http", kind="body")
    assert timeouts == value(before, "edgeserve_http_timeouts_total", listener="http", kind="body") + 3
    assert_serves(url)


def test_large_bodies_past_the_decode_budget_are_refused_503(served_root: Path) -> None:
    listen = {"token": TOKEN, "http_decode_budget_bytes": 4 * MiB, "http_body_timeout_s": 5.0}
    config = {**oip_config(served_root, **listen), "metrics": {"listen": "127.0.0.1:0"}}
    with oip_server(config) as (srv, url):
        holder = connect(url)  # charged 3 x 1 MiB while it is read: the budget's first body
        holder.sendall(raw_request("POST", INFER, b"x" * MiB, AUTH)[: MiB // 2])
        wait_for(lambda: value(scrape(srv), "edgeserve_http_decode_bytes") > 0)
        status, headers, body = exchange(url, raw_request("POST", INFER, b"y" * MiB, AUTH, close=True))
        assert status == 503 and "listen.http_decode_budget_bytes" in json_error_of(status, headers, body)
        assert headers["retry-after"] == "1"
        assert_serves(url)  # small requests are never charged
        holder.close()
        wait_for(lambda: value(scrape(srv), "edgeserve_http_decode_bytes") == 0)
        assert value(scrape(srv), "edgeserve_http_decode_refused_total") == 1


# -- the derivations -------------------------------------------------------------------------------------


def test_the_http_caps_are_half_the_descriptors_the_socket_front_and_open_files_leave() -> None:
    assert derived_caps(1024, 30, 256) == (337, 252)  # (1024 - 30 - 64 - 256) / 2; 3/4 of it
    assert derived_caps(130, 30, 256) == (8, 6)  # the limit (open + 100): the floor
    assert derived_caps(1 << 20, 30, 256) == (1024, 768)  # plenty: the ceiling
    assert derived_caps(resource.RLIM_INFINITY, 30, 256) == (1024, 768)
    listen = ListenConfig()
    limits = HttpLimits.from_listen(listen, soft_limit=1024, open_fds=30)
    assert (limits.max_connections, limits.max_connections_per_listener) == (337, 252)
    assert limits.body_timeout(8 * MiB) == pytest.approx(10.0 + 32.0)  # floor + 8 MiB at 256 KiB/s
    explicit = HttpLimits.from_listen(ListenConfig(http_max_connections=40), soft_limit=1024, open_fds=30)
    assert (explicit.max_connections, explicit.max_connections_per_listener) == (40, 30)
    one = ListenConfig(http_max_connections_per_listener=500)
    assert HttpLimits.from_listen(one, soft_limit=1024, open_fds=30).max_connections == 500


def test_a_json_body_may_hold_what_the_models_inputs_need_and_is_charged_its_peak() -> None:
    spec = TensorSpec("x", (1, 8, 8))
    table = model_inputs("tiny_a", (spec,), (TensorSpec("logits", (5,)),), 64)
    # 64 samples of 64 values, nested [N][1][8][8]: 1 + 64 + 64 + 512 lists, and the envelope
    assert table.max_items == 64 * 64 + 1 + 64 + 64 + 512 + ENVELOPE_ITEMS + PER_INPUT_ITEMS
    assert charge(1000, 1000, table.max_items) == 0  # small: bounded by the connection cap instead
    assert charge(MiB, 200, table.max_items) == READ_COPIES * MiB + ITEM_BYTES * 100  # binary
    assert charge(MiB, MiB, table.max_items) == READ_COPIES * MiB + ITEM_BYTES * table.max_items  # JSON
    assert json_size(MiB, None) == MiB and json_size(MiB, "200") == 200 and json_size(MiB, "x") == MiB
    budget = DecodeBudget(100)
    assert budget.acquire(500)  # alone: let in whatever its charge, so large requests still go one at a time
    assert not budget.acquire(1) and budget.refused == 1
    budget.release(500)
    assert budget.acquire(60) and budget.acquire(40) and not budget.acquire(1)


def test_error_texts_quote_deep_and_long_client_values_shortly() -> None:
    deep: Any = 5
    for _ in range(5000):
        deep = [deep]
    assert clip(deep) == "[[[[[...]]]]]"
    assert clip(list(range(10**6))).endswith("...]") and len(clip(list(range(10**6)))) < 200
    assert clip("s" * 5000).endswith("...[cut, 5000 chars]")


SERVE_UNDER_A_LOW_FD_LIMIT = """
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
from net_support import server_thread
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
limit = len(os.listdir("/proc/self/fd")) + 130  # ~100 left once the server has started
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
with server_thread(json.loads(sys.argv[2])) as srv:
    left = limit - len(os.listdir("/proc/self/fd"))
    print(json.dumps({"urls": srv.net.urls, "metrics": srv.net.metrics_url, "left": left}), flush=True)
    sys.stdin.readline()
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_with_the_fd_limit_near_150_idle_connections_lock_out_neither_the_socket_front_nor_metrics(
    served_root: Path,
) -> None:
    """The issue's case: the descriptor limit ~100 above what the started server holds, 150 idle
    TCP connections to the OIP port. The derived caps (8 in all, 6 per listener) refuse all but
    6 at once (503 or a reset), the socket front and /metrics keep serving, and once the header
    timeout has closed the idle ones the OIP port serves again."""
    import subprocess
    import sys

    listen = {"token": TOKEN, "tcp": "127.0.0.1:0", "http_header_timeout_s": 1.0}
    config = {**oip_config(served_root, **listen), "metrics": {"listen": "127.0.0.1:0"}}
    tests = str(Path(__file__).resolve().parents[1])
    child = subprocess.Popen(
        [sys.executable, "-c", SERVE_UNDER_A_LOW_FD_LIMIT, tests, json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        started = json.loads(child.stdout.readline())
        assert 80 <= started["left"] <= 130, started
        url = next(u for u in started["urls"] if u.startswith("http://"))
        tcp = next(u for u in started["urls"] if u.startswith("tcp://"))
        flood = [connect(url) for _ in range(150)]
        time.sleep(0.3)
        answered = [read_response(sock) for sock in flood[6:]]
        assert all(status in (0, 503) for status, _, _ in answered)  # refused at once (or reset)
        sock = raw_connect(tcp)
        sock.sendall(hello_frame(TOKEN))
        assert read_frame(sock)["type"] == "hello"  # type: ignore[index]
        sock.sendall(encode_frame(valid_infer(1)))
        assert read_frame(sock)["status"] == "ok"  # type: ignore[index]
        sock.close()
        path = "/" + started["metrics"].split("/", 3)[3]
        assert exchange(started["metrics"], raw_request("GET", path, headers=AUTH, close=True))[0] == 200
        for sock in flood[:6]:  # the admitted ones: 408 at the header timeout
            assert read_response(sock)[0] == 408
        for sock in flood:
            sock.close()
        wait_for(lambda: exchange(url, raw_request("GET", "/v2/health/live", close=True))[0] == 200)
        assert_serves(url)
        child.stdin.close()
        assert child.wait(60) == 0
        assert child.stderr is not None
        assert "Too many open files" not in child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

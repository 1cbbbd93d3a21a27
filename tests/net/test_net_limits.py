"""Connection limits on real sockets and a real Server: the caps on connections (in total and per
listener), the pre-hello frame limit, the hello and idle timeouts, and the memory they bound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from net_support import (
    ServerThread,
    hello_frame,
    net_config,
    raw_connect,
    read_frame,
    read_until_closed,
    server_thread,
)
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.config.checks import ConfigError
from edgeserve.config.server import ListenConfig, ServerConfig
from edgeserve.net import frame_shape
from edgeserve.net import refusals as refusals_module
from edgeserve.net.frame_shape import FrameShapes
from edgeserve.net.settings import AdmissionSettings, FrontSettings, RefusalSettings
from edgeserve.wire import frames as frames_module
from edgeserve.wire.client import BlockingClient, ServerRefused
from edgeserve.wire.frames import HEADER, encode_frame
from edgeserve.wire.oip_client import OipClient, OipError
from edgeserve.wire.tensors import encode_tensor

HELLO_BYTES = 4096
# The counting periods outlast a slow machine ("lately", a record, the small window after a hold).
SLOW_MACHINE = FrontSettings(admission=AdmissionSettings(polite_s=30.0))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("limits") / "engines"
    return root, profiled_tiny_repository(root)


def _on_loop(srv: ServerThread, fn: Callable[[], Any]) -> Any:
    """fn() run on the server's loop (its Frontend is only touched there)."""

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), srv.loop).result(10)


def _buffered(srv: ServerThread) -> int:
    return int(_on_loop(srv, lambda: sum(len(c._buffer) for c in srv.net.frontend.connections)))


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < until, "timed out waiting for the server"
        time.sleep(0.01)


def test_defaults_are_documented_values() -> None:
    listen = ListenConfig()
    assert (listen.max_connections, listen.max_connections_per_listener) == (256, 192)
    assert (listen.max_hello_bytes, listen.hello_timeout_s, listen.idle_timeout_s) == (4096, 5.0, 300.0)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_connections", 0, "listen.max_connections: must be an integer >= 1"),
        ("max_connections_per_listener", "8", "listen.max_connections_per_listener: must be an integer"),
        ("max_hello_bytes", 16, "listen.max_hello_bytes: must be an integer >= 64"),
        ("hello_timeout_s", 0, "listen.hello_timeout_s: must be a positive number"),
        ("idle_timeout_s", -1, "listen.idle_timeout_s: must be a number >= 0"),
        ("idle_timeout_s", True, "listen.idle_timeout_s: must be a number >= 0"),
    ],
)
def test_limit_keys_are_checked(key: str, value: Any, message: str) -> None:
    data = {"models": {"m": {"slo_ms": 10}}, "listen": {"unix": "/tmp/x.sock", key: value}}
    with pytest.raises(ConfigError, match=message):
        ServerConfig.from_dict(data)


def test_idle_timeout_zero_turns_it_off() -> None:
    data = {"models": {"m": {"slo_ms": 10}}, "listen": {"unix": "/tmp/x.sock", "idle_timeout_s": 0}}
    assert ServerConfig.from_dict(data).listen.idle_timeout_s == 0.0


def test_oversized_header_before_the_hello_gets_an_error_and_others_are_served(
    served, tmp_path: Path
) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    with server_thread(net_config(config_dict(root), tmp_path)) as srv:
        with raw_connect(srv.tcp_url) as sock:
            sock.sendall(HEADER.pack(HELLO_BYTES + 1) + b"\0" * 100)
            messages = read_until_closed(sock)
        assert [m["type"] for m in messages] == ["error"]
        assert f"before the hello exceeds max_hello_bytes {HELLO_BYTES}" in messages[0]["error"]
        with BlockingClient(srv.unix_url) as good:
            assert good.infer("tiny_a", x, timeout=30).ok
        # a frame over max_hello_bytes right behind the hello, in the same write, is judged by
        # max_frame_bytes: the hello has been read by then (here: a wrong shape, answered `invalid`)
        big = np.zeros((4, 32, 32), dtype=np.float32)  # 16 KiB of data
        request = {"type": "infer", "id": 5, "model": "tiny_a", "tensor": encode_tensor(big)}
        with raw_connect(srv.tcp_url) as sock:
            sock.sendall(hello_frame() + encode_frame(request))
            assert read_frame(sock)["type"] == "hello"
            answer = read_frame(sock)
        assert (answer["id"], answer["status"]) == (5, "invalid")
        assert srv.stats().protocol_errors >= 1


def test_a_connection_without_a_hello_is_closed_after_hello_timeout(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    config = net_config(config_dict(root), tmp_path, hello_timeout_s=0.3)
    with server_thread(config) as srv:
        with raw_connect(srv.unix_url) as silent, raw_connect(srv.tcp_url) as partial:
            partial.sendall(HEADER.pack(200) + b"\0" * 10)  # a hello that never completes
            started = time.monotonic()
            closed = [read_until_closed(silent), read_until_closed(partial)]
            elapsed = time.monotonic() - started
        for messages in closed:
            assert [m["type"] for m in messages] == ["error"]
            assert "no hello within 0.3 s" in messages[0]["error"]
        assert 0.2 < elapsed < 5.0
        with BlockingClient(srv.tcp_url) as greeted:  # a greeted connection outlives hello_timeout_s
            time.sleep(0.6)
            assert greeted.infer("tiny_a", x, timeout=30).ok
        _wait_for(lambda: srv.stats().open_connections == 0)
        stats = srv.stats()
    assert stats.timed_out_connections == 2
    assert stats.protocol_errors == 0


def test_a_greeted_idle_connection_is_closed_after_idle_timeout(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    factory = HookedFactory(delay_s=0.8)  # a request in flight longer than the idle timeout
    config = net_config(config_dict(root), tmp_path, idle_timeout_s=0.3)
    with server_thread(config, factory) as srv:
        with raw_connect(srv.unix_url) as sock:
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
            started = time.monotonic()
            messages = read_until_closed(sock)
            elapsed = time.monotonic() - started
        assert [m["type"] for m in messages] == ["error"]
        assert "idle for 0.3 s with nothing in flight" in messages[0]["error"]
        assert 0.2 < elapsed < 5.0
        with raw_connect(srv.tcp_url) as sock:  # busy is not idle: the slow answer arrives
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
            request = {"type": "infer", "id": 1, "model": "tiny_a", "tensor": encode_tensor(x)}
            sock.sendall(encode_frame(request))
            answer = read_frame(sock)
            assert (answer["id"], answer["status"]) == (1, "ok")
            after = read_until_closed(sock)  # then, idle, it is closed
        assert [m["type"] for m in after] == ["error"]
        _wait_for(lambda: srv.stats().open_connections == 0)
        assert srv.stats().timed_out_connections == 2


def test_connections_over_the_total_cap_are_refused_and_the_others_stay_usable(
    served, tmp_path: Path
) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    config = net_config(config_dict(root), tmp_path, max_connections=3)
    with server_thread(config) as srv:
        clients = [BlockingClient(srv.unix_url), BlockingClient(srv.tcp_url), BlockingClient(srv.unix_url)]
        try:
            with raw_connect(srv.tcp_url) as extra:
                messages = read_until_closed(extra)
            assert [m["type"] for m in messages] == ["error"]
            assert messages[0]["error"].startswith("too many connections (3); ")
            with pytest.raises(ServerRefused, match="too many connections"):
                BlockingClient(srv.unix_url)
            for client in clients:
                assert client.infer("tiny_a", x, timeout=30).ok
            stats = srv.stats()
            assert (stats.refused_connections, stats.open_connections, stats.connections) == (2, 3, 3)
        finally:
            clients.pop().close()
        _wait_for(lambda: srv.stats().open_connections == 2)
        with BlockingClient(srv.tcp_url) as again:  # a freed slot is usable again
            assert again.infer("tiny_a", x, timeout=30).ok
        for client in clients:
            client.close()


def test_connections_over_the_per_listener_cap_are_refused_on_that_listener_only(
    served, tmp_path: Path
) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    config = net_config(config_dict(root), tmp_path, max_connections=10, max_connections_per_listener=2)
    with server_thread(config) as srv:
        with BlockingClient(srv.tcp_url) as a, BlockingClient(srv.tcp_url) as b:
            with pytest.raises(ServerRefused, match=r"too many connections on this listener \(2\)"):
                BlockingClient(srv.tcp_url)
            with BlockingClient(srv.unix_url) as local, BlockingClient(srv.unix_url) as local2:
                for client in (a, b, local, local2):
                    assert client.infer("tiny_a", x, timeout=30).ok
        assert srv.stats().refused_connections == 1


def test_unauthenticated_connections_buffer_a_hello_not_a_frame(served, tmp_path: Path) -> None:
    """The attack of the finding: 64 connections that announce big frames and send their bodies
    without a hello. Each may hold at most max_hello_bytes + 4 bytes (docs/protocol.md)."""
    root, _ = served
    count = 64
    bound = count * (HELLO_BYTES + HEADER.size)  # 64 x 4 KiB: 256 KiB (it was 64 x 8 MiB)
    config = net_config(config_dict(root), tmp_path, hello_timeout_s=2.0, token="s3cret")
    with server_thread(config) as srv:
        # 1. bodies of 1 MiB announced: refused at the header, the rest read and discarded
        senders = [raw_connect(srv.tcp_url) for _ in range(count)]
        try:
            for sock in senders:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed first: fine
                    sock.sendall(HEADER.pack(1 << 20) + b"\0" * (1 << 20))
                assert _buffered(srv) <= bound
            for sock in senders:
                messages = read_until_closed(sock)
                assert [m["type"] for m in messages] == ["error"]
                assert "before the hello exceeds max_hello_bytes" in messages[0]["error"]
        finally:
            for sock in senders:
                sock.close()
        _wait_for(lambda: srv.stats().open_connections == 0)
        # 2. frames just under the limit that never complete: held until hello_timeout_s, bounded
        holders = [raw_connect(srv.unix_url) for _ in range(count)]
        try:
            for sock in holders:
                sock.sendall(HEADER.pack(HELLO_BYTES) + b"\0" * (HELLO_BYTES - 1))
            _wait_for(lambda: _buffered(srv) == count * (HELLO_BYTES + HEADER.size - 1))
            assert _buffered(srv) <= bound
            for sock in holders:
                sock.settimeout(10.0)
                messages = read_until_closed(sock)
                assert [m["type"] for m in messages] == ["error"] and "no hello" in messages[0]["error"]
        finally:
            for sock in holders:
                sock.close()
        _wait_for(lambda: srv.stats().open_connections == 0)
        assert _buffered(srv) == 0
        stats = srv.stats()
    assert stats.timed_out_connections == count
    assert stats.protocol_errors == count


def test_refused_connections_hold_no_slot(served, tmp_path: Path) -> None:
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_connections=1)
    with server_thread(config) as srv, raw_connect(srv.unix_url) as first:
        first.sendall(hello_frame())
        assert read_frame(first)["type"] == "hello"
        for _ in range(5):
            with socket.socket(socket.AF_UNIX) as extra:
                extra.settimeout(10)
                extra.connect(srv.unix_url.removeprefix("unix://"))
                assert "too many connections (1)" in read_until_closed(extra)[0]["error"]
        stats = srv.stats()
        assert (stats.open_connections, stats.refused_connections) == (1, 5)
        assert _on_loop(srv, lambda: dict(srv.net.frontend.per_listener)) == {"unix": 1}


def _flood(sock: socket.socket, first_id: int, count: int) -> None:
    sock.sendall(_flood_bytes(first_id, count))


def _flood_bytes(first_id: int, count: int) -> bytes:
    x = encode_tensor(np.zeros((1, 8, 8), np.float32))
    return b"".join(
        encode_frame({"type": "infer", "id": first_id + k, "model": "tiny_a", "tensor": x})
        for k in range(count)
    )


@contextlib.contextmanager
def _beside_a_polite_client(
    config: ServerConfig, settings: FrontSettings | None = None
) -> Iterator[tuple[Any, socket.socket, socket.socket]]:
    """A server, a connection to flood it (UNIX) and a polite one (TCP) that has been served once,
    so that it counts as a client sending within its window."""
    with (
        server_thread(config, settings=settings) as srv,
        raw_connect(srv.unix_url) as flood,
        raw_connect(srv.tcp_url) as polite,
    ):
        for sock in (flood, polite):
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
        polite.sendall(encode_frame(valid_request(0)))
        assert read_frame(polite)["status"] == "ok"
        yield srv, flood, polite


def _answers(sock: socket.socket, count: int) -> dict[int, str]:
    got: dict[int, str] = {}
    while len(got) < count:
        message = read_frame(sock)
        assert message is not None, f"closed after {len(got)} of {count} answers"
        assert message["id"] not in got, "an id was answered twice"
        got[message["id"]] = message["status"]
    return got


def _results_while_sending(sock: socket.socket, data: bytes, count: int) -> dict[int, dict[str, Any]]:
    """Send `data` from another thread (a flood the server reads while it answers) and take
    `count` results, by id, each exactly once."""
    sender = threading.Thread(target=sock.sendall, args=(data,))
    sender.start()
    answers: dict[int, dict[str, Any]] = {}
    while len(answers) < count:
        message = read_frame(sock)
        assert message is not None and message["type"] == "result", message
        assert message["id"] not in answers, "an id was answered twice"
        answers[message["id"]] = message
    sender.join()
    return answers


@contextlib.contextmanager
def _one_request_running(served, tmp_path: Path) -> Iterator[tuple[ServerThread, socket.socket]]:
    """A server allowing 3 in flight, and a greeted connection whose request 0 runs for 0.5 s (it
    holds a place while the test's frames arrive)."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=3, share_total=False)
    with server_thread(config, HookedFactory(delay_s=0.5)) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        sock.sendall(encode_frame(valid_request(0)))
        _wait_for(lambda: _on_loop(srv, lambda: srv.net.frontend.in_flight) == 1)
        yield srv, sock


def test_the_newest_frames_of_a_read_take_the_window_and_the_older_ones_are_refused(
    served, tmp_path: Path
) -> None:
    """Latest-frame semantics: with room for two more requests, a read that brings thirty serves
    the last two; the older twenty-eight are answered `rejected` at once, each exactly once."""
    with _one_request_running(served, tmp_path) as (_, sock):
        _flood(sock, 1, 30)  # one write: one read on the server's side
        answers = _answers(sock, 31)
    assert sorted(answers) == list(range(31))
    assert sorted(k for k, status in answers.items() if status == "ok") == [0, 29, 30]
    assert set(answers.values()) == {"ok", "rejected"}


def test_an_incomplete_frame_after_the_newest_ones_waits_for_its_last_bytes(served, tmp_path: Path) -> None:
    """The newest frames of a read are served up to the last complete one: a frame still arriving
    is not read from the bytes it has so far, even where those already hold a whole request."""
    body = encode_frame(valid_request(31))[HEADER.size :]
    with _one_request_running(served, tmp_path) as (_, sock):
        sock.sendall(_flood_bytes(1, 30) + HEADER.pack(len(body) + 1) + body)  # one byte short
        answers = _answers(sock, 31)
        assert sorted(answers) == list(range(31))
        sock.sendall(b"\xc0")  # the frame now holds two msgpack values: unreadable
        message = read_frame(sock)
    assert message is not None and message["type"] == "error", message


def test_frames_older_than_the_served_ones_stay_refused_while_their_refusals_wait_a_turn(
    served, tmp_path: Path
) -> None:
    """A full window's refusals wait for the next loop turn (other connections' newest frames go
    first). If the window opens before they run, the frames older than those served are still
    refused, never served late; every id gets exactly one answer."""
    with _one_request_running(served, tmp_path) as (srv, sock):
        flood = _flood_bytes(1, 30)

        def read_then_widen() -> tuple[int, int]:
            frontend = srv.net.frontend
            (connection,) = frontend.connections
            connection.data_received(flood)  # one read of thirty frames, as the socket brings them
            left = (frontend.in_flight, frontend.refusing)
            frontend.listen = dataclasses.replace(frontend.listen, max_in_flight=64)  # room opens
            return left

        assert _on_loop(srv, read_then_widen) == (3, 1)  # two served, the rest left for a turn
        answers = _answers(sock, 31)
        assert _on_loop(srv, lambda: srv.net.frontend.refusing) == 0
    assert sorted(k for k, status in answers.items() if status == "ok") == [0, 29, 30]
    assert sorted(answers) == list(range(31)) and set(answers.values()) == {"ok", "rejected"}


def test_a_read_of_more_frames_than_a_turn_handles_refuses_none_while_the_window_has_room(
    served, tmp_path: Path
) -> None:
    """Only a full window makes the newest frames of a read go first and the older ones refused:
    when the turn's limit (frames_per_turn) is what binds, the rest is read in order next turn."""
    root, _ = served
    count = 2 * FrontSettings().frames_per_turn  # within the model's max_queue (64)
    config = net_config(config_dict(root), tmp_path, max_in_flight=4 * count)
    with server_thread(config) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        _flood(sock, 0, count)  # one write: a read brings more frames than a turn handles
        answers = _answers(sock, count)
    assert sorted(answers) == list(range(count)) and set(answers.values()) == {"ok"}, answers


@pytest.mark.parametrize("share_total, window", [(True, 8), (False, 2)])
def test_a_client_alone_may_fill_the_in_flight_total(
    served, tmp_path: Path, share_total: bool, window: int
) -> None:
    """[listen] share_total: below max_in_flight_total (by default 4 windows of 2 here) a client
    alone has the whole total for its window, so one pipelining client can keep the executor
    batching; with it off, max_in_flight binds. Either way the newest frames take the window."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=2, share_total=share_total)
    with server_thread(config, HookedFactory(delay_s=0.3)) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        hello = read_frame(sock)
        assert hello["type"] == "hello" and hello["max_in_flight"] == 2  # the advertised window
        _flood(sock, 0, 12)  # one write: one read on the server's side
        answers = _answers(sock, 12)
    assert sorted(k for k, status in answers.items() if status == "ok") == list(range(12 - window, 12))
    assert set(answers.values()) == {"ok", "rejected"}


def test_a_flood_past_its_window_is_left_unread_while_a_polite_client_is_served(
    served, tmp_path: Path
) -> None:
    """The flood's frames stay in the kernel for a while (flood_pauses), the polite client's requests
    are served, and every frame of the flood still gets exactly one answer."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=2)
    sent = 600
    with _beside_a_polite_client(config) as (srv, flood, polite):
        _flood(flood, 1_000, sent)
        statuses = []
        for k in range(1, 6):
            polite.sendall(encode_frame(valid_request(k)))
            statuses.append(read_frame(polite)["status"])
        answers = _answers(flood, sent)
        assert statuses == ["ok"] * 5
        assert sorted(answers) == list(range(1_000, 1_000 + sent))
        assert set(answers.values()) <= {"ok", "rejected"} and "rejected" in answers.values()
        assert srv.stats().flood_pauses >= 1


def test_a_client_over_its_window_by_less_than_flood_ratio_times_is_not_held_beside_a_polite_one(
    served, tmp_path: Path
) -> None:
    """A connection that sends more than its window lets through, but not flood_ratio times more
    (one of several sending more than its even share), keeps being read: a hold would make its
    client's frames stale and leave the executor idle beside a client that cannot keep it busy."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=16, share_total=False)
    with _beside_a_polite_client(config, SLOW_MACHINE) as (srv, busy, _polite):
        for k in range(4):  # 40 frames a read, window 16: at most 24 refused, 16 or more accepted
            _flood(busy, 1_000 + 100 * k, 40)
            assert len(_answers(busy, 40)) == 40
        assert srv.stats().flood_pauses == 0
        # past flood_ratio times what it got (~80 accepted so far): a flood, held
        _flood(busy, 2_000, 1_000)
        assert len(_answers(busy, 1_000)) == 1_000
        assert srv.stats().flood_pauses >= 1


def test_a_flood_is_held_for_a_polite_client_over_http_too(served, tmp_path: Path) -> None:
    """The hold counts the HTTP front's clients beside the connections (admission.PeerFront):
    alone, the flood is not held; beside a client sending over HTTP it is, and every frame of it
    still gets exactly one answer. Before, an HTTP client never counted, and beside a socket flood
    at 10x its P50 tripled (a 10 ms deadline: 28 % in time, 98 % now)."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=2, http="127.0.0.1:0")
    with server_thread(config, settings=SLOW_MACHINE) as srv, raw_connect(srv.unix_url) as flood:
        flood.sendall(hello_frame())
        assert read_frame(flood)["type"] == "hello"
        assert len(_results_while_sending(flood, _flood_bytes(1_000, 600), 600)) == 600
        assert srv.stats().flood_pauses == 0  # nobody else sends: no hold

        url = next(u for u in srv.net.urls if u.startswith("http://"))
        statuses: list[int] = []
        stop = threading.Event()

        async def polite() -> None:
            async with OipClient(url) as client:
                while not stop.is_set():
                    try:
                        reply = await client.infer("tiny_a", {"x": np.zeros((1, 1, 8, 8), np.float32)})
                        statuses.append(reply.status)
                    except OipError as exc:
                        statuses.append(exc.status or -1)

        sender = threading.Thread(target=asyncio.run, args=(polite(),))
        sender.start()
        try:
            _wait_for(lambda: len(statuses) >= 3)
            answers = _results_while_sending(flood, _flood_bytes(2_000, 3_000), 3_000)
        finally:
            stop.set()
            sender.join(10)
        assert sorted(answers) == list(range(2_000, 5_000))
        assert {m["status"] for m in answers.values()} <= {"ok", "rejected"}
        assert srv.stats().flood_pauses >= 1
        assert statuses and set(statuses) == {200}


def test_a_flood_beside_another_flood_is_not_held(served, tmp_path: Path) -> None:
    """Holds serve the polite clients only when one client floods: beside another flood every
    held one's frames would go stale and the executor idle. Each flood keeps being read, with a
    window of shared_flood_window while a polite client is around."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=4)
    with (
        server_thread(config, settings=SLOW_MACHINE) as srv,
        raw_connect(srv.unix_url) as first,
        raw_connect(srv.unix_url) as second,
        raw_connect(srv.tcp_url) as polite,
    ):
        for sock in (first, second, polite):
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
        polite.sendall(encode_frame(valid_request(0)))
        assert read_frame(polite)["status"] == "ok"
        _flood(first, 1_000, 600)  # the only flood beside a polite client: held
        assert len(_answers(first, 600)) == 600
        held = srv.stats().flood_pauses
        assert held >= 1
        _flood(first, 2_000, 4)  # still sending (a client silent for a second does not count)
        _flood(second, 5_000, 600)  # the first flooded lately: no hold for this one
        assert len(_answers(second, 600)) == 600
        assert len(_answers(first, 4)) == 4
        assert srv.stats().flood_pauses == held
        second.sendall(b"".join(encode_frame(valid_request(k)) for k in range(4)))
        answers = [read_frame(second) for _ in range(4)]
    refused = [
        a for a in answers if a["status"] == "rejected" and "too many requests in flight" in a["error"]
    ]
    assert len(refused) == 4 - SLOW_MACHINE.admission.shared_flood_window, answers


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_a_flood_of_mixed_frames_is_refused_by_shape_each_with_its_own_id_model_and_priority(
    served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    """Frames past the window that share a learned layout are refused a block at a time
    (net.frame_shape, compiled or numpy); interleaved models and priorities and ids crossing
    msgpack's widths (127, 255, 65535) get exactly one answer each, naming the model and echoing
    the priority sent."""
    if compiled and frame_shape.compiled_refuse is None:
        pytest.skip("edgeserve.net._shapes is not built")
    if not compiled:
        monkeypatch.setattr(frame_shape, "compiled_refuse", None)
    matched: list[int] = []
    refuse = FrameShapes.refuse

    def counting(self: FrameShapes, block: Any, length: int, answer: Any) -> Any:
        count, answers = refuse(self, block, length, answer)
        matched.append(count)
        return count, answers

    monkeypatch.setattr(FrameShapes, "refuse", counting)
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=1)
    x = encode_tensor(np.zeros((1, 8, 8), np.float32))
    kinds = [("tiny_a", 1), ("tiny_a", 2), ("tiny_a", -5), ("tiny_x", 1)]  # frames of one length
    rng = np.random.default_rng(3)
    sent: dict[int, tuple[str, int]] = {}
    frames = []
    for request_id in [*range(60, 1_060), *range(65_000, 66_000)]:
        model, priority = kinds[rng.integers(0, len(kinds))]
        sent[request_id] = (model, priority)
        fields = {"type": "infer", "id": request_id, "model": model, "tensor": x, "priority": priority}
        frames.append(encode_frame(fields))
    with server_thread(config) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        answers = _results_while_sending(sock, b"".join(frames), len(sent))
    assert sorted(answers) == sorted(sent)
    for request_id, (model, priority) in sent.items():
        answer = answers[request_id]
        assert answer["priority"] == priority, answer
        if answer["status"] == "rejected" and "too many requests in flight" in answer["error"]:
            assert answer["model"] == model, answer
    assert sum(matched) > len(sent) * 3 // 4, f"refused by shape: {sum(matched)} of {len(sent)}"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "decoded"])
def test_a_flood_whose_frames_vary_in_structure_is_refused_one_by_one_each_once(
    served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    """An int field that changes in every frame: no shape holds (the connection backs off from
    learning them), and every frame still gets exactly one answer, naming its model and echoing
    its priority, whether the refusal read its head with the compiled reader (a served model) or
    decoded the frame (an unknown model, a priority out of range, or no compiled reader)."""
    if compiled and frames_module._compiled_parse is None:
        pytest.skip("edgeserve.wire._infer is not built")
    heads: list[object] = []
    read_head = refusals_module.compiled_head

    def counted(*args: Any) -> Any:
        heads.append(read_head(*args) if compiled else None)
        return heads[-1]

    monkeypatch.setattr(refusals_module, "compiled_head", counted)
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=1)
    x = encode_tensor(np.zeros((1, 8, 8), np.float32))
    ids = range(70_000, 73_000)
    kinds = [("tiny_a", None), ("tiny_a", 3), ("tiny_a", -(2**31)), ("tiny_x", 1), ("tiny_a", 2**31)]
    sent = {k: kinds[k % len(kinds)] for k in ids}
    frames = b"".join(
        encode_frame(
            {
                "type": "infer",
                "id": k,
                "model": sent[k][0],
                "tensor": x,
                "deadline_ms": 5_000 + k % 97,
                **({} if sent[k][1] is None else {"priority": sent[k][1]}),
            }
        )
        for k in ids
    )
    with server_thread(config) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        answers = _results_while_sending(sock, frames, len(ids))
    assert sorted(answers) == list(ids)
    refused = 0
    for k, answer in answers.items():
        model, priority = sent[k]
        if answer["status"] == "rejected" and "too many requests in flight" in answer["error"]:
            refused += 1
            assert answer["model"] == model, answer
            assert answer["priority"] == (None if priority == 2**31 else priority), answer
        else:
            assert answer["status"] in {"ok", "invalid"}, answer
    assert refused > len(ids) // 2
    if compiled:  # the served model's frames with a priority in range were read by the compiled reader
        assert sum(head is not None for head in heads) > len(ids) // 4


def test_a_run_of_refusals_stops_at_a_frame_it_cannot_refuse_which_gets_its_own_answer(
    served, tmp_path: Path
) -> None:
    """Past its window a connection's frames are refused in one loop; a frame in the middle that
    is no infer with a valid id leaves that loop: a second hello gets `invalid` with its id, and
    an infer with no readable id closes the connection with an error, after every frame before
    it got exactly one answer. The window's room went to the newest frame of the read, 99, served
    before the older ones were read."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=1, share_total=False)
    hello_again = encode_frame({"type": "hello", "version": 1, "id": 50})
    no_id = encode_frame({"type": "infer", "id": "x", "model": "tiny_a"})
    with server_thread(config) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        burst = [encode_frame(valid_request(k)) for k in range(40)]
        after = encode_frame(valid_request(99))
        sock.sendall(b"".join([*burst[:20], hello_again, *burst[20:], no_id, after]))
        answers: dict[int, str] = {}
        while (message := read_frame(sock)) is not None and message["type"] == "result":
            assert message["id"] not in answers, "an id was answered twice"
            answers[message["id"]] = message["status"]
        assert message is not None and message["type"] == "error" and "id" in message["error"]
    assert sorted(answers) == [*range(40), 50, 99]
    assert answers[50] == "invalid" and answers[99] == "ok"
    assert {answers[k] for k in range(40)} == {"rejected"}


def test_the_frames_a_held_flood_has_already_sent_wait_for_the_hold_too(served, tmp_path: Path) -> None:
    """One read brings a flood's frames by the hundred: while it is held the loop leaves those in
    its buffer too (refusing them would cost the polite client the loop's time), and answers
    every one of them once the holds end."""
    defaults = RefusalSettings()
    settings = FrontSettings(
        admission=AdmissionSettings(flood_pause_s=0.3),
        # one read (256 KiB) holds fewer frames than a turn refuses by FrameShape: as many as one by one
        refusals=RefusalSettings(block_refusals_per_frame=defaults.refusals_per_frame),
    )
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=2)
    per_turn = settings.frames_per_turn * defaults.refusals_per_frame  # refusals
    sent = 3 * per_turn
    with _beside_a_polite_client(config, settings) as (srv, flood, _polite):
        _flood(flood, 1_000, sent)
        times = []
        for _ in range(sent):
            assert read_frame(flood) is not None
            times.append(time.monotonic())
        assert srv.stats().flood_pauses >= 2
    early = sum(t - times[0] < 0.15 for t in times)
    assert early <= 2 * per_turn, f"{early} of {sent} answered during the first hold"


def test_a_held_flood_gets_a_window_of_one_while_the_polite_client_is_around(served, tmp_path: Path) -> None:
    """Its requests then cannot fill the queue the polite client's requests wait in."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=4)
    with _beside_a_polite_client(config, SLOW_MACHINE) as (srv, flood, _polite):
        _flood(flood, 1_000, 300)
        assert len(_answers(flood, 300)) == 300 and srv.stats().flood_pauses >= 1
        flood.sendall(b"".join(encode_frame(valid_request(k)) for k in range(3)))
        answers = [read_frame(flood) for _ in range(3)]
    refused = [
        a for a in answers if a["status"] == "rejected" and "too many requests in flight" in a["error"]
    ]
    assert len(refused) == 2, answers


def test_a_client_a_few_frames_over_its_window_in_every_read_floods_too(served, tmp_path: Path) -> None:
    """Two clients over-sending alike: one bursts, the other is over its window by a few frames
    in each read. The second is not polite (flood_frames refused over the last periods), so the
    first is not held for its sake (at 2x load every connection is like this)."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=2, share_total=False)
    with (
        server_thread(config, settings=SLOW_MACHINE) as srv,
        raw_connect(srv.unix_url) as burst,
        raw_connect(srv.tcp_url) as steady,
    ):
        for sock in (burst, steady):
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
        for k in range(5):  # 6 frames a read, window 2: 4 refused each time, 20 in all
            steady.sendall(b"".join(encode_frame(valid_request(10 * k + i)) for i in range(6)))
            assert len(_answers(steady, 6)) == 6
        _flood(burst, 1_000, 300)
        assert len(_answers(burst, 300)) == 300
        assert srv.stats().flood_pauses == 0


def test_clients_that_all_flood_are_left_unread_at_most_until_each_has_been_seen_flooding(
    served, tmp_path: Path
) -> None:
    """With nobody polite to protect, frames are answered as they are read: only the first flood
    can be held, while the other client has not been seen flooding yet."""
    root, _ = served
    config = net_config(config_dict(root), tmp_path, max_in_flight=2)
    with server_thread(config) as srv, raw_connect(srv.unix_url) as one, raw_connect(srv.tcp_url) as two:
        for sock in (one, two):
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
        _flood(one, 0, 300)
        _flood(two, 0, 300)
        assert len(_answers(one, 300)) == 300 and len(_answers(two, 300)) == 300
        assert srv.stats().flood_pauses <= 1


def valid_request(request_id: int) -> dict[str, Any]:
    x = encode_tensor(np.zeros((1, 8, 8), np.float32))
    return {"type": "infer", "id": request_id, "model": "tiny_a", "tensor": x, "deadline_ms": 5000}

"""The socket front on real UNIX and TCP sockets, a real Server and tiny ONNX models."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from net_support import hello_frame, net_config, raw_connect, read_frame, read_until_closed, server_thread
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.config.server import PreprocessConfig
from edgeserve.loop import run
from edgeserve.net.frontend import Connection
from edgeserve.net.listeners import free_ports
from edgeserve.net.preprocess import preprocess_frame
from edgeserve.net.settings import AdmissionSettings, FrontSettings
from edgeserve.wire import frames
from edgeserve.wire.client import AsyncClient, BlockingClient, Reply, ServerRefused
from edgeserve.wire.frames import HEADER, TOO_MANY_IN_FLIGHT, encode_frame
from edgeserve.wire.tensors import encode_tensor


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("net") / "engines"
    return root, profiled_tiny_repository(root)


def _assert_reference(reply: Reply, tiny: TinyModel, x: np.ndarray) -> None:
    assert reply.status == "ok", reply.error
    assert reply.exit_index is not None and reply.output is not None
    assert reply.exit_name == tiny.manifest.exits[reply.exit_index].name
    np.testing.assert_allclose(reply.output, tiny.forward(x[None], reply.exit_index)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("transport", "compiled"), [("unix", True), ("tcp", True), ("unix", False)])
def test_pipelined_requests_get_their_own_reference_logits(
    served, tmp_path: Path, transport: str, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answers whether the compiled reader takes the requests (wire/_infer.c) or, on a
    machine without a C compiler, msgpack and fast_infer do."""
    if compiled and frames._compiled_parse is None:
        pytest.skip("the compiled reader is not built")
    read_by_c: list[object] = []
    parse = frames._compiled_parse
    if compiled:
        monkeypatch.setattr(
            frames, "_compiled_parse", lambda *args: read_by_c.append(parse(*args)) or read_by_c[-1]
        )
    else:
        monkeypatch.setattr(frames, "_compiled_parse", None)
    root, models = served
    xa, xb = models["tiny_a"].random_input(25, seed=1), models["tiny_b"].random_input(15, seed=2)
    with server_thread(net_config(config_dict(root), tmp_path)) as srv:
        url = srv.unix_url if transport == "unix" else srv.tcp_url

        async def main() -> list[Reply]:
            async with await AsyncClient.connect(url) as client:
                assert client.models["tiny_b"]["input"] == {"dtype": "float32", "shape": [3, 16, 16]}
                futures = [client.send("tiny_a", x, priority=i) for i, x in enumerate(xa)]
                futures += [client.send("tiny_b", x) for x in xb]
                return list(await asyncio.gather(*futures))

        replies = run(main())
    assert len({r.id for r in replies}) == 40
    for reply, x in zip(replies[:25], xa, strict=True):
        _assert_reference(reply, models["tiny_a"], x)
    for reply, x in zip(replies[25:], xb, strict=True):
        _assert_reference(reply, models["tiny_b"], x)
    assert [r.priority for r in replies[:25]] == list(range(25))
    assert all(r.timings["total_ms"] > 0 for r in replies)
    assert sum(found is not None for found in read_by_c) == (40 if compiled else 0)


def test_blocking_client_pipelines_from_one_thread(served, tmp_path: Path) -> None:
    root, models = served
    xs = models["tiny_a"].random_input(20, seed=5)
    with server_thread(net_config(config_dict(root), tmp_path)) as srv, BlockingClient(srv.tcp_url) as client:
        futures = [client.submit("tiny_a", x, deadline_ms=500) for x in xs]
        replies = [f.result(30) for f in futures]
        single = client.infer("tiny_a", xs[0], timeout=30)
    for reply, x in zip(replies, xs, strict=True):
        _assert_reference(reply, models["tiny_a"], x)
    _assert_reference(single, models["tiny_a"], xs[0])


def test_token_is_required_in_the_hello(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    with server_thread(net_config(config_dict(root), tmp_path, token="s3cret")) as srv:
        for token in (None, "wrong"):
            with pytest.raises(ServerRefused, match="authentication failed"):
                BlockingClient(srv.tcp_url, token=token)
        with BlockingClient(srv.unix_url, token="s3cret") as client:
            assert client.infer("tiny_a", x, timeout=30).ok
        assert srv.stats().refused_auth == 2


def test_requests_before_hello_get_an_error_and_a_closed_connection(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    request = {"type": "infer", "id": 1, "model": "tiny_a", "tensor": encode_tensor(x)}
    with server_thread(net_config(config_dict(root), tmp_path)) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(encode_frame(request))
        messages = read_until_closed(sock)
    assert [m["type"] for m in messages] == ["error"]
    assert "first message must be a hello" in messages[0]["error"]


def test_oversized_frame_gets_an_error_then_close_and_others_are_still_served(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    config = net_config(config_dict(root), tmp_path, max_frame_bytes=4096)
    with server_thread(config) as srv, BlockingClient(srv.unix_url) as good, raw_connect(srv.tcp_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        sock.sendall(HEADER.pack(4097) + b"\0" * 100)
        messages = read_until_closed(sock)
        assert good.infer("tiny_a", x, timeout=30).ok
        big = np.zeros((2048,), dtype=np.float32)  # 8 KiB of data: over the limit
        with pytest.raises(ConnectionError, match="exceeds max_frame_bytes"):
            good.infer("tiny_a", big, timeout=30)
    assert [m["type"] for m in messages] == ["error"]
    assert "exceeds max_frame_bytes 4096" in messages[0]["error"]


def test_requests_beyond_the_in_flight_limit_are_rejected_and_every_id_is_answered_once(
    served, tmp_path: Path
) -> None:
    root, models = served
    xs = models["tiny_a"].random_input(12, seed=8)
    factory = HookedFactory(delay_s=0.2)  # the first three are still running when the rest arrive
    config = net_config(config_dict(root), tmp_path, max_in_flight=3, share_total=False)
    with server_thread(config, factory) as srv:

        async def main() -> list[Reply]:
            async with await AsyncClient.connect(srv.unix_url, respect_window=False) as client:
                return list(await asyncio.gather(*(client.send("tiny_a", x) for x in xs)))

        replies = run(main())
    assert sorted(r.id for r in replies) == list(range(12))
    rejected = [r for r in replies if r.status == "rejected"]
    served_ok = [r for r in replies if r.status == "ok"]
    assert len(served_ok) >= 3 and len(rejected) >= 1
    assert len(served_ok) + len(rejected) == 12
    assert all(r.error == TOO_MANY_IN_FLIGHT for r in rejected)


def test_at_the_in_flight_total_each_connection_keeps_an_even_share(served, tmp_path: Path) -> None:
    """listen.max_in_flight_total: once the connections together have that many requests in
    flight, each may have no more than its even share of it, so a second greedy connection gets
    half the total (not max_in_flight) and the first, already at the total, gets no more."""
    root, models = served
    xs = models["tiny_a"].random_input(8, seed=9)
    factory = HookedFactory(delay_s=1.0)  # what is accepted stays in flight while both send
    config = net_config(config_dict(root), tmp_path, max_in_flight=4, max_in_flight_total=4)
    with server_thread(config, factory) as srv:

        async def main() -> tuple[list[Reply], list[Reply]]:
            async with (
                await AsyncClient.connect(srv.unix_url, respect_window=False) as first,
                await AsyncClient.connect(srv.tcp_url, respect_window=False) as second,
            ):
                sent_first = [first.send("tiny_a", x) for x in xs]
                done, _ = await asyncio.wait(sent_first, timeout=0.5)  # the refusals come at once
                assert len(done) == 4
                sent_second = [second.send("tiny_a", x) for x in xs]
                return list(await asyncio.gather(*sent_first)), list(await asyncio.gather(*sent_second))

        replies_first, replies_second = run(main())
    for replies, served_ok in ((replies_first, 4), (replies_second, 2)):
        assert sorted(r.id for r in replies) == list(range(8))  # every id answered once
        # (which ones are served depends on how the sends were read: the newest of a read first)
        assert sum(r.status == "ok" for r in replies) == served_ok
        assert all(r.error == TOO_MANY_IN_FLIGHT for r in replies if r.status != "ok")
        for reply, x in zip(replies, xs, strict=True):
            if reply.status == "ok":
                _assert_reference(reply, models["tiny_a"], x)


def test_a_light_client_keeps_its_whole_window_at_the_in_flight_total(served, tmp_path: Path) -> None:
    """A client with a record of requests accepted and almost none refused (FloodTally.light)
    is not cut to the even share when a greedy one fills max_in_flight_total: the share binds the
    busy clients, and a light one's bursts pass (a camera at 0.1x beside floods was refused
    a quarter of its frames at its share)."""
    admission = AdmissionSettings(polite_s=30.0)  # the record outlasts a slow machine
    root, models = served
    xs = models["tiny_a"].random_input(4, seed=9)
    factory = HookedFactory()
    config = net_config(config_dict(root), tmp_path, max_in_flight=4, max_in_flight_total=4)
    with server_thread(config, factory, FrontSettings(admission=admission)) as srv:

        async def main() -> list[Reply]:
            async with (
                await AsyncClient.connect(srv.unix_url, respect_window=False) as light,
                await AsyncClient.connect(srv.tcp_url, respect_window=False) as greedy,
            ):
                for _ in range(admission.light_track // len(xs)):  # its record: every request served
                    assert all(r.ok for r in await asyncio.gather(*(light.send("tiny_a", x) for x in xs)))
                assert factory.backend is not None
                factory.backend.delay_s = 1.0  # what is accepted now stays in flight a while
                greedy_sent = [greedy.send("tiny_a", x) for x in [*xs, *xs]]  # 4 taken: the total
                await asyncio.wait(greedy_sent, timeout=0.5)  # its refusals come at once
                replies = await asyncio.gather(*(light.send("tiny_a", x) for x in xs))
                await asyncio.gather(*greedy_sent)
                return list(replies)

        replies = run(main())
    assert [r.status for r in replies] == ["ok"] * len(xs), [r.error for r in replies]


def test_the_answers_of_one_batch_leave_in_one_write_per_connection(
    served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server.answers_together: a batch's answers to one connection are written at once (one
    syscall and one wake-up of its client, not one per answer), each with its own reference logits."""
    writes: list[int] = []  # answer frames per write of a held connection
    write_held = Connection.write_held

    def counting(self: Connection) -> None:
        writes.append(len(self._out))
        write_held(self)

    monkeypatch.setattr(Connection, "write_held", counting)
    root, models = served
    tiny = models["tiny_a"]
    xs = tiny.random_input(12, seed=5)
    factory = HookedFactory(delay_s=0.2)  # the rest queue behind the first batch, then go as one
    with server_thread(net_config(config_dict(root), tmp_path, max_in_flight=16), factory) as srv:

        async def main() -> list[Reply]:
            async with await AsyncClient.connect(srv.unix_url) as client:
                return list(await asyncio.gather(*(client.send("tiny_a", x) for x in xs)))

        replies = run(main())
    assert sorted(r.id for r in replies) == list(range(12))
    for reply, x in zip(sorted(replies, key=lambda r: r.id), xs, strict=True):
        _assert_reference(reply, tiny, x)
    assert factory.backend is not None
    biggest = max(size for _, _, size in factory.backend.spans)
    assert biggest > 1, factory.backend.spans
    assert max(writes) >= biggest, (writes, factory.backend.spans)
    assert len(writes) < 12, writes


def test_the_listen_reply_margin_is_kept_for_the_answers_way_back(served, tmp_path: Path) -> None:
    """[listen] reply_margin_ms: the scheduler plans a socket request that much before its deadline,
    so in expire mode a request stuck behind a long batch is answered `expired` that much earlier."""
    root, models = served
    x = models["tiny_a"].random_input(1)[0]
    factory = HookedFactory(delay_s=0.6)
    config = net_config(config_dict(root, late_tasks="expire"), tmp_path, reply_margin_ms=150)
    with server_thread(config, factory) as srv:

        async def main() -> tuple[Reply, float]:
            async with await AsyncClient.connect(srv.unix_url) as client:
                running = client.send("tiny_a", x)
                await asyncio.to_thread(factory.backend.entered.wait, 5)
                sent = time.monotonic()
                stuck = await client.send("tiny_a", x, deadline_ms=300)
                elapsed = time.monotonic() - sent
                await running
                return stuck, elapsed

        stuck, elapsed = run(main())
    assert stuck.status == "expired"
    assert 0.14 <= elapsed < 0.27  # planned to 150 ms, not to the request's 300 ms


def test_client_that_disconnects_mid_request_has_its_answers_discarded(served, tmp_path: Path) -> None:
    root, models = served
    xs = models["tiny_a"].random_input(5, seed=9)
    factory = HookedFactory(delay_s=0.5)  # answers come well after the client has gone
    with server_thread(net_config(config_dict(root), tmp_path), factory) as srv:
        with raw_connect(srv.tcp_url) as sock:
            sock.sendall(hello_frame())
            assert read_frame(sock)["type"] == "hello"
            frames = [
                encode_frame({"type": "infer", "id": i, "model": "tiny_a", "tensor": encode_tensor(x)})
                for i, x in enumerate(xs)
            ]
            sock.sendall(b"".join(frames))
            assert factory.backend is not None and factory.backend.entered.wait(10)
            until = time.monotonic() + 10
            while srv.stats().requests < 5 and time.monotonic() < until:
                time.sleep(0.01)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset on close
        deadline = time.monotonic() + 20
        while srv.stats().discarded < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = srv.stats()
        with BlockingClient(srv.unix_url) as other:
            assert other.infer("tiny_a", xs[0], timeout=30).ok
    assert stats.requests == 5 and stats.discarded == 5 and stats.open_connections == 0


def test_bad_field_gets_invalid_with_its_id_and_the_connection_stays_open(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    bad_size = {"dtype": "float32", "shape": [1, 8, 8], "data": b"\0" * 10}
    with server_thread(net_config(config_dict(root), tmp_path)) as srv, raw_connect(srv.unix_url) as sock:
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"
        sock.sendall(encode_frame({"type": "infer", "id": 7, "model": "tiny_a", "tensor": bad_size}))
        invalid = read_frame(sock)
        sock.sendall(encode_frame({"type": "infer", "id": 8, "model": "nope", "tensor": encode_tensor(x)}))
        unknown = read_frame(sock)
        sock.sendall(encode_frame({"type": "infer", "id": 9, "model": "tiny_a", "tensor": encode_tensor(x)}))
        good = read_frame(sock)
    assert (invalid["id"], invalid["status"]) == (7, "invalid")
    assert "tensor.data has 10 bytes" in invalid["error"]
    assert (unknown["id"], unknown["status"]) == (8, "invalid") and "unknown model" in unknown["error"]
    assert (good["id"], good["status"]) == (9, "ok")


def test_capture_timestamp_sets_the_budget_and_old_frames_expire_at_once(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    with (
        server_thread(net_config(config_dict(root), tmp_path)) as srv,
        BlockingClient(srv.unix_url) as client,
    ):
        fresh = client.infer("tiny_a", x, capture_ts=time.time(), timeout=30)
        stale = client.infer("tiny_a", x, capture_ts=time.time() - 5.0, timeout=30)
    assert fresh.ok
    assert stale.status == "expired" and "past the 1000 ms SLO" in stale.error


def test_camera_frames_are_preprocessed_by_the_model_config(served, tmp_path: Path) -> None:
    root, models = served
    pre = {"resize": [16, 16], "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2], "channels": "bgr"}
    config = config_dict(root)
    config["models"]["tiny_b"]["preprocess"] = pre
    frame = np.random.default_rng(0).integers(0, 256, size=(40, 30, 3), dtype=np.uint8)
    expected_input = preprocess_frame(
        frame,
        PreprocessConfig(resize=(16, 16), mean=(0.5, 0.4, 0.3), std=(0.2,) * 3, channels="bgr"),
        (3, 16, 16),
    )
    with server_thread(net_config(config, tmp_path)) as srv, BlockingClient(srv.unix_url) as client:
        assert client.models["tiny_b"]["camera_input"]["channels"] == "bgr"
        reply = client.infer("tiny_b", frame, timeout=30)
        wrong = client.infer("tiny_b", frame[:, :, :1], timeout=30)
    _assert_reference(reply, models["tiny_b"], expected_input)
    assert wrong.status == "invalid" and "height x width x 3" in wrong.error


def test_tcp_connections_set_nodelay(served, tmp_path: Path) -> None:
    root, _ = served
    with server_thread(net_config(config_dict(root), tmp_path)) as srv:
        host, _port = srv.tcp_address
        assert host == "127.0.0.1"

        async def nodelay() -> int:
            conn = next(iter(srv.net.frontend.connections))
            assert conn.transport is not None
            return conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

        with BlockingClient(srv.tcp_url):
            value = asyncio.run_coroutine_threadsafe(nodelay(), srv.loop).result(10)
    assert value != 0


def test_a_client_that_does_not_read_is_paused_and_does_not_stall_others(served, tmp_path: Path) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    tensor = encode_tensor(x)
    n = 3000  # far more answers than the kernel's socket buffers plus the 4 KiB high-water mark hold
    frames = b"".join(
        encode_frame({"type": "infer", "id": i, "model": "tiny_a", "tensor": tensor}) for i in range(n)
    )
    config = net_config(config_dict(root), tmp_path, max_in_flight=n)
    with server_thread(config) as srv, raw_connect(srv.unix_url, timeout=60) as slow:
        srv.net.frontend.write_high_water = 4096
        slow.sendall(hello_frame())
        assert read_frame(slow)["type"] == "hello"

        async def shrink_send_buffers() -> None:
            """Small buffers, so the answers back up whatever their size (under load many are short
            `rejected` frames). The connection may have been made before write_high_water was set."""
            for connection in srv.net.frontend.connections:
                assert connection.transport is not None
                connection.transport.set_write_buffer_limits(high=4096)
                sock = connection.transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        asyncio.run_coroutine_threadsafe(shrink_send_buffers(), srv.loop).result(10)
        sender = threading.Thread(target=lambda: slow.sendall(frames), daemon=True)
        sender.start()  # blocks once the server stops reading this connection

        async def paused() -> bool:
            return any(c.reading_paused for c in srv.net.frontend.connections)

        deadline = time.monotonic() + 20
        while not (was_paused := asyncio.run_coroutine_threadsafe(paused(), srv.loop).result(10)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        with BlockingClient(srv.tcp_url) as other:
            assert other.infer("tiny_a", x, timeout=30).ok
        answers = [read_frame(slow) for _ in range(n)]  # reading resumes the server's reading
        sender.join(30)
    assert was_paused and not sender.is_alive()
    assert all(a is not None and a["type"] == "result" for a in answers)
    # Each request answered once and every frame whole, though the answers went partly straight
    # to the socket (Connection._transmit) and partly through the transport's buffer.
    assert sorted(a["id"] for a in answers) == list(range(n))
    assert {a["status"] for a in answers} <= {"ok", "rejected"}


def test_free_ports_are_distinct_and_free() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:  # nothing holds them once returned: each can be bound
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))

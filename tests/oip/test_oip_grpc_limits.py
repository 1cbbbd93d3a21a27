"""The gRPC listener under the HTTP listeners' caps and timeouts and the socket front's window
(oipgrpc/limits.py): a client past the connection cap, one that connects and sends nothing, an idle
one, and one with more RPCs at once than a connection's window. grpc core enforces them; these
tests check that it was told to, from outside, with real connections.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from net_support import ServerThread, server_thread
from oip_support import grpc_address, oip_config
from runtime_support import HookedFactory, profiled_tiny_repository

from edgeserve.config.http_limits import HttpLimits
from edgeserve.config.server import ListenConfig
from edgeserve.oipgrpc.limits import server_options

pytest.importorskip("tritonclient.grpc")
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a channel that shares no connection


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oip-grpc-limits") / "engines"
    profiled_tiny_repository(root)
    return root


def request(deadline_ms: float = 10_000.0) -> Any:
    message = service_pb2.ModelInferRequest(model_name="tiny_a")
    message.inputs.add(name="x", datatype="FP32", shape=[1, 1, 8, 8])
    message.raw_input_contents.append(b"\0" * 4 * 64)
    message.parameters["deadline_ms"].double_param = deadline_ms
    return message


def infer_on(channel: grpc.Channel) -> Callable[..., Any]:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer


def wait_until(done: Callable[[], bool], seconds: float = 10.0) -> bool:
    until = time.monotonic() + seconds
    while not done() and time.monotonic() < until:
        time.sleep(0.01)
    return done()


def test_the_options_are_the_http_listeners_limits_and_the_window() -> None:
    listen = ListenConfig(max_frame_bytes=1 << 20, http_header_timeout_s=2.5, http_keepalive_timeout_s=30)
    limits = HttpLimits.from_listen(listen, soft_limit=1024, open_fds=30)
    options = dict(server_options(listen, limits, 48))
    assert options == {
        "grpc.max_receive_message_length": 1 << 20,
        "grpc.max_send_message_length": 1 << 20,
        "grpc.max_allowed_incoming_connections": limits.max_connections_per_listener,
        "grpc.server_handshake_timeout_ms": 2500,
        "grpc.max_connection_idle_ms": 30_000,
        "grpc.max_concurrent_streams": 48,
        "grpc.http.overload_protection": 0,
    }


def test_past_the_connection_cap_a_client_is_unavailable_until_one_closes(root: Path) -> None:
    config = oip_config(root, grpc="127.0.0.1:0", http_max_connections_per_listener=2)
    with server_thread(config) as srv, ExitStack() as stack:
        channels = [
            stack.enter_context(grpc.insecure_channel(grpc_address(srv), OWN_CONNECTION)) for _ in range(2)
        ]
        for channel in channels:
            assert infer_on(channel)(request(), timeout=10).model_name == "tiny_a"
        with grpc.insecure_channel(grpc_address(srv), OWN_CONNECTION) as third:
            with pytest.raises(grpc.RpcError) as info:
                infer_on(third)(request(), timeout=5)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        channels[0].close()
        with grpc.insecure_channel(grpc_address(srv), OWN_CONNECTION) as fourth:
            answered = wait_until(lambda: _answers(fourth))
        assert answered  # the closed one's place is free again
        assert infer_on(channels[1])(request(), timeout=10).model_name == "tiny_a"  # the others are served


def _answers(channel: grpc.Channel) -> bool:
    try:
        return infer_on(channel)(request(), timeout=2).model_name == "tiny_a"
    except grpc.RpcError:
        return False


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(root: Path) -> None:
    config = oip_config(root, grpc="127.0.0.1:0", http_header_timeout_s=0.5)
    with server_thread(config) as srv:
        host, port = grpc_address(srv).rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as silent:
            opened = time.monotonic()
            data = silent.recv(4096)  # the server's settings frame, perhaps, then the close
            while data:
                data = silent.recv(4096)
            waited = time.monotonic() - opened
        assert waited < 5.0  # grpc core's own default is 120 s
        with grpc.insecure_channel(grpc_address(srv)) as channel:
            assert infer_on(channel)(request(), timeout=10).model_name == "tiny_a"


def test_an_idle_connection_is_closed_and_its_channel_reconnects(root: Path) -> None:
    config = oip_config(root, grpc="127.0.0.1:0", http_keepalive_timeout_s=0.5)
    with server_thread(config) as srv, grpc.insecure_channel(grpc_address(srv)) as channel:
        states: list[grpc.ChannelConnectivity] = []
        idle = threading.Event()

        def seen(state: grpc.ChannelConnectivity) -> None:
            states.append(state)
            if state is grpc.ChannelConnectivity.IDLE and grpc.ChannelConnectivity.READY in states:
                idle.set()

        assert infer_on(channel)(request(), timeout=10).model_name == "tiny_a"
        channel.subscribe(seen)
        assert idle.wait(10), states  # the server's GOAWAY after 0.5 s without an RPC
        assert infer_on(channel)(request(), timeout=10).model_name == "tiny_a"  # reconnected
        channel.unsubscribe(seen)


@pytest.fixture
def slow_window_of_two(root: Path) -> Iterator[tuple[ServerThread, HookedFactory]]:
    factory = HookedFactory(delay_s=1.0)
    with server_thread(oip_config(root, grpc="127.0.0.1:0", max_in_flight=2), factory) as srv:
        yield srv, factory


def test_one_connection_has_at_most_its_window_of_rpcs_at_once(
    slow_window_of_two: tuple[ServerThread, HookedFactory],
) -> None:
    srv, _ = slow_window_of_two
    assert srv.net.grpc is not None
    stats = srv.net.grpc.stats
    with grpc.insecure_channel(grpc_address(srv)) as channel:
        # connected first: a client that sends before the server's settings arrive may overshoot
        # the limit, and the streams past it are refused (UNAVAILABLE)
        assert infer_on(channel)(request(), timeout=10).model_name == "tiny_a"
        calls = [infer_on(channel).future(request()) for _ in range(4)]
        assert wait_until(lambda: stats.requests >= 3)
        time.sleep(0.3)  # the first runs for 1 s: the others would have arrived by now
        assert stats.requests == 3
        assert all(call.result(timeout=20).model_name == "tiny_a" for call in calls)  # then served
    assert stats.requests == 5


def test_past_the_in_flight_total_a_second_connection_goes_before_the_first_ones_backlog(root: Path) -> None:
    """The gate (oipgrpc/fair_gate.py) with a total of 2 and a 0.5 s backend: one connection's six
    RPCs and then another's one; the other's is answered in the second batch, not after the six."""
    config = oip_config(root, grpc="127.0.0.1:0", max_in_flight=8, max_in_flight_total=2)
    with server_thread(config, HookedFactory(delay_s=0.5)) as srv, ExitStack() as stack:
        assert srv.net.grpc is not None
        stats = srv.net.grpc.stats
        flood, polite = (
            stack.enter_context(grpc.insecure_channel(grpc_address(srv), options=OWN_CONNECTION))
            for _ in range(2)
        )
        for channel in (flood, polite):  # connected and warm first
            assert infer_on(channel)(request(), timeout=10).model_name == "tiny_a"
        answered: list[str] = []
        floods = [infer_on(flood).future(request()) for _ in range(6)]
        assert wait_until(lambda: stats.requests >= 8)
        polite_call = infer_on(polite).future(request())
        for i, call in enumerate(floods):
            call.add_done_callback(lambda _, i=i: answered.append(f"flood{i}"))
        polite_call.add_done_callback(lambda _: answered.append("polite"))
        assert polite_call.result(timeout=20).model_name == "tiny_a"
        assert all(call.result(timeout=20).model_name == "tiny_a" for call in floods)
    assert answered.index("polite") < answered.index("flood4"), answered

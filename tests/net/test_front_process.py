"""The socket front in a process of its own (`[listen] front_process = true`): a real child process,
real sockets, a real Server and tiny ONNX models."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from net_support import hello_frame, net_config, raw_connect, read_frame, server_thread
from runtime_support import config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.config.checks import ConfigError
from edgeserve.config.server import PreprocessConfig, ServerConfig
from edgeserve.errors import ListenError
from edgeserve.loop import run
from edgeserve.net.front_link import config_of, result_of, result_record, setup_record
from edgeserve.net.front_process import FrontProcess
from edgeserve.net.preprocess import preprocess_frame
from edgeserve.runtime import Result, Status
from edgeserve.service.process import NetServer
from edgeserve.wire.client import AsyncClient, BlockingClient, Reply
from edgeserve.wire.frames import TOO_MANY_IN_FLIGHT, encode_frame
from edgeserve.wire.tensors import encode_tensor


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("front") / "engines"
    return root, profiled_tiny_repository(root)


def _process_config(root: Path, tmp: Path, **listen: object) -> dict[str, object]:
    return net_config(config_dict(root), tmp, front_process=True, **listen)


def _wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_requests_through_the_front_process_get_their_reference_logits(
    served, tmp_path: Path, transport: str
) -> None:
    root, models = served
    xa, xb = models["tiny_a"].random_input(20, seed=1), models["tiny_b"].random_input(10, seed=2)
    with server_thread(_process_config(root, tmp_path)) as srv:
        assert isinstance(srv.net.frontend, FrontProcess)
        url = srv.unix_url if transport == "unix" else srv.tcp_url

        async def main() -> list[Reply]:
            async with await AsyncClient.connect(url) as client:
                assert client.models["tiny_b"]["input"] == {"dtype": "float32", "shape": [3, 16, 16]}
                futures = [client.send("tiny_a", x, priority=i) for i, x in enumerate(xa)]
                futures += [client.send("tiny_b", x) for x in xb]
                futures.append(client.send("no_such_model", xa[0]))
                return list(await asyncio.gather(*futures))

        replies = run(main())
        # The server process learns the front's counters from its reports (every 0.25 s).
        _wait_for(lambda: srv.net.frontend.stats.requests == 31)
        assert srv.net.frontend.stats.process_cpu_seconds > 0
    for reply, x, tiny in [(r, x, models["tiny_a"]) for r, x in zip(replies[:20], xa, strict=True)] + [
        (r, x, models["tiny_b"]) for r, x in zip(replies[20:30], xb, strict=True)
    ]:
        assert reply.status == "ok", reply.error
        assert reply.exit_index is not None and reply.output is not None
        np.testing.assert_allclose(
            reply.output, tiny.forward(x[None], reply.exit_index)[0], rtol=1e-4, atol=1e-4
        )
    assert [r.priority for r in replies[:20]] == list(range(20))
    assert replies[30].status == "invalid" and "unknown model" in (replies[30].error or "")


def test_camera_frames_are_preprocessed_in_the_front_process(served, tmp_path: Path) -> None:
    root, models = served
    config = config_dict(root)
    config["models"]["tiny_b"]["preprocess"] = {
        "resize": [16, 16],
        "mean": [0.5, 0.4, 0.3],
        "channels": "bgr",
    }
    frame = np.random.default_rng(0).integers(0, 256, size=(40, 30, 3), dtype=np.uint8)
    expected = preprocess_frame(
        frame, PreprocessConfig(resize=(16, 16), mean=(0.5, 0.4, 0.3), channels="bgr"), (3, 16, 16)
    )
    with (
        server_thread(net_config(config, tmp_path, front_process=True)) as srv,
        BlockingClient(srv.unix_url) as client,
    ):
        assert client.models["tiny_b"]["camera_input"]["channels"] == "bgr"
        reply = client.infer("tiny_b", frame, timeout=30)
    assert reply.status == "ok", reply.error
    assert reply.exit_index is not None
    np.testing.assert_allclose(
        reply.output, models["tiny_b"].forward(expected[None], reply.exit_index)[0], rtol=1e-4, atol=1e-4
    )


def test_the_front_process_refuses_past_the_window_and_answers_each_request_once(
    served, tmp_path: Path
) -> None:
    root, models = served
    x = models["tiny_a"].random_input(1, seed=3)[0]
    frames = b"".join(
        encode_frame({"type": "infer", "id": i, "model": "tiny_a", "tensor": encode_tensor(x)})
        for i in range(60)
    )
    with server_thread(_process_config(root, tmp_path, max_in_flight=2)) as srv:
        sock = raw_connect(srv.unix_url)
        sock.sendall(hello_frame())
        assert read_frame(sock)["type"] == "hello"  # type: ignore[index]
        sock.sendall(frames)  # one write: the front reads most of it at once, its window full
        answers = [read_frame(sock) for _ in range(60)]
        sock.close()
        _wait_for(lambda: srv.net.frontend.stats.by_status.get("rejected", 0) > 0)
    ids = [a["id"] for a in answers if a is not None]
    assert sorted(ids) == list(range(60))  # each exactly once
    statuses = {a["status"] for a in answers if a is not None}
    assert statuses == {"ok", "rejected"}
    assert all(
        a["error"] == TOO_MANY_IN_FLIGHT for a in answers if a is not None and a["status"] == "rejected"
    )


def test_a_front_process_that_dies_is_reported_and_its_server_can_stop(served, tmp_path: Path) -> None:
    root, _ = served
    failed: list[bool] = []
    with server_thread(_process_config(root, tmp_path)) as srv:
        front = srv.net.frontend
        assert isinstance(front, FrontProcess) and front._process is not None
        srv.loop.call_soon_threadsafe(srv.net.on_failure, lambda: failed.append(True))
        time.sleep(0.1)
        os.kill(front._process.pid, signal.SIGKILL)
        _wait_for(lambda: bool(failed))
        assert srv.net.failure is not None and "exited unexpectedly" in srv.net.failure
    # server_thread closed the NetServer: the stop did not hang on the dead front.


def test_the_front_process_fails_to_start_with_the_listen_error(served, tmp_path: Path) -> None:
    root, _ = served
    config = net_config(config_dict(root), tmp_path, front_process=True)
    config["listen"]["unix"] = str(tmp_path / "no" / "such" / "dir" / "s.sock")

    async def start() -> None:
        net = NetServer(config)
        await net.start()

    with pytest.raises(ListenError, match="socket front"):
        run(start())


def test_front_process_must_be_a_boolean(served) -> None:
    root, _ = served
    with pytest.raises(ConfigError, match=r"listen\.front_process: must be true or false"):
        ServerConfig.from_dict(
            {**config_dict(root), "listen": {"unix": "/tmp/x.sock", "front_process": "yes"}}
        )


def test_results_and_setup_cross_the_link_unchanged(served) -> None:
    root, _ = served
    outputs = {"logits": np.arange(6, dtype=np.float32).reshape(2, 3), "aux": np.ones(2, dtype=np.int64)}
    result = Result(
        Status.OK,
        "tiny_a",
        outputs["logits"],
        1,
        "e1",
        0.9,
        4,
        1.0,
        1.5,
        2.0,
        2.5,
        3.0,
        None,
        "local",
        outputs,
    )
    back = result_of(result_record(7, result))
    assert back.status is Status.OK and (back.exit_index, back.exit_name, back.batch_size) == (1, "e1", 4)
    assert (back.queued, back.dispatch, back.start, back.end, back.deadline) == (1.0, 1.5, 2.0, 2.5, 3.0)
    np.testing.assert_array_equal(back.output, outputs["logits"])
    assert back.outputs is not None and back.outputs["aux"].dtype == np.int64
    refused = result_of(result_record(8, Result(Status.REJECTED, "m", queued=1.0, end=1.0, error="full")))
    assert refused.output is None and refused.outputs is None and refused.error == "full"
    assert math.isnan(refused.deadline) and refused.refused

    data = config_dict(root)
    data["models"]["tiny_b"]["preprocess"] = {"resize": [16, 16], "mean": [0.5, 0.4, 0.3], "channels": "bgr"}
    data["listen"] = {
        "unix": "/run/x.sock",
        "tcp": "127.0.0.1:7070",
        "max_in_flight": 3,
        "front_process": True,
    }
    config = ServerConfig.from_dict(data)
    from edgeserve.repository import ModelRepository

    repository = ModelRepository(root)
    manifests = {name: repository.load_manifest(name) for name in config.models}
    again, manifests_again = config_of(setup_record(config, manifests, "info")[1])
    assert again.listen == config.listen
    assert dict(again.models) == dict(config.models)
    assert manifests_again == manifests


def test_a_reload_reaches_the_front_process(served, tmp_path: Path) -> None:
    root, _ = served
    config = _process_config(root, tmp_path)
    with server_thread(config) as srv:

        def slo() -> float:  # as a new connection's hello describes it
            with BlockingClient(srv.unix_url) as client:
                return client.models["tiny_a"]["slo_ms"]

        assert slo() != 1234
        new = {
            **config,
            "models": {**config["models"], "tiny_a": {**config["models"]["tiny_a"], "slo_ms": 1234}},
        }

        async def reload() -> None:
            await srv.net.server.reload(new)
            srv.net.reconfigured()

        asyncio.run_coroutine_threadsafe(reload(), srv.loop).result(30)
        _wait_for(lambda: slo() == 1234)  # the setup record crosses the link

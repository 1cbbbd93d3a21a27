"""AsyncClient never sends abandoned work (issue 65, item 6), against a real server: a request whose
caller was cancelled or timed out while it waited in the client's window is withdrawn before it is
written; one already written is answered and its answer discarded; the backlog is bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from net_support import ServerThread, net_config, server_thread
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository

from edgeserve.loop import run
from edgeserve.net import AsyncClient, BlockingClient


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-withdraws") / "engines"
    profiled_tiny_repository(root)
    return root


def _sample(client: AsyncClient) -> np.ndarray:
    spec = client.models["tiny_a"]["input"]
    return np.zeros(spec["shape"], dtype=spec["dtype"])


def _answered(srv: ServerThread) -> int:
    return sum(srv.stats().by_status.values())


def test_timed_out_and_cancelled_callers_are_never_sent(served: Path, tmp_path: Path) -> None:
    config = net_config(config_dict(served), tmp_path, max_in_flight=1, share_total=False)
    factory = HookedFactory(delay_s=0.2)  # one request on the wire at a time, 200 ms each

    async def main() -> tuple[list[str], AsyncClient]:
        client = await AsyncClient.connect(srv.unix_url)
        try:
            x = _sample(client)
            first = client.send("tiny_a", x)  # written at once: the window is one
            timed_out = [
                asyncio.ensure_future(asyncio.wait_for(client.infer("tiny_a", x), 0.05)) for _ in range(5)
            ]
            cancelled = [client.send("tiny_a", x) for _ in range(5)]
            kept = client.send("tiny_a", x)
            for _ in range(10):  # the wait_for tasks start their calls
                await asyncio.sleep(0)
            assert client.backlog == 11
            for future in cancelled:
                future.cancel()
            for task in timed_out:
                with pytest.raises(asyncio.TimeoutError):
                    await task
            statuses = [(await first).status, (await kept).status]
            return statuses, client
        finally:
            await client.close()

    with server_thread(config, factory) as srv:
        statuses, client = run(main())
        answered = _answered(srv)
    assert statuses == ["ok", "ok"]
    assert client.withdrawn == 10 and client.discarded == 0
    assert answered == 2  # the server saw only the two requests whose callers still waited


def test_an_answer_to_a_caller_who_gave_up_after_it_was_written_is_discarded(
    served: Path, tmp_path: Path
) -> None:
    config = net_config(config_dict(served), tmp_path, max_in_flight=2, share_total=False)
    factory = HookedFactory(delay_s=0.1)

    async def main() -> AsyncClient:
        client = await AsyncClient.connect(srv.unix_url)
        try:
            x = _sample(client)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.infer("tiny_a", x), 0.02)  # already written
            assert (await client.infer("tiny_a", x)).ok  # the next call is unaffected
            return client
        finally:
            await client.close()

    with server_thread(config, factory) as srv:
        client = run(main())
    assert client.discarded == 1 and client.withdrawn == 0 and client.in_flight == 0


def test_the_backlog_is_bounded_and_a_request_past_it_is_rejected_in_one_sentence(
    served: Path, tmp_path: Path
) -> None:
    config = net_config(config_dict(served), tmp_path, max_in_flight=1, share_total=False)
    factory = HookedFactory(delay_s=0.05)

    async def main() -> list:
        client = await AsyncClient.connect(srv.unix_url, max_backlog=3)
        try:
            x = _sample(client)
            return list(await asyncio.gather(*(client.infer("tiny_a", x) for _ in range(10))))
        finally:
            await client.close()

    with server_thread(config, factory) as srv:
        replies = run(main())
        answered = _answered(srv)
    assert [r.status for r in replies] == ["ok"] * 4 + ["rejected"] * 6
    assert answered == 4
    error = replies[-1].error
    assert "3 requests already wait in this client" in error and "max_backlog" in error


def test_a_blocking_clients_timeout_withdraws_the_request(served: Path, tmp_path: Path) -> None:
    config = net_config(config_dict(served), tmp_path, max_in_flight=1, share_total=False)
    factory = HookedFactory(delay_s=0.3)
    with server_thread(config, factory) as srv:
        with BlockingClient(srv.unix_url) as client:
            x = np.zeros(client.models["tiny_a"]["input"]["shape"], dtype=np.float32)
            first = client.submit("tiny_a", x)
            with pytest.raises(TimeoutError):
                client.infer("tiny_a", x, timeout=0.05)  # waits behind `first` in the client
            assert first.result(10).ok
            assert client.infer("tiny_a", x, timeout=10).ok
            withdrawn = client._client.withdrawn
        answered = _answered(srv)
    assert withdrawn == 1 and answered == 2

"""AsyncClient's window: a client alone grows it from the hello's `max_in_flight` to its
`max_in_flight_total`; beside other clients the server refuses what is past `max_in_flight`, and the
client sends those requests again, its callers never seeing the refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from net_support import net_config, server_thread
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository

from edgeserve.loop import run
from edgeserve.net import AsyncClient
from edgeserve.wire.client import Reply


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-window") / "engines"
    profiled_tiny_repository(root)
    return root


async def _burst(client: AsyncClient, count: int) -> list[Reply]:
    spec = client.models["tiny_a"]["input"]
    sample = np.zeros(spec["shape"], dtype=spec["dtype"])
    return list(await asyncio.gather(*(client.infer("tiny_a", sample) for _ in range(count))))


@pytest.mark.parametrize("share_total", [True, False])
def test_a_client_alone_grows_its_window_to_the_total_the_hello_offers(
    served: Path, tmp_path: Path, share_total: bool
) -> None:
    config = net_config(config_dict(served), tmp_path, max_in_flight=2, share_total=share_total)
    factory = HookedFactory(delay_s=0.01)  # batches slow enough that requests wait in flight

    async def main() -> tuple[list[Reply], dict, int]:
        client = await AsyncClient.connect(srv.unix_url)
        try:
            replies = await _burst(client, 60)
            return replies, client.hello, client._limit
        finally:
            await client.close()

    with server_thread(config, factory) as srv:
        replies, hello, limit = run(main())
        refused = srv.stats().by_status.get("rejected", 0)
    assert [r.status for r in replies] == ["ok"] * 60
    assert factory.backend is not None
    biggest = max(size for _, _, size in factory.backend.spans)
    if share_total:
        assert hello["max_in_flight_total"] == 8  # 4 windows of 2, the default total
        assert limit == 8 and biggest > 2
    else:
        assert "max_in_flight_total" not in hello
        assert limit == 2 and biggest <= 2
    assert refused == 0


def test_refusals_past_max_in_flight_are_sent_again_unseen_when_clients_share_the_total(
    served: Path, tmp_path: Path
) -> None:
    """Two clients, each wanting more than its share of a total of 8: each grows, the server
    refuses what is past its share ("too many requests in flight"), and every caller still gets
    its `ok`; the windows come back to the share."""
    config = net_config(config_dict(served), tmp_path, max_in_flight=2, max_in_flight_total=8)
    factory = HookedFactory(delay_s=0.005)

    async def main() -> tuple[list[Reply], list[int]]:
        clients = [await AsyncClient.connect(srv.unix_url) for _ in range(2)]
        try:
            alone = await _burst(clients[0], 60)  # the first grows to the whole total, alone
            both = await asyncio.gather(*(_burst(c, 150) for c in clients))
            return alone + both[0] + both[1], [c._limit for c in clients]
        finally:
            for client in clients:
                await client.close()

    with server_thread(config, factory) as srv:
        replies, limits = run(main())
        refused = srv.stats().by_status.get("rejected", 0)
    assert [r.status for r in replies] == ["ok"] * 360
    assert refused > 0  # the server did refuse past the share; the clients sent those again
    assert all(2 <= limit <= 8 for limit in limits)

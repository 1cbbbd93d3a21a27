"""The loop decides the batch after the running one as that is due to end (Pipeline.decide_ahead),
before a read, and the executor thread starts it without deciding: the same answers, one batch at
a time, every request answered once, at shutdown too."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest
from runtime_support import HookedFactory, config_dict, profiled_tiny_repository
from tiny_onnx import TinyModel

from edgeserve.loop import run
from edgeserve.runtime.results import Result, Status
from edgeserve.runtime.server import Server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, TinyModel]]:
    root = tmp_path_factory.mktemp("ahead") / "engines"
    return root, profiled_tiny_repository(root)


async def _reads(server: Server, stop: asyncio.Event) -> None:
    """What a front door does before each of its reads, every 0.2 ms."""
    while not stop.is_set():
        server.run_completed()
        await asyncio.sleep(0.0002)


def test_batches_decided_ahead_answer_right_and_never_overlap(served) -> None:
    root, models = served
    factory = HookedFactory(delay_s=0.002, inline_safe=True)
    xa, xb = models["tiny_a"].random_input(60, seed=11), models["tiny_b"].random_input(60, seed=12)

    async def main() -> tuple[list[Result], int, int]:
        async with Server(config_dict(root), backend_factory=factory) as server:
            stop = asyncio.Event()
            reads = asyncio.ensure_future(_reads(server, stop))
            calls = [server.infer("tiny_a", x) for x in xa] + [server.infer("tiny_b", x) for x in xb]
            results = await asyncio.gather(*calls)
            stop.set()
            await reads
            return results, server.counters.batches_ahead, sum(server.counters.batches.values())

    results, ahead, batches = run(main())
    for tiny, xs, got in ((models["tiny_a"], xa, results[:60]), (models["tiny_b"], xb, results[60:])):
        for x, r in zip(xs, got, strict=True):
            assert r.status is Status.OK, r.error
            assert r.exit_index is not None
            np.testing.assert_allclose(r.output, tiny.forward(x[None], r.exit_index)[0], rtol=1e-4, atol=1e-4)
    backend = factory.backend
    assert backend is not None and backend.max_active == 1
    spans = sorted(backend.spans)
    for (_, leave, _), (enter, _, _) in itertools.pairwise(spans):
        assert leave <= enter
    assert sum(size for _, _, size in spans) == len(results)
    # The backlog keeps the executor thread busy and the loop comes by every 0.2 ms of each ~2 ms
    # batch: most batches after the first few are decided ahead.
    assert batches >= 10 and ahead >= batches // 3, (ahead, batches)


def test_a_batch_decided_ahead_at_shutdown_is_answered_once(served) -> None:
    """close() while batches run and the next is decided ahead: every request gets exactly one
    answer, `ok` or `shutdown`, and the server's counters agree."""
    root, models = served
    factory = HookedFactory(delay_s=0.01, inline_safe=True)
    xs = models["tiny_a"].random_input(60, seed=13)
    answers: list[Result] = []

    async def main() -> tuple[int, dict[str, int]]:
        config = config_dict(root) | {"shutdown_timeout_s": 0.02}
        server = Server(config, backend_factory=factory)
        await server.start()
        stop = asyncio.Event()
        reads = asyncio.ensure_future(_reads(server, stop))
        for x in xs:
            server.enqueue("tiny_a", x, answers.append)
        await asyncio.sleep(0.035)  # a few batches in, one decided ahead
        ahead = server.counters.batches_ahead
        await server.close()
        stop.set()
        await reads
        await asyncio.sleep(0.05)  # a batch that was running ends; its answers must not repeat
        by_status = {s: n for (m, s), n in server.counters.requests.items() if m == "tiny_a"}
        return ahead, by_status

    ahead, by_status = run(main())
    assert ahead >= 1
    assert len(answers) == len(xs)
    statuses = [r.status for r in answers]
    assert set(statuses) <= {Status.OK, Status.SHUTDOWN}
    assert Status.OK in statuses and Status.SHUTDOWN in statuses
    assert by_status == {s.value: statuses.count(s) for s in set(statuses)}

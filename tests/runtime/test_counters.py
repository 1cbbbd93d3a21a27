"""A batch's answers counted at once give the counters that counting them one by one gives."""

from __future__ import annotations

import math
import random

import pytest

from edgeserve.runtime.counters import Counters, Histogram


def test_observe_many_is_observe_each() -> None:
    rng = random.Random(3)
    values = [rng.choice([0.0, 1e-5, 0.003, 0.25, 7.0, 1e9, -1.0]) * rng.random() for _ in range(2000)]
    one, many = Histogram(), Histogram()
    for value in values:
        one.observe(value)
    for start in range(0, len(values), 7):
        many.observe_many(values[start : start + 7])
    assert (many.counts, many.total, many.count) == (one.counts, one.total, one.count)


@pytest.mark.parametrize("start_nan", [False, True])
def test_observe_ok_batch_is_each_answer_observed(start_nan: bool) -> None:
    rng = random.Random(4)
    counters = Counters()
    requests: dict[str, Histogram] = {}
    queues: dict[str, Histogram] = {}
    compute: dict[str, float] = {}
    for n in range(200):
        start = math.nan if start_nan else n + rng.random() * 0.01
        end = n + 0.01 + rng.random() * 0.01
        queued = [n - rng.random() * 0.02 for _ in range(rng.randint(1, 12))]
        model = rng.choice(["a", "b"])
        for q in queued:  # what one `observe_ok` per answer did before
            requests.setdefault(model, Histogram()).observe(end - q)
            if not start_nan:
                queues.setdefault(model, Histogram()).observe(start - q)
                compute[model] = compute.get(model, 0.0) + (end - start)
        counters.observe_ok_batch(model, queued, start, end)

    def state(histograms: dict[str, Histogram]) -> dict[str, object]:
        return {m: (h.counts, h.total, h.count) for m, h in histograms.items() if h.count}

    assert state(counters.request_duration) == state(requests)
    assert state(counters.queue_duration) == state(queues)
    assert dict(counters.compute_request_s) == compute

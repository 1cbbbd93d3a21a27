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
def test_observe_ok_batch_is_observe_ok_each(start_nan: bool) -> None:
    rng = random.Random(4)
    one, batch = Counters(), Counters()
    for n in range(200):
        start = math.nan if start_nan else n + rng.random() * 0.01
        end = n + 0.01 + rng.random() * 0.01
        queued = [n - rng.random() * 0.02 for _ in range(rng.randint(1, 12))]
        model = rng.choice(["a", "b"])
        for q in queued:
            one.observe_ok(model, q, start, end)
        batch.observe_ok_batch(model, queued, start, end)
    for name in ("request_duration", "queue_duration"):
        mine, theirs = getattr(batch, name), getattr(one, name)
        assert {m: (h.counts, h.total, h.count) for m, h in mine.items()} == {
            m: (h.counts, h.total, h.count) for m, h in theirs.items()
        }
    assert batch.compute_request_s == one.compute_request_s

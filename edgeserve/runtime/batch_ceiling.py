"""A per-model batch ceiling (`[models.NAME] max_batch`): the profile tables the scheduler plans
with, cut to batch 1..max_batch, so that no batch of that model ever holds more samples.

`max_batch = 1` serves a model one sample at a time: for a model whose answer depends on its batch
mates (a graph that normalises over the batch axis, pads every sample to the longest, runs NMS over
the whole batch), where a client's answer must not depend on who else sent. `edgeserve import`
finds such models itself and records them as one-sample-at-a-time (manifest `batch_invariant`), and
their profiles then stop at batch 1 already.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from edgeserve.profile import ProfileTable


def capped(table: ProfileTable, ceiling: int | None) -> ProfileTable:
    """`table` with batches 1..ceiling only (itself when it has no more than that)."""
    if ceiling is None or ceiling >= table.max_batch:
        return table
    cells = {key: cell for key, cell in table.cells.items() if key[1] <= ceiling}
    return dataclasses.replace(table, max_batch=ceiling, cells=cells)


def cap_tables(tables: Sequence[ProfileTable], ceilings: Sequence[int | None]) -> list[ProfileTable]:
    """Each served model's table cut to its `max_batch` (None: the whole table)."""
    return [capped(t, c) for t, c in zip(tables, ceilings, strict=True)]

from collections.abc import Sequence

from edgeserve.scheduler.latency import ModelLatency
from edgeserve.scheduler.queues import TaskQueue

def decide(
    queues: Sequence[TaskQueue],
    models: tuple[ModelLatency, ...],
    now: float,
    theta: float,
    clip: float,
    code: bool,
    batch_cap: int,
    small_state: int,
    small_loop: int,
    tie_rtol: float,
    lookahead_batches: int,
    none_doomed_margin: float,
    split: bool,
    dominance: float,
    pivot_span: float,
    max_runs: int,
    /,
) -> tuple[int, int, int, float, float] | None: ...

"""The serving core's tuning constants, as one frozen value a Server is built with.

A test or an embedding app passes its own (`Server(config, settings=RuntimeSettings(...))`)
instead of patching module constants, and two servers in one process may differ. The Server and
its helpers copy the values they need once, at construction: no lookups per request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Where each value comes from is said beside it (docs/runtime.md has the measurements)."""

    # A Wait that is already due is retried this much later, never in a busy loop.
    min_wakeup_s: float = 1e-4
    # Event-loop timers are ms-granular: fire a Wait's wake-up this much early.
    timer_slack_s: float = 1e-3
    # The scheduler plans each task to finish before its deadline by the answer's way back, but
    # always keeps at least this share of the budget (Server._enqueue, budget.planned_budget).
    plan_floor: float = 0.5
    # The plans' measured margin follows the loop's delays in steps this large.
    plan_lag_step_s: float = 0.2e-3
    # EWMA weight of the latest delay of a callback the loop schedules.
    lag_weight: float = 0.2
    # The plans leave room for this quantile of a finished batch's wait for the loop, not its mean
    # (runtime/running_quantile.py): beside a busy Python client at 2x that wait was 0.6 ms at P50
    # and 2.5 ms at P95, and answers planned to the mean reached the client late.
    answer_lag_quantile: float = 0.9
    answer_lag_step_s: float = 50e-6  # the most it moves a batch
    # Short batches run on the loop only while a callback it schedules runs within this (an EWMA):
    # past it the loop is busy reading, and a batch run there would hold every connection's frames.
    inline_loop_delay_s: float = 200e-6
    # Before a read, the loop decides the batch after the running one when that is due to end
    # within this, and this share of its predicted time at most (Pipeline.decide_ahead); the
    # executor thread then starts it without deciding. "Due" is the end the batches' measured
    # share of their predicted (quantile) time gives, an EWMA of this weight.
    decide_ahead_s: float = 300e-6
    decide_ahead_share: float = 0.4
    due_weight: float = 0.05

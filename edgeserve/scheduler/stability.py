"""The EdgeServing stability-score policy (Algorithm 1) and its two ablations.

Each round, for every non-empty queue m: batch b_m = min(|Q_m|, B_m); exit e_m = the deepest exit
that still meets every deadline in the batch (else the shallowest); delta_m = L(m, e_m, b_m);
S_m = sum over all tasks left queued of u((w_k + delta_m) / D_k). Serve argmin_m S_m.

All-Final+Deadline-Aware is this policy with exit_rule="final"; Ours+bs=1 uses batch_cap=1.
edgeserve's improvements are the exit rules "safe" and "protective" (candidates.choose_exits).
"""

from __future__ import annotations

from collections.abc import Sequence

from edgeserve.scheduler.candidates import EXIT_RULES, Candidate, pick_min
from edgeserve.scheduler.decision import Dispatch
from edgeserve.scheduler.fast_scoring import fast_candidates
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.reference import reference_candidates
from edgeserve.scheduler.urgency import Urgency

SCORERS = ("fast", "loop")


class StabilityPolicy:
    """argmin over models of the predicted stability score. `scorer="loop"` uses the reference loop."""

    def __init__(
        self,
        latency: LatencyModel,
        urgency: Urgency | None = None,
        exit_rule: str = "adaptive",
        batch_cap: int | None = None,
        scorer: str = "fast",
        name: str = "stability",
    ) -> None:
        if exit_rule not in EXIT_RULES:
            raise ValueError(f"unknown exit rule {exit_rule!r}; choose one of {EXIT_RULES}")
        if scorer not in SCORERS:
            raise ValueError(f"unknown scorer {scorer!r}; choose one of {SCORERS}")
        if batch_cap is not None and batch_cap < 1:
            raise ValueError(f"batch_cap must be at least 1, got {batch_cap}")
        self.latency = latency
        self.urgency = urgency or Urgency()
        self.exit_rule = exit_rule
        self.batch_cap = batch_cap
        self.scorer = scorer
        self.name = name

    def candidates(self, queues: Sequence[TaskQueue], now: float) -> list[Candidate]:
        score = fast_candidates if self.scorer == "fast" else reference_candidates
        return score(queues, now, self.latency, self.urgency, self.exit_rule, self.batch_cap)

    def decide(self, queues: Sequence[TaskQueue], now: float) -> Dispatch | None:
        candidates = self.candidates(queues, now)
        if not candidates:
            return None
        pool = [c for c in candidates if c.eligible]
        best = pool[pick_min([c.score for c in pool])]
        model = self.latency.models[best.model]
        return Dispatch(
            model=best.model,
            exit=model.exit_ids[best.exit_pos],
            batch=best.batch,
            predicted_s=best.delta_s,
            score=best.score,
        )

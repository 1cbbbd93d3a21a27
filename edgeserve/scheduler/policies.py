"""Every policy by name, as config files and `edgeserve simulate --policy` spell them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from edgeserve.scheduler.baselines import QueueOrderPolicy, SymphonyPolicy
from edgeserve.scheduler.decision import Policy
from edgeserve.scheduler.guarded import GuardedStabilityPolicy
from edgeserve.scheduler.latency import LatencyModel
from edgeserve.scheduler.stability import StabilityPolicy
from edgeserve.scheduler.urgency import Urgency


@dataclass(frozen=True)
class PolicyOptions:
    """Knobs shared by the score-based policies."""

    urgency: Urgency = field(default_factory=Urgency)
    scorer: str = "fast"


@dataclass(frozen=True)
class PolicySpec:
    name: str
    label: str  # the name in the EdgeServing paper's figures
    summary: str
    build: Callable[[LatencyModel, PolicyOptions], Policy]


def _specs() -> dict[str, PolicySpec]:
    specs = [
        PolicySpec(
            "stability",
            "Ours",
            "EdgeServing: deepest feasible exit per queue, serve the queue whose service leaves the "
            "lowest stability score",
            lambda lat, o: StabilityPolicy(lat, o.urgency, "adaptive", None, o.scorer, "stability"),
        ),
        PolicySpec(
            "all-final",
            "All-Final",
            "longest queue first, final exit",
            lambda lat, o: QueueOrderPolicy(lat, "lqf", "final", "all-final"),
        ),
        PolicySpec(
            "all-early",
            "All-Early",
            "longest queue first, shallowest exit",
            lambda lat, o: QueueOrderPolicy(lat, "lqf", "shallowest", "all-early"),
        ),
        PolicySpec(
            "early-exit-lqf",
            "Early-Exit+LQF",
            "longest queue first, deepest feasible exit",
            lambda lat, o: QueueOrderPolicy(lat, "lqf", "adaptive", "early-exit-lqf"),
        ),
        PolicySpec(
            "early-exit-edf",
            "Early-Exit+EDF",
            "earliest deadline first, deepest feasible exit",
            lambda lat, o: QueueOrderPolicy(lat, "edf", "adaptive", "early-exit-edf"),
        ),
        PolicySpec(
            "all-final-deadline-aware",
            "All-Final+Deadline-Aware",
            "stability score, final exit only",
            lambda lat, o: StabilityPolicy(
                lat, o.urgency, "final", None, o.scorer, "all-final-deadline-aware"
            ),
        ),
        PolicySpec(
            "stability-bs1",
            "Ours+bs=1",
            "stability score with batch size 1",
            lambda lat, o: StabilityPolicy(lat, o.urgency, "adaptive", 1, o.scorer, "stability-bs1"),
        ),
        PolicySpec(
            "stability-protective",
            "Ours+protective-exit (edgeserve)",
            "stability score; each queue's exit also leaves every other still-rescuable queue time for "
            "its shallowest exit",
            lambda lat, o: StabilityPolicy(
                lat, o.urgency, "protective", None, o.scorer, "stability-protective"
            ),
        ),
        PolicySpec(
            "stability-safe-exit",
            "Ours+safe-exit (edgeserve)",
            "stability score over the queues whose deepest feasible exit leaves every other still-rescuable "
            "queue time for its shallowest exit (protective exits if there are none); the default before "
            "the look-ahead guard",
            lambda lat, o: StabilityPolicy(lat, o.urgency, "safe", None, o.scorer, "stability-safe-exit"),
        ),
        PolicySpec(
            "stability-safe-maxbatch",
            "Ours+safe-exit+guard (edgeserve)",
            "stability-safe-exit, overridden when an optimistic earliest-deadline look-ahead shows another "
            "first move (queue, exit) would save more queued tasks; the paper's batch min(|Q|, B_max); "
            "the default before the batch look-ahead",
            lambda lat, o: GuardedStabilityPolicy(
                lat, o.urgency, o.scorer, "stability-safe-maxbatch", batch_rule="max"
            ),
        ),
        PolicySpec(
            "stability-safe",
            "Ours+safe-exit+guard+batch look-ahead (edgeserve)",
            "stability-safe-maxbatch, serving the chosen queue's batch in smaller pieces where the profile "
            "says they finish the same tasks sooner (batching that does not pay, as on a CPU)",
            lambda lat, o: GuardedStabilityPolicy(lat, o.urgency, o.scorer, "stability-safe"),
        ),
        PolicySpec(
            "symphony",
            "Symphony",
            "deferred batching at the final exit, drops tasks past their deadline",
            lambda lat, o: SymphonyPolicy(lat, "symphony"),
        ),
    ]
    return {s.name: s for s in specs}


POLICIES: dict[str, PolicySpec] = _specs()
# What a runtime should use unless configured otherwise: no shipped policy beats it clearly on the
# robustness matrix of docs/scheduler.md (benchmarks/policy_robustness.py).
DEFAULT_POLICY = "stability-safe"


def make_policy(name: str, latency: LatencyModel, options: PolicyOptions | None = None) -> Policy:
    """The policy called `name`, or a ValueError listing the valid names."""
    try:
        spec = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return spec.build(latency, options or PolicyOptions())

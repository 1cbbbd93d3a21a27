"""Scheduling policies (the EdgeServing stability score and the paper's baselines) and the simulator.

The runtime keeps one TaskQueue per model, in the LatencyModel's order, and calls
`policy.decide(queues, now)` whenever the accelerator frees up or a task arrives while it is idle.
"""

from edgeserve.scheduler.decision import Decision, Dispatch, Drop, Policy, Wait
from edgeserve.scheduler.latency import LatencyModel, ModelLatency
from edgeserve.scheduler.policies import DEFAULT_POLICY, POLICIES, PolicyOptions, make_policy
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.urgency import Urgency

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Decision",
    "Dispatch",
    "Drop",
    "LatencyModel",
    "ModelLatency",
    "Policy",
    "PolicyOptions",
    "TaskQueue",
    "Urgency",
    "Wait",
    "make_policy",
]

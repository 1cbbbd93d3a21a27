"""Hand-computed decisions of every policy on small states (the arithmetic is in the comments).

Two models, budget D = 50 ms for every task, now = 1.0 s. Latency (ms), [exit, batch]:
    A: e0 = 2 (b1), 3 (b2)     e1 = 10 (b1), 12 (b2)
    B: e0 = 4 (b1), 5 (b2)     e1 = 20 (b1), 24 (b2)
State "urgent B": A holds two fresh tasks (waited 1 ms and 0.5 ms), B one old task (waited 40 ms).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeserve.scheduler.baselines import SymphonyPolicy
from edgeserve.scheduler.decision import Dispatch, Drop, Policy, Wait
from edgeserve.scheduler.latency import LatencyModel, ModelLatency
from edgeserve.scheduler.policies import POLICIES, PolicyOptions, make_policy
from edgeserve.scheduler.queues import TaskQueue
from edgeserve.scheduler.stability import StabilityPolicy
from edgeserve.scheduler.urgency import Urgency

NOW = 1.0
D = 0.050
CODE = Urgency("code")  # the hand numbers below use the authors' code form, u(x) = min(e^(x-1), 10)


def _latency() -> LatencyModel:
    a = ModelLatency("A", ("e0", "e1"), (0, 1), 2, np.array([[2.0, 3.0], [10.0, 12.0]]) / 1000)
    b = ModelLatency("B", ("e0", "e1"), (0, 1), 2, np.array([[4.0, 5.0], [20.0, 24.0]]) / 1000)
    return LatencyModel((a, b))


def _urgent_b() -> list[TaskQueue]:
    a, b = TaskQueue(), TaskQueue()
    a.push(0, NOW - 0.0010, D)
    a.push(1, NOW - 0.0005, D)
    b.push(2, NOW - 0.0400, D)
    return [a, b]


def _decide(name: str, queues: list[TaskQueue], urgency: Urgency | None = None) -> Dispatch:
    if urgency is not None:
        policy: Policy = StabilityPolicy(_latency(), urgency)
    else:
        policy = make_policy(name, _latency(), PolicyOptions(urgency=CODE))
    decision = policy.decide(queues, NOW)
    assert isinstance(decision, Dispatch)
    return decision


def test_stability_serves_the_queue_whose_service_hurts_the_others_least() -> None:
    # Serve A: b=2, slack 49 ms, deepest exit with L <= 49 is e1 (12 ms). B's task then waits
    #   40 + 12 = 52 ms: x = 1.04, u = e^(0.04) = 1.040811.                        S_A = 1.040811
    # Serve B: b=1, slack 10 ms: e1 (20 ms) misses, e0 (4 ms) fits. A's tasks wait 5 and 4.5 ms:
    #   x = 0.10, 0.09: u = e^(-0.90) + e^(-0.91) = 0.406570 + 0.402524 = 0.809094. S_B = 0.809094
    policy = StabilityPolicy(_latency(), CODE)
    a, b = policy.candidates(_urgent_b(), NOW)
    assert (a.exit_pos, a.batch, a.delta_s) == (1, 2, 0.012)
    assert a.score == pytest.approx(1.040811, abs=1e-6)
    assert (b.exit_pos, b.batch, b.delta_s) == (0, 1, 0.004)
    assert b.score == pytest.approx(0.809094, abs=1e-6)
    decision = policy.decide(_urgent_b(), NOW)
    assert (decision.model, decision.exit, decision.batch) == (1, 0, 1)
    assert decision.score == pytest.approx(0.809094, abs=1e-6)


def test_stability_with_the_paper_urgency_form_decides_the_same_here() -> None:
    # Serve A: (e^1.04 - 1)/(e - 1) = 1.829217 / 1.718282 = 1.064561
    # Serve B: (e^0.10 - 1 + e^0.09 - 1)/(e - 1) = (0.105171 + 0.094174) / 1.718282 = 0.116014
    policy = StabilityPolicy(_latency(), Urgency("paper"))
    a, b = policy.candidates(_urgent_b(), NOW)
    assert a.score == pytest.approx(1.064561, abs=1e-6)
    assert b.score == pytest.approx(0.116014, abs=1e-6)
    assert _decide("stability", _urgent_b(), Urgency("paper")).model == 1


def test_all_final_deadline_aware_scores_with_the_final_exit_only() -> None:
    # Serve A at e1 (12 ms): S_A = 1.040811 as above.
    # Serve B at e1 (20 ms): A's tasks wait 21 and 20.5 ms: e^(-0.58) + e^(-0.59) = 0.559898 + 0.554327
    #   = 1.114225 > S_A, so A goes first, at its final exit, batch 2.
    decision = _decide("all-final-deadline-aware", _urgent_b())
    assert (decision.model, decision.exit, decision.batch) == (0, 1, 2)
    assert decision.score == pytest.approx(1.040811, abs=1e-6)


def test_stability_with_batch_size_one_serves_one_task() -> None:
    # Serve A (b=1, slack 49 ms, e1 = 10 ms): A's second task 10.5 ms -> e^(-0.79) = 0.453845, B's task
    #   50 ms -> e^0 = 1: S_A = 1.453845. Serve B (b=1, e0 = 4 ms): S_B = 0.809094 -> B.
    decision = _decide("stability-bs1", _urgent_b())
    assert (decision.model, decision.exit, decision.batch) == (1, 0, 1)


def test_longest_queue_first_policies_pick_the_longer_queue_and_their_exit_rule() -> None:
    # A holds 2 tasks, B 1: every LQF policy serves A with b = 2.
    # All-Final: e1. All-Early: e0. Early-Exit+LQF: slack 49 ms, deepest fitting exit e1 (12 ms).
    assert (_decide("all-final", _urgent_b()).model, _decide("all-final", _urgent_b()).exit) == (0, 1)
    assert (_decide("all-early", _urgent_b()).model, _decide("all-early", _urgent_b()).exit) == (0, 0)
    lqf = _decide("early-exit-lqf", _urgent_b())
    assert (lqf.model, lqf.exit, lqf.batch, lqf.predicted_s) == (0, 1, 2, 0.012)


def test_earliest_deadline_first_picks_the_least_slack_and_the_deepest_exit_that_fits() -> None:
    # Deadlines: A's head 1.049, B's head 1.010 -> B. Slack 10 ms: e1 (20 ms) misses, e0 (4 ms) fits.
    decision = _decide("early-exit-edf", _urgent_b())
    assert (decision.model, decision.exit, decision.batch) == (1, 0, 1)


def test_adaptive_exit_falls_back_to_the_shallowest_when_nothing_fits() -> None:
    # B's only task has waited 49 ms: slack 1 ms < 4 ms (e0): no exit fits, so e0.
    queues = [TaskQueue(), TaskQueue()]
    queues[1].push(0, NOW - 0.049, D)
    assert _decide("early-exit-edf", queues).exit == 0
    assert _decide("stability", queues).exit == 0


def test_lqf_ties_go_to_the_lower_model_index() -> None:
    queues = [TaskQueue(), TaskQueue()]
    queues[0].push(0, NOW - 0.001, D)
    queues[1].push(1, NOW - 0.030, D)
    assert _decide("all-final", queues).model == 0


def _doom_latency() -> LatencyModel:
    # A (batch up to 4): e0 = 2, 2.5, 3, 3.5 ms; e1 = 30, 32, 34, 36 ms. B: e0 = 4 ms, e1 = 20 ms (b1).
    a = ModelLatency(
        "A", ("e0", "e1"), (0, 1), 4, np.array([[2.0, 2.5, 3.0, 3.5], [30.0, 32.0, 34.0, 36.0]]) / 1000
    )
    b = ModelLatency("B", ("e0", "e1"), (0, 1), 1, np.array([[4.0], [20.0]]) / 1000)
    return LatencyModel((a, b))


def _doom_state() -> list[TaskQueue]:
    # A: three tasks that waited 10, 9.5 and 9 ms (slack 40 ms); B: one task that waited 20 ms (slack 30 ms).
    a, b = TaskQueue(), TaskQueue()
    for k, waited in enumerate((0.010, 0.0095, 0.009)):
        a.push(k, NOW - waited, D)
    b.push(3, NOW - 0.020, D)
    return [a, b]


def test_paper_rule_can_doom_another_queue_that_protective_and_safe_exits_save() -> None:
    # Paper exits: A (b=3, slack 40): e1 = 34 ms fits; B (b=1, slack 30): e1 = 20 ms fits.
    #   S_A: B's task waits 20 + 34 = 54 ms: e^(0.08) = 1.083287
    #   S_B: A's tasks wait 30, 29.5, 29 ms: e^(-0.40) + e^(-0.41) + e^(-0.42) = 1.991017
    #   -> the paper serves A at e1 for 34 ms and B's task (54 ms > 50) is lost.
    # Protective limits: B's spare = 30 - 4 (its e0) = 26 ms >= A's e0 (3 ms), so A may take at most
    #   min(40, 26) = 26 ms -> A at e0 (3 ms). A's spare = 40 - 3 = 37 ms -> B keeps e1 (20 ms).
    #   S_A with 3 ms: e^((20 + 3) / 50 - 1) = e^(-0.54) = 0.582748 < S_B -> serve A at e0.
    # Safe: A's paper exit (e1) is deeper than its protective one (e0): set aside while B is safe,
    #   so B is served at e1 (20 ms); A's tasks then still have 20 ms of slack.
    paper = StabilityPolicy(_doom_latency(), CODE).decide(_doom_state(), NOW)
    assert paper is not None and (paper.model, paper.exit, paper.batch) == (0, 1, 3)
    assert paper.score == pytest.approx(1.083287, abs=1e-6)
    protective = StabilityPolicy(_doom_latency(), CODE, exit_rule="protective").decide(_doom_state(), NOW)
    assert protective is not None and (protective.model, protective.exit, protective.batch) == (0, 0, 3)
    assert protective.score == pytest.approx(0.582748, abs=1e-6)
    safe_policy = StabilityPolicy(_doom_latency(), CODE, exit_rule="safe")
    a, b = safe_policy.candidates(_doom_state(), NOW)
    assert (a.exit_pos, a.eligible, b.exit_pos, b.eligible) == (1, False, 1, True)
    assert b.score == pytest.approx(1.991017, abs=1e-6)
    safe = safe_policy.decide(_doom_state(), NOW)
    assert safe is not None and (safe.model, safe.exit, safe.batch) == (1, 1, 1)


def _symphony_latency() -> LatencyModel:
    # One model, final exit only: 62.5 ms at b1, 125 ms at b2 (binary fractions: exact arithmetic).
    return LatencyModel((ModelLatency("A", ("final",), (3,), 2, np.array([[0.0625, 0.125]])),))


def test_symphony_waits_until_one_more_request_would_miss_then_dispatches() -> None:
    # Budget 0.5 s; tasks arrived at 0.0 and 0.125 -> deadlines 0.5 and 0.625.
    # At 0.25: B=1 ready if min(0.5, 0.625) - L(2) = 0.375 <= now: no; B=2 (all live tasks) ready if
    #   0.5 - L(2) = 0.375 <= now: no. Earliest ready time 0.375 -> Wait(until=0.375).
    # At 0.375: B=1 is ready (0.375 <= 0.375): dispatch one task at the final exit (manifest index 3).
    policy = SymphonyPolicy(_symphony_latency())
    queue = TaskQueue()
    queue.push(0, 0.0, 0.5)
    queue.push(1, 0.125, 0.5)
    assert policy.decide([queue], 0.25) == Wait(until=0.375)
    decision = policy.decide([queue], 0.375)
    assert isinstance(decision, Dispatch)
    assert (decision.model, decision.exit, decision.batch, decision.predicted_s) == (0, 3, 1, 0.0625)


def test_symphony_drops_tasks_already_past_their_deadline_explicitly() -> None:
    # Task 0's deadline 0.5 < now 0.6: dropped. Task 1 (deadline 1.1) alone: ready at 1.1 - 0.0625.
    policy = SymphonyPolicy(_symphony_latency())
    queue = TaskQueue()
    queue.push(0, 0.0, 0.5)
    queue.push(1, 0.6, 0.5)
    decision = policy.decide([queue], 0.6)
    assert decision == Wait(until=1.1 - 0.0625, drops=(Drop(0, (0,)),))
    queue.remove([0])
    assert policy.decide([queue], 0.6) == Wait(until=1.1 - 0.0625)


def test_symphony_with_only_expired_tasks_drops_them_and_waits_for_arrivals() -> None:
    queue = TaskQueue()
    queue.push(7, 0.0, 0.5)
    assert SymphonyPolicy(_symphony_latency()).decide([queue], 2.0) == Wait(math.inf, drops=(Drop(0, (7,)),))


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_answers_none_on_empty_queues_and_is_selectable_by_name(name: str) -> None:
    policy = make_policy(name, _latency())
    assert policy.name == name
    assert isinstance(policy, Policy)
    assert policy.decide([TaskQueue(), TaskQueue()], NOW) is None


def test_unknown_policy_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="all-final-deadline-aware"):
        make_policy("fifo", _latency())

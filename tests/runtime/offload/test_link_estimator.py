"""LinkEstimator on synthetic traffic: it converges, ignores outliers and follows a changed link."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgeserve.runtime.offload.link_estimator import LinkEstimator

RTT = 0.010  # s, base round trip
BANDWIDTH = 1e6  # bytes/s
SERVICE = 0.004  # s, upstream's time for the batch


def reply(
    est: LinkEstimator,
    t: float,
    rng: np.random.Generator,
    *,
    rtt: float = RTT,
    bw: float = BANDWIDTH,
    service: float = SERVICE,
    report: bool = True,
    scale: float = 1.0,
) -> None:
    size_in, size_out = 20_000, 400
    network = rtt * (1 + 0.05 * rng.standard_normal()) + (size_in + size_out) / bw
    total = (network + service) * scale
    est.add_reply("m", 4, size_in, size_out, total, service * 1000.0 if report else None, t)


def test_estimates_converge_to_the_true_link_from_noisy_replies() -> None:
    rng = np.random.default_rng(0)
    est = LinkEstimator()
    for i in range(10):
        est.add_probe(RTT * (1 + 0.05 * rng.standard_normal()), now=i * 0.1)
    for i in range(40):
        reply(est, 1.0 + i * 0.05, rng)
    now = 3.0
    assert est.rtt_s(now, 0.5) == pytest.approx(RTT, rel=0.1)
    assert est.bandwidth(now, 0.5) == pytest.approx(BANDWIDTH, rel=0.25)
    assert est.service_s("m", 4, now) == pytest.approx(SERVICE, rel=0.01)
    truth = RTT + 20_400 / BANDWIDTH + SERVICE
    predicted = est.predict("m", 4, 20_400, now)
    assert truth <= predicted <= 1.3 * truth  # a conservative quantile, but not a wild one


def test_a_single_10x_spike_does_not_move_the_prediction() -> None:
    rng = np.random.default_rng(1)
    est = LinkEstimator()
    for i in range(5):
        est.add_probe(RTT, now=i * 0.1)
    for i in range(30):
        reply(est, 1.0 + i * 0.05, rng)
    before = est.predict("m", 4, 20_400, 3.0)
    reply(est, 3.0, rng, scale=10.0)  # a stall: the whole round trip took 10x as long
    after = est.predict("m", 4, 20_400, 3.01)
    assert after == pytest.approx(before, rel=0.05)
    assert est.estimate(3.01).rtt_ms == pytest.approx(RTT * 1000, rel=0.1)


def test_a_slower_link_shows_within_a_few_samples_and_the_old_one_is_forgotten() -> None:
    rng = np.random.default_rng(2)
    est = LinkEstimator(window=32, horizon_s=30.0)
    for i in range(5):
        est.add_probe(RTT, now=i * 0.1)
    t = 1.0
    for _ in range(32):
        reply(est, t, rng)
        t += 0.05
    fast = est.predict("m", 4, 20_400, t)
    for _ in range(5):  # the link's bandwidth drops 4x
        reply(est, t, rng, bw=BANDWIDTH / 4)
        t += 0.05
    slow_truth = RTT + 20_400 / (BANDWIDTH / 4) + SERVICE
    assert est.predict("m", 4, 20_400, t) >= 0.9 * slow_truth > fast  # the conservative quantile moved
    for _ in range(32):
        reply(est, t, rng, bw=BANDWIDTH / 4)
        t += 0.05
    assert est.bandwidth(t, 0.5) == pytest.approx(BANDWIDTH / 4, rel=0.25)  # median followed the step
    # and with no traffic for longer than the horizon, old samples no longer count
    assert est.rtt_s(t + 31.0) is None


def test_service_time_without_server_timing_is_the_rtt_minus_the_network_part() -> None:
    rng = np.random.default_rng(3)
    est = LinkEstimator()
    for i in range(10):
        est.add_probe(RTT, now=i * 0.01)
    for i in range(20):
        reply(est, 1.0 + i * 0.01, rng, bw=1e12, report=False)  # a fast link: transfer ~0
    assert est.service_s("m", 4, 1.3) == pytest.approx(SERVICE, abs=0.002)


def test_unseen_batch_sizes_borrow_conservatively_and_nothing_known_means_never() -> None:
    est = LinkEstimator()
    assert est.predict("m", 1, 100, 0.0) == math.inf  # no probe, no reply, no prior: do not offload
    est.add_probe(0.002, 0.0)
    assert est.predict("m", 2, 0, 0.0, prior_service_s=0.003) == pytest.approx(0.005)
    for i in range(8):
        est.add_reply("m", 4, 0, 0, 0.010, 8.0, 0.01 * i)
    assert est.service_s("m", 2, 0.1) == pytest.approx(0.008)  # a larger batch's time, as is
    assert est.service_s("m", 8, 0.1) == pytest.approx(0.016)  # a smaller one's, scaled linearly
    assert est.service_s("other", 4, 0.1) is None

"""FloodTally: what a connection refused and accepted lately, by POLITE_S periods; PeerFront: the
HTTP front's clients seen the same way, from its FrontendStats."""

from __future__ import annotations

from edgeserve.net.flood_tally import LIGHT_RATIO, LIGHT_TRACK, FloodTally, PeerFront
from edgeserve.runtime import FrontendStats


def test_counts_cover_the_current_period_and_while_it_is_young_the_one_before() -> None:
    tally = FloodTally(period_s=1.0)
    tally.roll(0.0).refused += 5
    tally.roll(0.5).refused += 3
    assert tally.lately(0.9).refused == 8
    tally.roll(1.2).refused += 1  # a new period began: the old one still counts while it is young
    assert tally.lately(1.5).refused == 9
    assert tally.lately(2.3).refused == 1  # the current period alone once it is a period old
    assert tally.lately(3.2).refused == 0  # nothing for two periods: forgotten
    tally.roll(3.3).refused += 2
    assert tally.lately(3.4).refused == 2  # the period before that was too old to carry over


def test_a_flood_refuses_many_times_what_it_gets_with_its_full_window() -> None:
    tally = FloodTally(period_s=1.0)
    counts = tally.roll(0.0)
    counts.full_accepted, counts.full_refused = 8, 40  # five times what its window let through
    assert not tally.floods_heavily(0.1, ratio=8)
    counts.full_refused = 64
    assert tally.floods_heavily(0.1, ratio=8)
    # refusals under the small window after a hold are not counted as full-window ones
    counts.full_refused, counts.refused = 0, 10_000
    assert not tally.floods_heavily(0.1, ratio=8)
    counts.full_accepted, counts.full_refused = 0, 8  # nothing accepted counts as one
    assert tally.floods_heavily(0.1, ratio=8)


def test_a_light_client_has_a_record_of_accepted_requests_and_few_refused() -> None:
    tally = FloodTally(period_s=1.0)
    assert not tally.light(0.0)  # no record yet: a new client gets the even share
    counts = tally.roll(0.0)
    counts.accepted = LIGHT_TRACK - 1
    assert not tally.light(0.1)
    counts.accepted = LIGHT_TRACK * LIGHT_RATIO
    counts.refused = LIGHT_TRACK
    assert tally.light(0.1)  # one refused for every LIGHT_RATIO accepted
    counts.refused += 1
    assert not tally.light(0.1)
    assert not tally.light(2.5)  # a record two periods old is forgotten


def test_another_front_counts_as_one_client_sending_lately_and_polite_while_few_are_refused() -> None:
    stats = FrontendStats()
    peer = PeerFront(stats, FloodTally(period_s=1.0))
    stats.requests = 500  # before the first look: of unknown age, not "lately"
    assert peer.lately(0.0) == (False, False)
    stats.requests += 10 * LIGHT_RATIO
    assert peer.lately(0.1) == (True, True)
    stats.by_status["rejected"] = 10  # one refused for every LIGHT_RATIO requests: still polite
    assert peer.lately(0.2) == (True, True)
    stats.by_status["rejected"] += 1
    assert peer.lately(0.3) == (True, False)  # many of its requests refused: its clients flood
    assert peer.lately(2.4) == (False, False)  # nothing for two periods: not sending
    stats.requests += 1_000  # sent while nobody looked for longer than lately: not counted
    assert peer.lately(9.0) == (False, False)
    stats.requests += 4
    assert peer.lately(9.1) == (True, True)

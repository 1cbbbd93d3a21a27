"""Admission (net/admission.py) without a socket or a thread: a connection's room in each regime
of its window, the hold of a flood after a read, the counters, and the FloodTally / PeerFront
records the holds and the light clients are told by."""

from __future__ import annotations

import itertools

from edgeserve.net.admission import Admission, FloodTally, PeerFront, Share
from edgeserve.net.settings import AdmissionSettings
from edgeserve.runtime import FrontendStats

NOW = 100.0  # the loop's time of the read
DEFAULTS = AdmissionSettings()
NEVER_LIGHT = AdmissionSettings(light_track=1 << 30)  # the rule without the light clients' regime


def front(
    max_in_flight: int,
    total: int,
    share_total: bool = True,
    in_flight: int = 0,
    busy: int = 0,
    sending: int = 0,
    settings: AdmissionSettings = NEVER_LIGHT,
) -> Admission:
    """An Admission in a given state; `sending` greeted connections sent just now."""
    admission = Admission(settings)
    admission.max_in_flight, admission.total, admission.share_total = max_in_flight, total, share_total
    admission.in_flight, admission.busy = in_flight, busy
    for _ in range(sending):
        admission.join(sender(admission))
    return admission


def sender(admission: Admission, last_data: float = NOW) -> Share:
    share = admission.share()
    share.greeted, share.last_data = True, last_data
    return share


def mine(admission: Admission, in_flight: int = 0) -> Share:
    share = admission.share()
    share.in_flight, share.last_data = in_flight, NOW
    return share


def test_room_is_what_the_window_admits_one_request_after_another() -> None:
    """`room` (how many frames of one read a connection may accept) is what accepting them one by
    one leaves it: each accept moves its window (the total fills, its first makes it busy), and
    the room it has after each is one less, down to 0."""
    fronts = {sending: front(1, 1, sending=sending) for sending in (0, 1, 3)}
    for max_in_flight, total, ours, in_flight, busy, share_total, sending in itertools.product(
        range(1, 7), range(1, 26), range(0, 8), range(0, 30), range(0, 6), [True, False], [0, 1, 3]
    ):
        if ours > in_flight or busy > in_flight or (ours > 0 and busy == 0) or in_flight > total + 4:
            continue
        admission = fronts[sending]
        admission.max_in_flight, admission.total, admission.share_total = max_in_flight, total, share_total
        admission.in_flight, admission.busy = in_flight, busy
        share = mine(admission, ours)
        room = admission.room(share)
        for left in range(room, 0, -1):
            assert admission.room(share) == left
            admission.accept(share)
        assert admission.room(share) == 0


def test_a_connection_alone_may_fill_the_total_and_shares_it_as_others_come() -> None:
    """With share_total, below the total a busy connection's window is its even share of it (at
    least max_in_flight); at the total the share is at most max_in_flight, as without it."""
    admission = front(8, 32)
    assert admission.room(mine(admission)) == 32
    admission = front(8, 32, share_total=False)
    assert admission.room(mine(admission)) == 8
    admission = front(8, 32, in_flight=20, busy=1)
    assert admission.room(mine(admission, 20)) == 12  # alone: up to the total
    assert admission.room(mine(admission)) == 12  # a second connection: its share 16, 12 left
    admission = front(8, 32, in_flight=24, busy=4)
    assert admission.room(mine(admission, 6)) == 2  # four busy: max_in_flight, as before
    admission = front(8, 32, in_flight=32, busy=1)
    assert admission.room(mine(admission, 32)) == 0  # at the total
    assert admission.room(mine(admission)) == 8  # the newcomer still gets its window
    admission = front(8, 32, in_flight=10, busy=1, sending=2)
    assert admission.room(mine(admission, 10)) == 6  # a client sends now and then beside it: 16


def test_a_light_client_keeps_its_whole_window_at_the_total() -> None:
    admission = front(8, 8, in_flight=8, busy=2, settings=DEFAULTS)
    share = mine(admission, 2)
    assert admission.room(share) == 2  # its even share: 4
    share.tally.count(NOW, DEFAULTS.light_track * DEFAULTS.light_ratio, DEFAULTS.light_track, full=True)
    assert admission.room(share) == 6  # a record of requests served, few refused: max_in_flight
    share.tally.count(NOW, 0, 1, full=True)  # one refused too many: the share binds again
    assert admission.room(share) == 2


def test_after_a_hold_the_small_window_binds_until_it_ends() -> None:
    admission = front(8, 32, share_total=False)
    share = mine(admission, 1)
    share.small_window, share.small_until = 2, NOW + 0.1
    assert admission.room(share) == 1
    share.in_flight = 3
    assert admission.room(share) == -1  # full (at most 0)
    share.small_until = NOW
    assert admission.room(share) == 5  # its window again


def test_accepts_and_answers_count_the_busy_connections_and_the_total() -> None:
    admission = front(8, 32)
    one, two = mine(admission), mine(admission)
    admission.accept(one)
    admission.accept(one)
    admission.accept(two)
    assert (admission.in_flight, admission.busy, one.in_flight) == (3, 2, 2)
    assert one.tally.lately(NOW).full_accepted == 2
    admission.answered(one)
    admission.answered(two)
    assert (admission.in_flight, admission.busy) == (1, 1)
    admission.answered(one)
    assert (admission.in_flight, admission.busy) == (0, 0)


def flood(admission: Admission, refused: int, held: bool = False) -> tuple[Share, float]:
    """A connection whose read refused `refused` frames past its window: the hold it gets."""
    share = sender(admission)
    admission.join(share)
    return share, admission.after_read(share, refused, held, lambda: NOW + 0.1)


def test_a_lone_heavy_flood_is_held_beside_a_polite_client() -> None:
    settings = DEFAULTS
    admission = front(2, 8, settings=settings)
    polite = sender(admission)
    admission.join(polite)
    share, hold = flood(admission, settings.flood_frames)
    assert hold == settings.flood_pause_s and share.last_flood == NOW
    assert share.small_window == settings.flood_window
    assert share.small_until == NOW + 0.1 + settings.flood_pause_s + settings.polite_s


def test_no_hold_without_a_flood_or_a_polite_client_or_while_held() -> None:
    settings, clock = DEFAULTS, lambda: NOW
    admission = front(2, 8, settings=settings)
    share, hold = flood(admission, settings.flood_frames - 1)  # not a flood: counted only
    assert hold == 0.0 and share.last_flood == -float("inf")
    assert share.tally.lately(NOW).full_refused == settings.flood_frames - 1
    lone = front(2, 8, settings=settings)
    share = sender(lone)
    lone.join(share)
    assert lone.after_read(share, settings.flood_frames, False, clock) == 0.0  # nobody to serve
    assert share.last_flood == NOW
    lone.join(sender(lone, NOW - 2.0))  # silent for over a second: not counted
    assert lone.after_read(share, settings.flood_frames, False, clock) == 0.0
    lone.join(sender(lone))  # a polite client
    assert lone.after_read(share, settings.flood_frames, True, clock) == 0.0  # held already
    assert lone.after_read(share, settings.flood_frames, False, clock) == settings.flood_pause_s


def test_a_client_under_flood_ratio_times_its_window_is_not_held() -> None:
    settings = DEFAULTS
    admission = front(2, 8, settings=settings)
    admission.join(sender(admission))  # polite
    share = sender(admission)
    admission.join(share)
    share.tally.count(NOW, 10, 0, full=True)  # it got 10 through its window
    assert admission.after_read(share, 10 * settings.flood_ratio - 1, False, lambda: NOW) == 0.0
    assert admission.after_read(share, 1, False, lambda: NOW) == 0.0  # not a flood in this read
    assert admission.after_read(share, settings.flood_frames, False, lambda: NOW) > 0.0


def test_a_flood_beside_another_flood_and_a_polite_client_gets_the_shared_window() -> None:
    settings = DEFAULTS
    admission = front(2, 8, settings=settings)
    admission.join(sender(admission))  # polite
    other = sender(admission)
    other.last_flood = NOW  # flooded lately
    admission.join(other)
    share, hold = flood(admission, settings.flood_frames)
    assert hold == 0.0
    assert (share.small_window, share.small_until) == (
        settings.shared_flood_window,
        NOW + 0.1 + settings.polite_s,
    )


def test_the_http_front_counts_as_one_more_client() -> None:
    stats = FrontendStats()
    admission = Admission(DEFAULTS, [stats])
    admission.peers[0].lately(NOW + 0.4)  # a first look: what came before is of unknown age
    stats.requests += 10
    _, hold = flood(admission, DEFAULTS.flood_frames)
    assert hold == DEFAULTS.flood_pause_s  # its clients are polite: the flood is held for them


def test_sending_counts_the_greeted_clients_that_sent_lately_every_so_often() -> None:
    settings = DEFAULTS
    admission = front(2, 8, sending=2, settings=settings)
    admission.join(sender(admission, NOW - settings.sending_s))  # too long ago
    assert admission.sending(NOW) == 2
    admission.join(sender(admission))
    assert admission.sending(NOW + settings.sending_every_s / 2) == 2  # counted a moment ago
    assert admission.sending(NOW + settings.sending_every_s * 2) == 3


# -- FloodTally and PeerFront: what a connection (or the HTTP front) sent lately --------------------


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
    track, ratio = DEFAULTS.light_track, DEFAULTS.light_ratio
    tally = FloodTally(period_s=1.0)
    assert not tally.light(0.0, track, ratio)  # no record yet: a new client gets the even share
    counts = tally.roll(0.0)
    counts.accepted = track - 1
    assert not tally.light(0.1, track, ratio)
    counts.accepted = track * ratio
    counts.refused = track
    assert tally.light(0.1, track, ratio)  # one refused for every `ratio` accepted
    counts.refused += 1
    assert not tally.light(0.1, track, ratio)
    assert tally.light(1.5, track, ratio) == tally.light(0.1, track, ratio)  # (the period before)
    assert not tally.light(2.5, track, ratio)  # a record two periods old is forgotten


def test_another_front_counts_as_one_client_sending_lately_and_polite_while_few_are_refused() -> None:
    ratio = DEFAULTS.light_ratio
    stats = FrontendStats()
    peer = PeerFront(stats, FloodTally(period_s=1.0), ratio)
    stats.requests = 500  # before the first look: of unknown age, not "lately"
    assert peer.lately(0.0) == (False, False)
    stats.requests += 10 * ratio
    assert peer.lately(0.1) == (True, True)
    stats.by_status["rejected"] = 10  # one refused for every `ratio` requests: still polite
    assert peer.lately(0.2) == (True, True)
    stats.by_status["rejected"] += 1
    assert peer.lately(0.3) == (True, False)  # many of its requests refused: its clients flood
    assert peer.lately(2.4) == (False, False)  # nothing for two periods: not sending
    stats.requests += 1_000  # sent while nobody looked for longer than lately: not counted
    assert peer.lately(9.0) == (False, False)
    stats.requests += 4
    assert peer.lately(9.1) == (True, True)

"""Admission past capacity (scheduler/admission.py): the queued work at a saturated server's
cost per request, against the share of a new request's deadline."""

from __future__ import annotations

import pytest

from scheduler.admission import Admission, room_for
from scheduler.deployment import Deployment
from scheduler.profile import load_profile
from scheduler.state import SchedulerState
from scheduler.types import Request
from tests.sim_cases import GOOGLENET, GOOGLENET_V100, REPVGG, REPVGG_V100

G = GOOGLENET


@pytest.fixture(scope="module")
def d() -> Deployment:
    return Deployment([load_profile(GOOGLENET_V100)], groups=5)


def queue(d: Deployment, positions: list[int]) -> SchedulerState:
    return SchedulerState(d, [Request(f"r{i}", G, p, 0.0, 1e9) for i, p in enumerate(positions)])


def test_tail_ms_is_the_cheapest_per_sample_cost_from_a_position(d: Deployment) -> None:
    limit = d.batch_limit(G)
    for position in (0, 4, 9):
        per_sample = [d.run_ms(G, position, 10, b) / b for b in range(1, limit + 1)]
        assert d.tail_ms(G, position) == pytest.approx(min(per_sample))
        # batching pays: a sample at the cheapest batch costs less than one alone
        assert d.tail_ms(G, position) < d.solo_ms(G, position)
    assert d.tail_ms(G, 0) > d.tail_ms(G, 4) > d.tail_ms(G, 9)


def test_an_empty_queue_admits_what_one_tail_fits(d: Deployment) -> None:
    tail = d.tail_ms(G, 0)
    empty = queue(d, [])
    assert room_for(empty, G, 0, deadline_ms=100.0 + tail + 0.01, now_ms=100.0)
    assert not room_for(empty, G, 0, deadline_ms=100.0 + tail - 0.01, now_ms=100.0)


def test_the_queue_ahead_counts_from_where_each_request_stands(d: Deployment) -> None:
    state = queue(d, [0, 0, 4, 9])
    work = 2 * d.tail_ms(G, 0) + d.tail_ms(G, 4) + d.tail_ms(G, 9)
    mine = d.tail_ms(G, 4)  # the newcomer enters at stage 4 (a feature map)
    assert room_for(state, G, 4, deadline_ms=work + mine + 0.01, now_ms=0.0)
    assert not room_for(state, G, 4, deadline_ms=work + mine - 0.01, now_ms=0.0)
    # the arrivals still decoding stand before it, at its own cost each
    assert room_for(state, G, 4, work + 3 * mine + 0.01, 0.0, ahead=2)
    assert not room_for(state, G, 4, work + 3 * mine - 0.01, 0.0, ahead=2)


def test_share_holds_the_queue_short_of_the_deadline(d: Deployment) -> None:
    state = queue(d, [0] * 20)
    need = 21 * d.tail_ms(G, 0)
    assert room_for(state, G, 0, deadline_ms=need, now_ms=0.0)
    assert not room_for(state, G, 0, deadline_ms=need, now_ms=0.0, share=2 / 3)
    assert room_for(state, G, 0, deadline_ms=1.5 * need + 0.01, now_ms=0.0, share=2 / 3)
    # the deadline counts from now: the same deadline later leaves less room
    assert not room_for(state, G, 0, deadline_ms=need, now_ms=1.0)


def arrival(deadline_ms: float, now_ms: float = 0.0) -> Request:
    return Request("new", G, 0, now_ms, deadline_ms)


def test_the_door_admits_to_the_deadline_until_a_drop_then_within_the_share(
    d: Deployment,
) -> None:
    state = queue(d, [0] * 20)
    need = 21 * d.tail_ms(G, 0)  # the queue's work and the newcomer's
    door = Admission(2 / 3)
    assert door.share_now() == 1.0
    assert not door.turns_away(state, "dp-tardy", arrival(need + 0.01), 0.0)
    assert door.turns_away(state, "dp-tardy", arrival(need - 0.01), 0.0)
    door.dropped()  # e.g. that turn-away, or a plan's drop
    assert door.share_now() == pytest.approx(2 / 3)
    assert door.turns_away(state, "dp-tardy", arrival(need + 0.01), 0.0)
    assert not door.turns_away(state, "dp-tardy", arrival(1.5 * need + 0.01), 0.0)
    # still overloaded while requests are being decoded ahead of an empty queue
    empty = queue(d, [])
    door.turns_away(empty, "dp-tardy", arrival(1e9), 0.0, ahead=1)
    assert door.overloaded
    # an arrival that finds the queue empty ends the overload, and is itself counted at 1
    one = d.tail_ms(G, 0)
    assert not door.turns_away(empty, "dp-tardy", arrival(one + 0.01), 0.0)
    assert not door.overloaded and door.share_now() == 1.0


def test_the_door_lets_through_what_it_does_not_judge(d: Deployment) -> None:
    full = queue(d, [0] * 20)
    door = Admission()
    door.dropped()
    # a policy that never drops for lateness: every request joins
    assert not door.turns_away(full, "dp-time", arrival(1.0), 0.0)
    # an unknown app, or a position past the app's end, is left to the checks that name it
    assert not door.turns_away(full, "dp-tardy", Request("x", "no-such-app", 0, 0.0, 1.0), 0.0)
    assert not door.turns_away(full, "dp-tardy", Request("x", G, 10, 0.0, 1.0), 0.0)
    assert door.overloaded  # none of those ends an overload


@pytest.mark.parametrize("share", [0.0, -0.5, 1.01, float("nan")])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match=r"admission share: expected a number in \(0, 1\]"):
        Admission(share)


def test_two_apps_share_one_door() -> None:
    """A queue holding two apps counts both apps' work, and a drop of one app's request holds
    the share for the other's arrivals too, until an arrival finds the queue empty."""
    both = Deployment([load_profile(GOOGLENET_V100), load_profile(REPVGG_V100)], groups=5)
    r = REPVGG
    queued = [Request(f"g{i}", G, 0, 0.0, 1e9) for i in range(5)]
    queued += [Request(f"r{i}", r, 0, 0.0, 1e9) for i in range(5)]
    state = SchedulerState(both, queued)
    work = 5 * both.tail_ms(G, 0) + 5 * both.tail_ms(r, 0)
    door = Admission(2 / 3)
    mine = both.tail_ms(r, 0)
    assert not door.turns_away(state, "dp-tardy", Request("a", r, 0, 0.0, work + mine + 0.01), 0.0)
    assert door.turns_away(state, "dp-tardy", Request("b", r, 0, 0.0, work + mine - 0.01), 0.0)
    door.dropped()  # a googlenet request dropped by a plan
    # the repvgg arrival is now held to the share of its own deadline
    assert door.turns_away(state, "dp-tardy", Request("c", r, 0, 0.0, work + mine + 0.01), 0.0)
    roomy = 1.5 * (work + mine) + 0.01
    assert not door.turns_away(state, "dp-tardy", Request("d", r, 0, 0.0, roomy), 0.0)
    # one app's requests still queued keep the queue overloaded for the other's arrivals
    only_r = SchedulerState(both, [q for q in queued if q.app == r])
    door.turns_away(only_r, "dp-tardy", Request("e", G, 0, 0.0, 1e9), 0.0)
    assert door.overloaded
    empty = SchedulerState(both, [])
    assert not door.turns_away(empty, "dp-tardy", Request("f", G, 0, 0.0, 1e9), 0.0)
    assert not door.overloaded

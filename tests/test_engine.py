"""The runtime step shared by the simulator and the server (scheduler/engine.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.deployment import Deployment
from scheduler.engine import Engine
from scheduler.policies import POLICIES, make_policy
from scheduler.policies.common import EXPIRED, HOPELESS
from scheduler.profile import load_profile
from scheduler.state import SchedulerState
from scheduler.types import Plan, Request
from sim.simulator import simulate
from sim.workload import make_workload
from tests.sim_cases import GOOGLENET, GOOGLENET_V100

G = GOOGLENET


@pytest.fixture(scope="module")
def d() -> Deployment:
    dep = Deployment([load_profile(GOOGLENET_V100)], groups=5)
    # batch-1 time split into 5 groups of about equal time
    assert dep.group_bounds(G) == (0, 3, 5, 7, 9)
    return dep


def req(rid: str, position: int = 0, arrival: float = 0.0, deadline: float = 1e9) -> Request:
    return Request(rid, G, position, arrival, deadline)


@pytest.mark.parametrize(
    ("position", "expected"),
    [(0, (0, 3)), (1, (1, 3)), (3, (3, 5)), (4, (4, 5)), (8, (8, 9)), (9, (9, 10))],
)
@pytest.mark.parametrize("policy", ["nobatch", "dp-time", "dynamic"])
def test_first_action_is_cut_at_the_next_group_boundary(
    d: Deployment, policy: str, position: int, expected: tuple[int, int]
) -> None:
    e = Engine(d, make_policy(policy))
    assert e.admit(req("a", position), 0.0) == []
    plan = e.plan
    assert plan is not None
    # the plan itself runs the request to the end of the model; the step stops at the boundary
    assert plan.actions[0].stages == (position, 10)
    step, wake, drops = e.next_step(0.0)
    assert step is not None
    assert (wake, drops) == (None, [])
    assert step.action.stages == expected
    assert step.action.request_ids == ("a",)
    assert step.start_ms == 0.0
    assert step.end_ms == pytest.approx(d.run_ms(G, *expected, 1))
    assert e.busy_until_ms == step.end_ms
    # the state already shows where the step leaves the request
    if expected[1] < 10:
        assert e.state.get("a").position == expected[1]
        assert step.finished == ()
    else:
        assert "a" not in e.state
        assert [r.id for r in step.finished] == ["a"]
        assert step.finished[0].position == 10


def test_plan_made_while_busy_is_for_the_end_of_the_running_step(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a", arrival=0.0), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None
    busy_until = step.end_ms
    assert busy_until > 0.5
    e.admit(req("b", arrival=0.5), 0.5)  # arrives while "a" runs its first group
    plan = e.plan
    assert plan is not None
    reference = make_policy("dp-time").plan(SchedulerState(d, e.state.requests()), busy_until)
    assert plan == reference
    # and not the plan for the arrival time, which would start work while the device is busy
    early = make_policy("dp-time").plan(SchedulerState(d, e.state.requests()), 0.5)
    assert plan.completion_ms != early.completion_ms
    assert min(plan.completion_ms.values()) > busy_until
    # the device becomes free at busy_until and runs that plan's first action
    step2, _, _ = e.next_step(busy_until)
    assert step2 is not None
    assert step2.start_ms == busy_until
    first = plan.actions[0]
    assert step2.action.model == first.model
    assert step2.action.request_ids == first.request_ids
    assert step2.action.stages[0] == first.stages[0]


def test_an_unchanged_state_is_not_planned_twice(d: Deployment) -> None:
    calls: list[float] = []

    class Counting:
        name = "counting"

        def __init__(self) -> None:
            self.inner = make_policy("dp-time")

        def plan(self, state: SchedulerState, now_ms: float) -> Plan:
            calls.append(now_ms)
            return self.inner.plan(state, now_ms)

    e = Engine(d, Counting())
    e.admit(req("a"), 0.0)
    e.next_step(0.0)  # the plan made on admission is for t=0: reused
    assert calls == [0.0]


def test_expired_requests_are_dropped_with_a_reason(d: Deployment) -> None:
    e = Engine(d, make_policy("nobatch"))
    assert e.admit(req("ok", deadline=500.0), 10.0) == []
    drops = e.admit(req("late", arrival=-100.0, deadline=5.0), 10.0)
    assert [(x.request.id, x.reason, x.at_ms) for x in drops] == [("late", EXPIRED, 10.0)]
    assert "late" not in e.state
    assert "ok" in e.state
    plan = e.plan
    assert plan is not None
    assert plan.dropped_ids == ("late",)
    assert all("late" not in a.request_ids for a in plan.actions)


def test_dp_tardy_drops_hopeless_requests_with_a_reason(d: Deployment) -> None:
    solo = d.solo_ms(G, 0)  # 8.448 ms on a V100
    e = Engine(d, make_policy("dp-tardy"))
    drops = e.admit(req("tight", deadline=solo / 2), 0.0)
    assert [(x.request.id, x.reason) for x in drops] == [("tight", HOPELESS)]
    assert len(e.state) == 0
    assert e.admit(req("fine", deadline=solo * 3), 0.0) == []
    step, _, _ = e.next_step(0.0)
    assert step is not None
    assert step.action.request_ids == ("fine",)


def test_a_waiting_plan_returns_a_wake_up_time(d: Deployment) -> None:
    e = Engine(d, make_policy("nexus"))
    e.admit(req("a", deadline=150.0), 0.0)
    step, wake, drops = e.next_step(0.0)
    assert step is None
    assert drops == []
    assert wake is not None
    assert wake == pytest.approx(150.0 - d.solo_ms(G, 0), abs=1e-5)
    step, wake2, _ = e.next_step(wake)
    assert step is not None
    assert wake2 is None
    assert step.start_ms == wake


def test_nothing_to_do(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    assert e.next_step(0.0) == (None, None, [])


def test_timer_measures_each_plan(d: Deployment) -> None:
    readings = iter([1.0, 1.002, 5.0, 5.0005])
    e = Engine(d, make_policy("dp-time"), timer=lambda: next(readings))
    e.admit(req("a"), 0.0)
    e.admit(req("b"), 0.1)
    assert e.plan_us == pytest.approx([2000.0, 500.0])


class Recorder:
    """A policy wrapper that keeps every (requests, now, plan) the engine asked for."""

    def __init__(self, name: str) -> None:
        self.inner = make_policy(name)
        self.name = name
        self.calls: list[tuple[list[Request], float, Plan]] = []

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        before = state.requests()
        result = self.inner.plan(state, now_ms)
        self.calls.append((before, now_ms, result))
        return result


@pytest.mark.parametrize("policy", POLICIES)
def test_engine_plans_equal_policy_plans_on_the_same_state(d: Deployment, policy: str) -> None:
    # Drive the engine through a whole simulated run (arrivals, steps, drops, wake-ups), then
    # re-plan every state it planned for with a fresh policy on a fresh state (no memo tables):
    # the same plan each time, field for field.
    w = make_workload(d, 400, 120, "poisson", {G: 1.0}, 150.0, np.random.default_rng(3))
    rec = Recorder(policy)
    out = simulate(d, rec, w)
    assert len(rec.calls) > 100
    assert len(out.latency_ms) + len(out.dropped) == 120
    mismatches: list[Any] = []
    for requests, now_ms, plan in rec.calls:
        fresh = make_policy(policy).plan(SchedulerState(d, requests), now_ms)
        if fresh != plan:
            mismatches.append((now_ms, plan, fresh))
    assert mismatches == []

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
from scheduler.timeline import replay
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
    assert e.running == step
    # the state still shows where the step started, until the step reports what it ran
    assert e.state.get("a").position == position
    finished = e.finish(expected[1] - expected[0])
    assert e.running is None
    if expected[1] < 10:
        assert e.state.get("a").position == expected[1]
        assert finished == []
    else:
        assert "a" not in e.state
        assert [r.id for r in finished] == ["a"]
        assert finished[0].position == 10


def test_step_stage_ends_follow_the_profile(d: Deployment) -> None:
    e = Engine(d, make_policy("nobatch"))
    e.admit(req("a"), 2.0)
    step, _, _ = e.next_step(2.0)
    assert step is not None
    ends = [2.0 + d.run_ms(G, 0, k + 1, 1) for k in range(3)]
    assert step.stage_end_ms == pytest.approx(ends)
    # cancelled at t: every stage that started before t finishes; none starts at t
    assert step.stages_done_by(2.0) == 0
    assert step.stages_done_by(2.0001) == 1
    assert step.stages_done_by(ends[0]) == 1
    assert step.stages_done_by(ends[0] + 1e-6) == 2
    assert step.stages_done_by(ends[-1] + 5) == 3


def test_a_plan_made_while_busy_sees_the_running_step_where_it_started(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a", arrival=0.0), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None
    e.admit(req("b", arrival=0.5), 0.5)  # arrives while "a" runs its first group
    plan = e.plan
    assert plan is not None
    reference = make_policy("dp-time").plan(SchedulerState(d, e.state.requests()), 0.5)
    assert plan == reference
    assert e.state.get("a").position == 0
    with pytest.raises(RuntimeError):
        e.next_step(0.5)  # one step at a time
    e.finish(3)
    step2, _, _ = e.next_step(step.end_ms)
    assert step2 is not None and step2.start_ms == step.end_ms


def test_a_plan_made_while_busy_counts_the_running_step_from_its_start(d: Deployment) -> None:
    """A first action that carries on the running step ends when the step does by the profile,
    then runs the rest: not a whole step's time after now (scheduler/timeline.py)."""
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a"), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None and step.action.stages == (0, 3)
    mid = step.end_ms / 2
    e.replan(mid)
    plan = e.plan
    assert plan is not None and plan.actions[0].stages == (0, 10)
    rest_ms = d.run_ms(G, 3, 10, 1)
    assert plan.completion_ms["a"] == pytest.approx(step.end_ms + rest_ms)
    # the same requests on an idle device are counted from now
    idle = make_policy("dp-time").plan(SchedulerState(d, e.state.requests()), mid)
    assert idle.completion_ms["a"] == pytest.approx(mid + d.run_ms(G, 0, 10, 1))
    # a step that has overrun its profile ends now at the earliest
    overrun = 2 * step.end_ms
    e.replan(overrun)
    assert e.plan is not None
    assert e.plan.completion_ms["a"] == pytest.approx(overrun + rest_ms)


def test_preemption_is_wanted_only_when_the_newest_plan_does_not_start_with_the_step(
    d: Deployment,
) -> None:
    e = Engine(d, make_policy("edf"))
    e.admit(req("slow", position=3, deadline=1e6), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None and step.action.request_ids == ("slow",)
    assert step.action.stages == (3, 5)
    assert not e.wants_preemption()
    e.admit(req("later", position=3, arrival=0.2, deadline=2e6), 0.2)  # EDF keeps going
    assert not e.wants_preemption()
    # an earlier deadline at stage 0: EDF's batch runs it from stage 0 first, so the step stops
    e.admit(req("urgent", arrival=0.3, deadline=20.0), 0.3)
    assert e.plan is not None and e.plan.actions[0].request_ids == ("urgent",)
    assert e.wants_preemption()
    # a plan that does not carry on the running step is counted from now
    assert dict(e.plan.completion_ms) == replay(d, e.state.requests(), 0.3, e.plan.actions)[0]
    done = step.stages_done_by(0.3)
    assert done == 1
    e.finish(done)
    assert e.state.get("slow").position == 4
    step2, _, _ = e.next_step(step.stage_end_ms[0])
    assert step2 is not None and step2.action.request_ids == ("urgent",)


def test_a_plan_that_adds_requests_to_the_running_step_does_not_preempt(d: Deployment) -> None:
    e = Engine(d, make_policy("batch"))
    e.admit(req("a"), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None
    e.admit(req("b", arrival=0.1), 0.1)  # batch would run a and b together from stage 0
    plan = e.plan
    assert plan is not None and set(plan.actions[0].request_ids) == {"a", "b"}
    assert not e.wants_preemption()


def test_requests_of_the_running_step_are_not_dropped_mid_step(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a", deadline=5.0), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None
    # at t=6 a's deadline has passed: the plan drops it, but it is running and stays
    assert e.admit(req("b", arrival=6.0), 6.0) == []
    assert "a" in e.state
    e.finish(len(step.stage_end_ms))
    assert step.end_ms < 5.0
    _, _, drops = e.next_step(6.0)  # the device is free again; a's deadline has passed
    assert [dr.request.id for dr in drops] == ["a"]


def test_a_request_removed_while_running_is_not_advanced(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a"), 0.0)
    e.admit(req("b"), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None and set(step.action.request_ids) == {"a", "b"}
    assert [r.id for r in e.remove(["b"])] == ["b"]
    e.finish(len(step.stage_end_ms))
    assert "b" not in e.state and e.state.get("a").position == step.action.stages[1]


class Counting:
    """dp-time, recording the time of every plan it is asked for."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = make_policy("dp-time")
        self.calls: list[float] = []

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        self.calls.append(now_ms)
        return self.inner.plan(state, now_ms)


def test_an_unchanged_state_is_not_planned_twice(d: Deployment) -> None:
    counting = Counting()
    calls = counting.calls
    e = Engine(d, counting)
    e.admit(req("a"), 0.0)
    e.next_step(0.0)  # the plan made on admission is for t=0: reused
    assert calls == [0.0]


def test_a_plan_is_current_until_the_state_or_the_running_step_changes(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-tardy"))
    assert not e.plan_is_current()  # no plan yet
    e.admit(req("a"), 0.0)
    assert e.plan_is_current()
    step = e.next_step(0.0)[0]
    assert step is not None
    assert not e.plan_is_current()  # made before "a" started running
    e.replan(1.0)
    assert e.plan_is_current()
    e.replan(2.0)  # the clock alone does not make it stale
    assert e.plan_is_current()
    e.finish(len(step.stage_end_ms))
    assert not e.plan_is_current()
    nxt = e.continue_step(step.end_ms)
    assert nxt is not None
    assert not e.plan_is_current()  # made before the step that now runs had started
    e.replan(nxt.start_ms + 0.1)
    assert e.plan_is_current()
    e.add(req("b", arrival=nxt.start_ms + 0.2))
    assert not e.plan_is_current()


def test_expired_requests_are_dropped_with_a_reason(d: Deployment) -> None:
    e = Engine(d, make_policy("nobatch"))
    assert e.admit(req("ok", deadline=500.0), 10.0) == []
    drops = e.admit(req("late", arrival=-100.0, deadline=5.0), 10.0)
    assert [(x.request.id, x.reason, x.at_ms, x.predicted_ms) for x in drops] == [
        ("late", EXPIRED, 10.0, None)
    ]
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
    assert [(x.request.id, x.reason, x.predicted_ms) for x in drops] == [("tight", HOPELESS, solo)]
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
    """A policy wrapper that keeps every (state, now, plan) the engine asked for: the requests
    and what the device was doing (the running step, the step beside it)."""

    def __init__(self, name: str) -> None:
        self.inner = make_policy(name)
        self.name = name
        self.calls: list[tuple[list[Request], Any, float, Plan]] = []

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        before = state.requests()
        busy = (state.running, state.beside)
        result = self.inner.plan(state, now_ms)
        self.calls.append((before, busy, now_ms, result))
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
    for requests, busy, now_ms, plan in rec.calls:
        state = SchedulerState(d, requests)
        state.running, state.beside = busy
        fresh = make_policy(policy).plan(state, now_ms)
        if fresh != plan:
            mismatches.append((now_ms, plan, fresh))
    assert mismatches == []


def test_continue_step_runs_the_plans_next_group_without_planning(d: Deployment) -> None:
    counting = Counting()
    calls = counting.calls
    e = Engine(d, counting)
    e.admit(req("a"), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None and step.action.stages == (0, 3)
    e.finish(3)
    planned = len(calls)
    nxt = e.continue_step(step.end_ms)  # the rest of the same action, next group
    assert nxt is not None and nxt.action.stages == (3, 5) and nxt.action.request_ids == ("a",)
    assert len(calls) == planned  # no plan on the critical path
    # after a cancelled step the plan no longer says what comes next
    e.finish(1)
    assert e.continue_step(nxt.stage_end_ms[0]) is None
    step3, _, _ = e.next_step(nxt.stage_end_ms[0])
    assert step3 is not None and step3.action.stages == (4, 5)


def test_continue_step_refuses_a_piece_whose_requests_moved_or_left(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a"), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None
    e.remove(["a"])  # the client went away while its step ran
    e.finish(len(step.stage_end_ms))
    assert e.continue_step(step.end_ms) is None


def test_a_plan_made_while_busy_sets_what_continues(d: Deployment) -> None:
    e = Engine(d, make_policy("dp-time"))
    e.admit(req("a"), 0.0)
    step, _, _ = e.next_step(0.0)
    assert step is not None
    e.admit(req("b", arrival=0.1), 0.1)  # re-planned while "a" runs its first group
    e.finish(len(step.stage_end_ms))
    nxt = e.continue_step(step.end_ms)
    if nxt is None:  # the new plan batches "b" into "a"'s action: "b" cannot join mid-way
        first = e.plan.actions[0] if e.plan else None
        assert first is not None and set(first.request_ids) == {"a", "b"}
        nxt, _, _ = e.next_step(step.end_ms)
        assert nxt is not None
    # whatever runs next, its requests stand where it starts
    for rid in nxt.action.request_ids:
        assert e.state.get(rid).position == nxt.action.stages[0]

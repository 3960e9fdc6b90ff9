"""Scheduling policies (paper 003, sections 4.1-4.3 and 6.1): plan guarantees on random states,
the rule that defines each policy, dp-tardy's drops, hand-computed dp-time plans, the unit modes
and the incremental memo.

Plans are checked with `tests.sched_cases.check_plan`, which replays the actions with
`Deployment.latency_ms` alone (not `scheduler.timeline`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler.dp
from scheduler import Action, App, Deployment, Request, SchedulerState, make_policy
from scheduler.policies.common import HOPELESS, PREDICTED_LATE
from tests.sched_cases import (
    Case,
    cases,
    check_plan,
    make_profile,
    misses,
    req,
    state_of,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("nobatch", {}),
    ("dynamic", {}),
    ("batch", {}),
    ("nexus", {}),
    ("edf", {}),
    ("dp-time", {}),
    ("dp-time", {"exact": True}),
    ("dp-time", {"unit": "layer"}),
    ("dp-tardy", {}),
    ("dp-tardy", {"exact": True}),
]


def variant_id(v: tuple[str, dict[str, Any]]) -> str:
    name, kw = v
    return name + "".join(f"-{k}={x}" for k, x in kw.items())


def plan_of(case: Case, name: str, **kw: Any) -> tuple[SchedulerState, Any]:
    state = case.state()
    return state, make_policy(name, **kw).plan(state, case.now_ms)


def one_app(case: Case) -> Case:
    """The same case restricted to the app of its first request (a single-app problem)."""
    if case.requests:
        app = case.requests[0].app
        case.requests = [r for r in case.requests if r.app == app]
    return case


# --- 1. every policy: the plan guarantees -------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@FAST
@given(data=st.data())
def test_plan_guarantees_on_random_states(variant: tuple[str, dict[str, Any]], data: Any) -> None:
    """Replaying the actions from now (own replay): each action's requests stand at its first
    stage, batches within B, every request not dropped finishes exactly once and at the time the
    plan reports, dropped requests never run, expired requests are dropped, the objective is what
    the policy says it is (and every completion time is finite)."""
    name, kw = variant
    case = data.draw(cases())
    state, plan = plan_of(case, name, **kw)
    assert plan.policy == name
    check_plan(state, case.now_ms, plan, name)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_empty_state_gives_empty_plan(variant: tuple[str, dict[str, Any]]) -> None:
    d = Deployment([make_profile("m", [[1.0, 2.0, 3.0, 4.0]])])
    name, kw = variant
    plan = make_policy(name, **kw).plan(SchedulerState(d), 5.0)
    assert plan.actions == () and plan.dropped == () and dict(plan.completion_ms) == {}


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_deadline_at_now_is_dropped(variant: tuple[str, dict[str, Any]]) -> None:
    """deadline_ms <= now_ms means expired (the boundary itself included), for every policy."""
    d = Deployment([make_profile("m", [[1.0, 2.0, 3.0, 4.0]] * 2)])
    state = state_of(
        d, [req("at", "m", 0, 0.0, 10.0), req("before", "m", 1, 0.0, 9.0), req("ok", "m", 0)]
    )
    name, kw = variant
    plan = make_policy(name, **kw).plan(state, 10.0)
    assert set(plan.dropped_ids) == {"at", "before"}
    assert set(plan.completion_ms) == {"ok"}
    check_plan(state, 10.0, plan, name)


# --- 2. each policy's own rule -------------------------------------------------------------------
def arrival_key(r: Request) -> tuple[float, str]:
    return (r.arrival_ms, r.id)


def live_requests(case: Case) -> list[Request]:
    return sorted((r for r in case.requests if r.deadline_ms > case.now_ms), key=arrival_key)


@FAST
@given(cases())
def test_nobatch_runs_one_request_at_a_time_in_arrival_order(case: Case) -> None:
    state, plan = plan_of(case, "nobatch")
    d = case.deployment
    expected = []
    for r in live_requests(case):
        offset = 0
        for m in d.apps[r.app].models:
            n = d.profiles[m].num_stages
            if r.position < offset + n:
                expected.append(Action(m, (max(0, r.position - offset), n), (r.id,)))
            offset += n
    assert list(plan.actions) == expected
    check_plan(state, case.now_ms, plan, "nobatch")


def expected_dynamic(
    d: Deployment, live: list[Request]
) -> list[tuple[str, tuple[int, int], set[str]]]:
    """Triton-style: whenever idle, take the (model, stage) queue holding the oldest waiting
    request, its oldest min(B, len) requests, and run them to the model's end."""
    pos = {r.id: r.position for r in live}
    out = []
    while pos:
        head = next(r for r in live if r.id in pos)
        where = d.locate(head.app, pos[head.id])
        queue = [r for r in live if r.id in pos and d.locate(r.app, pos[r.id]) == where]
        model, stage = where
        batch = queue[: d.batch_limit(model)]
        n = d.profiles[model].num_stages
        out.append((model, (stage, n), {r.id for r in batch}))
        for r in batch:
            pos[r.id] += n - stage
            if pos[r.id] >= d.app_length(r.app):
                del pos[r.id]
    return out


@FAST
@given(cases())
def test_dynamic_batches_one_stage_and_runs_whole_model(case: Case) -> None:
    state, plan = plan_of(case, "dynamic")
    d = case.deployment
    rep = check_plan(state, case.now_ms, plan, "dynamic")
    for act in plan.actions:
        assert act.stages[1] == d.profiles[act.model].num_stages, "stops before the model's end"
        assert act.not_before_ms is None
    # own replay checked that all of an action's requests stand at its first stage; the whole
    # schedule is exactly the oldest-first whole-model rule
    got = [(a.model, a.stages, set(a.request_ids)) for a in plan.actions]
    assert got == expected_dynamic(d, live_requests(case))
    assert len(rep.completion) == len(live_requests(case))


def expected_batch_steps(
    d: Deployment, live: list[Request]
) -> list[tuple[str, int, frozenset[str]]]:
    """The Batch baseline without shared models, stage by stage: apps in order of their oldest
    request; each app's requests furthest first (ties: arrival) cut into runs of B; a run goes
    from its least advanced member to the app's end and takes each member on at its stage."""
    oldest: dict[str, tuple[float, str]] = {}
    for r in live:
        oldest.setdefault(r.app, arrival_key(r))
    steps = []
    for app in sorted(oldest, key=lambda a: oldest[a]):
        bound = min(d.batch_limit(m) for m in d.apps[app].models)
        order = sorted(
            (r for r in live if r.app == app), key=lambda r: (-r.position, r.arrival_ms, r.id)
        )
        for k in range(0, len(order), bound):
            seg = order[k : k + bound]
            for p in range(min(r.position for r in seg), d.app_length(app)):
                model, stage = d.locate(app, p)
                steps.append((model, stage, frozenset(r.id for r in seg if r.position <= p)))
    return steps


@FAST
@given(cases(shared=False))
def test_batch_forms_segments_of_b_in_furthest_first_order(case: Case) -> None:
    state, plan = plan_of(case, "batch")
    rep = check_plan(state, case.now_ms, plan, "batch")
    got = [(m, k, ids) for m, k, ids, _, _ in rep.steps]
    assert got == expected_batch_steps(case.deployment, live_requests(case))


def nexus_size(d: Deployment, oldest: Request, model: str) -> int:
    """Largest b <= B with 2 * T(b) <= the oldest's budget share for `model` (1 if none)."""
    chain = d.apps[oldest.app].models
    solo = {m: sum(d.latency_ms(m, k, 1) for k in range(d.profiles[m].num_stages)) for m in chain}
    share = (oldest.deadline_ms - oldest.arrival_ms) * solo[model] / sum(solo.values())
    n = d.profiles[model].num_stages
    fits = [
        b
        for b in range(1, d.batch_limit(model) + 1)
        if 2 * sum(d.latency_ms(model, k, b) for k in range(n)) <= share
    ]
    return max(fits, default=1)


def check_nexus_delays(case: Case, plan: Any, rep: Any) -> int:
    """Every delay (an action that starts after the device is free): at a model's first stage,
    a batch below Nexus' size, the oldest member leaves the model by its deadline."""
    d = case.deployment
    by_id = {r.id: r for r in case.requests}
    delays = 0
    free = case.now_ms
    for n, act in enumerate(plan.actions):
        start, end = rep.spans[n]
        if start > free:
            delays += 1
            assert act.not_before_ms is not None and math.isfinite(act.not_before_ms)
            assert act.stages[0] == 0, "nexus delays requests past a model's first stage"
            oldest = min((by_id[i] for i in act.request_ids), key=arrival_key)
            assert act.batch_size < nexus_size(d, oldest, act.model), "a full batch waited"
            assert end <= oldest.deadline_ms, "waited although the oldest then misses its deadline"
        else:
            assert act.not_before_ms is None or act.not_before_ms <= free
        free = end
    return delays


@FAST
@given(cases())
def test_nexus_delays_only_non_full_batches_whose_oldest_stays_on_time(case: Case) -> None:
    state, plan = plan_of(case, "nexus")
    rep = check_plan(state, case.now_ms, plan, "nexus")
    for act in plan.actions:
        assert act.stages[1] == case.deployment.profiles[act.model].num_stages
    check_nexus_delays(case, plan, rep)


def test_nexus_waits_for_a_non_full_batch_until_the_oldest_must_leave() -> None:
    # T(b) = 2b ms (one stage); B = 8; a 100 ms budget allows b = 8 (2 * 16 <= 100), so one
    # waiting request is a non-full batch: it starts as late as still ends by the deadline.
    d = Deployment([make_profile("m", [[2.0, 4.0, 8.0, 16.0]], max_batch=8)])
    state = state_of(d, [req("x", "m", 0, 0.0, 100.0)])
    plan = make_policy("nexus").plan(state, 0.0)
    rep = check_plan(state, 0.0, plan, "nexus")
    (act,) = plan.actions
    assert act.not_before_ms == pytest.approx(98.0, abs=1e-3)
    assert plan.completion_ms["x"] == pytest.approx(100.0, abs=1e-3)
    assert plan.completion_ms["x"] <= 100.0
    assert check_nexus_delays(Case(d, state.requests(), 0.0), plan, rep) == 1


def test_nexus_does_not_wait_when_the_oldest_cannot_afford_it() -> None:
    # two stages, T(b) = 4b in all. x arrived 100 ms ago with a 103.9 ms budget: Nexus' size is
    # B = 8 (2 * 32 <= 103.9) so one request is a non-full batch, but it needs 4 ms and only
    # 3.9 are left: waiting cannot keep it on time, so it starts now.
    d = Deployment([make_profile("m", [[2.0, 4.0, 8.0, 16.0]] * 2, max_batch=8)])
    tight = state_of(d, [req("x", "m", 0, -100.0, 3.9)])
    plan = make_policy("nexus").plan(tight, 0.0)
    assert plan.actions[0].not_before_ms is None and plan.completion_ms["x"] == 4.0
    # with 4.5 ms left it waits the 0.5 ms it can spare
    spare = state_of(d, [req("x", "m", 0, -100.0, 4.5)])
    plan = make_policy("nexus").plan(spare, 0.0)
    assert plan.actions[0].not_before_ms == pytest.approx(0.5, abs=1e-3)
    assert 4.4 < plan.completion_ms["x"] <= 4.5
    # past the first stage: never waits, even with a generous deadline
    mid = state_of(d, [req("y", "m", 1, 0.0, 500.0)])
    plan = make_policy("nexus").plan(mid, 0.0)
    assert plan.actions == (Action("m", (1, 2), ("y",)),)
    assert plan.completion_ms["y"] == 2.0


def test_nexus_full_batch_starts_at_once() -> None:
    # budget 20 ms: 2 * T(b) <= 20 for T(b) = 2b up to b = 5; five waiting requests are full
    d = Deployment([make_profile("m", [[2.0, 4.0, 8.0, 16.0]], max_batch=8)])
    state = state_of(d, [req(f"r{i}", "m", 0, float(i), 20.0 + i) for i in range(5)])
    plan = make_policy("nexus").plan(state, 5.0)
    check_plan(state, 5.0, plan, "nexus")
    assert plan.actions[0].not_before_ms is None
    assert set(plan.actions[0].request_ids) == {f"r{i}" for i in range(5)}


def test_nexus_request_without_deadline_runs_at_once() -> None:
    """No deadline, no budget to wait against: a non-full batch starts now (an earlier version
    waited until not_before_ms = inf, so the request never ran)."""
    d = Deployment([make_profile("m", [[1.0, 2.0, 3.0, 4.0]])])
    state = state_of(d, [req("x", "m", 0), req("y", "m", 0, 1.0)])  # deadline_ms = inf
    plan = make_policy("nexus").plan(state, 1.0)
    check_plan(state, 1.0, plan, "nexus")
    assert plan.actions == (Action("m", (0, 1), ("x", "y")),)
    assert dict(plan.completion_ms) == {"x": 3.0, "y": 3.0}


def edf_segments(plan: Any, rep: Any) -> list[tuple[int, int, set[str]]]:
    """Cut EDF's actions into its batches: a batch ends with the action after which every
    request it has run so far is finished. Returns (first action, last action, ids)."""
    out = []
    ids: set[str] = set()
    first = 0
    for n, act in enumerate(plan.actions):
        ids |= set(act.request_ids)
        if all(rep.finish_index.get(i, math.inf) <= n for i in ids):
            out.append((first, n, ids))
            ids, first = set(), n + 1
    assert not ids, "an EDF batch left unfinished"
    return out


@FAST
@given(cases())
def test_edf_batches_are_on_time_when_built(case: Case) -> None:
    state, plan = plan_of(case, "edf")
    rep = check_plan(state, case.now_ms, plan, "edf")
    by_id = {r.id: r for r in case.requests}
    remaining = {r.id for r in live_requests(case)}
    for _, last, ids in edf_segments(plan, rep):
        members = [by_id[i] for i in ids]
        assert len({r.app for r in members}) == 1, "an EDF batch mixes apps"
        # the batch starts with the earliest deadline still waiting
        head = min((by_id[i] for i in remaining), key=lambda r: (r.deadline_ms, *arrival_key(r)))
        assert head.id in ids
        if len(ids) > 1:
            end = rep.spans[last][1]
            assert all(end <= r.deadline_ms for r in members), "a batch that makes a member late"
        remaining -= ids
    assert not remaining


def test_edf_batches_when_everyone_stays_on_time_and_not_otherwise() -> None:
    # one stage, T(1) = 4, T(2) = 5. Deadlines 6 and 20: together (5 ms) both on time -> batch.
    d = Deployment([make_profile("m", [[4.0, 5.0, 9.0, 17.0]])])
    both = state_of(d, [req("a", "m", 0, 0.0, 6.0), req("b", "m", 0, 0.0, 20.0)])
    plan = make_policy("edf").plan(both, 0.0)
    assert [set(a.request_ids) for a in plan.actions] == [{"a", "b"}]
    # deadline 4.5: only alone (4 ms) is a on time; b waits for the next batch
    apart = state_of(d, [req("a", "m", 0, 0.0, 4.5), req("b", "m", 0, 0.0, 20.0)])
    plan = make_policy("edf").plan(apart, 0.0)
    assert [a.request_ids for a in plan.actions] == [("a",), ("b",)]
    assert dict(plan.completion_ms) == {"a": 4.0, "b": 8.0}
    assert plan.objective == 0


# --- 3. dp-tardy ---------------------------------------------------------------------------------
def test_dp_tardy_drops_hopeless_requests_with_the_cannot_finish_reason() -> None:
    # two stages of 5 ms alone: a request at stage 0 needs 10 ms
    d = Deployment([make_profile("m", [[5.0, 6.0, 8.0, 12.0]] * 2)])
    state = state_of(
        d,
        [
            req("hopeless", "m", 0, 0.0, 109.0),  # 100 + 10 > 109
            req("exact", "m", 0, 1.0, 110.0),  # 100 + 10 == 110: can finish alone
            req("late_stage", "m", 1, 2.0, 104.0),  # needs 5 ms: 105 > 104
        ],
    )
    for exact in (False, True):
        plan = make_policy("dp-tardy", exact=exact).plan(state, 100.0)
        reasons = {dr.request_id: dr.reason for dr in plan.dropped}
        assert set(reasons) == {"hopeless", "late_stage"}
        assert reasons["hopeless"] == HOPELESS and "cannot finish" in reasons["hopeless"]
        assert reasons["late_stage"] == HOPELESS
        # each predicted to finish when it would alone, after its deadline
        assert {dr.request_id: dr.predicted_ms for dr in plan.dropped} == {
            "hopeless": 110.0, "late_stage": 105.0
        }  # fmt: skip
        assert plan.completion_ms["exact"] == 110.0
        assert plan.objective == 2
        check_plan(state, 100.0, plan, "dp-tardy")


@pytest.mark.parametrize("exact", [False, True])
@FAST
@given(case=cases())
def test_dp_tardy_keeps_only_requests_it_finishes_on_time(exact: bool, case: Case) -> None:
    state, plan = plan_of(case, "dp-tardy", exact=exact)
    check_plan(state, case.now_ms, plan, "dp-tardy")
    for r in state:
        if r.id not in plan.dropped_ids:
            assert plan.completion_ms[r.id] <= r.deadline_ms, f"{r.id} kept but late"
    assert misses(state, plan) == len(plan.dropped)


@FAST
@given(case=cases(), single=st.booleans())
def test_dp_tardy_misses_no_more_than_dp_time(case: Case, single: bool) -> None:
    """Per-request units. One app: dp-tardy's DP minimises the tardy count over the same
    segmentations dp-time chooses from (after dropping requests late in every schedule), so it
    never misses more than dp-time's plan (a theorem). Several apps: the search over app
    orders is lexicographic per app, so this is not a theorem, but dp-tardy also compares
    dp-time's own plan of the survivors (policies/dp.py) -- 15000 random cases found no
    counterexample."""
    if single:
        case = one_app(case)
    state, tardy = plan_of(case, "dp-tardy", exact=True)
    _, timed = plan_of(case, "dp-time", exact=True)
    assert misses(state, tardy) <= misses(state, timed)


def group_unit_case() -> SchedulerState:
    """Five flat 0.5 ms stages, one layer group, B = 2. r0 and r1 stand at stage 1 (r1 cannot
    finish by 1.0 even alone: it needs 2.0), r2 at stage 0. Furthest-first order r0, r1, r2."""
    d = Deployment([make_profile("m0", [[0.5] * 4] * 5, max_batch=4)], max_batch=2, groups=1)
    return state_of(
        d, [req("r0", "m0", 1, 0.0, 2.0), req("r1", "m0", 1, 0.0, 1.0), req("r2", "m0", 0)]
    )


def test_dp_tardy_exact_serves_what_dp_time_serves_on_the_group_unit_case() -> None:
    # per-request units: r0 alone (4 * 0.5 = 2.0) is on time; r1 is hopeless; r2 after it
    state = group_unit_case()
    tardy = make_policy("dp-tardy", exact=True).plan(state, 0.0)
    timed = make_policy("dp-time", exact=True).plan(state, 0.0)
    assert misses(state, timed) == 1 and misses(state, tardy) == 1
    assert tardy.dropped_ids == ("r1",) and tardy.completion_ms["r0"] == 2.0


def test_dp_tardy_group_units_no_worse_than_dp_time_after_hopeless_drop() -> None:
    # group units (G = 1, B = 2) with all three: [r0, r1], [r2]. dp-time runs [r0, r1] from
    # stage 1 (4 * 0.5 = 2.0): r0 on time, only the hopeless r1 late -> 1 miss.
    # dp-tardy drops r1 first; the units become [r0, r2], which must start at stage 0:
    # r0 ends at 2.5 > 2.0 and is dropped too -> 2 misses.
    state = group_unit_case()
    timed = make_policy("dp-time").plan(state, 0.0)
    assert misses(state, timed) == 1
    tardy = make_policy("dp-tardy").plan(state, 0.0)
    assert misses(state, tardy) <= misses(state, timed)


def test_dp_tardy_adds_back_the_late_requests_that_the_rest_leave_room_for() -> None:
    """One layer group holds the four requests in one unit, so every plan batches all four:
    35 ms, all late for their 30 ms deadlines. A round drops every request its plan leaves late;
    three of them alone (27.5 ms) are on time, so dp-tardy adds those back, oldest first, and
    drops only the newest (before, it dropped all four)."""
    d = Deployment([make_profile("m", [[12.5, 20.0, 35.0, 65.0]])])
    state = state_of(d, [req(f"r{i}", "m", 0, 0.0, 30.0) for i in range(4)])
    plan = make_policy("dp-tardy").plan(state, 0.0)
    check_plan(state, 0.0, plan, "dp-tardy")
    assert plan.dropped_ids == ("r3",)
    assert [x.reason for x in plan.dropped] == [PREDICTED_LATE]
    assert plan.dropped[0].predicted_ms == 35.0  # in the batch of four that found it late
    assert {plan.completion_ms[f"r{i}"] for i in range(3)} == {27.5}


def test_dp_tardy_stops_adding_back_after_refusals_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past capacity every add-back trial finds no room (each a whole re-plan): after
    ADD_BACK_PATIENCE refusals in a row the rest are dropped untried, the same plan as trying
    them all here, made with fewer trials."""
    import scheduler.policies.dp as dp_module

    d = Deployment([make_profile("m", [[10.0, 16.0, 28.0, 52.0]])], max_batch=8, groups=1)
    # one stage: 40 requests, one every 2 ms, each due 60 ms after it arrived; at 6.5 ms a
    # sample at batch 8, the device serves about one in three
    requests = [req(f"r{i:02d}", "m", 0, -2.0 * (39 - i), 60.0 - 2.0 * (39 - i)) for i in range(40)]
    refused: list[bool] = []  # each add-back trial: found no room
    fewest_late = dp_module.DPScheduler._fewest_late

    def counted(self: Any, *args: Any, cut_units: bool = True, **kw: Any) -> Any:
        out = fewest_late(self, *args, cut_units=cut_units, **kw)
        if not cut_units:
            refused.append(bool(out[0]))
        return out

    monkeypatch.setattr(dp_module.DPScheduler, "_fewest_late", counted)
    state = state_of(d, requests)
    plan = make_policy("dp-tardy").plan(state, 0.0)
    check_plan(state, 0.0, plan, "dp-tardy")
    patience = dp_module.ADD_BACK_PATIENCE
    patient = list(refused)
    assert patient[-patience:] == [True] * patience  # it stopped after that many in a row
    predicted = [x for x in plan.dropped if x.reason == PREDICTED_LATE]
    assert len(predicted) > patient.count(True)  # some dropped untried

    refused.clear()
    monkeypatch.setattr(dp_module, "ADD_BACK_PATIENCE", 10**6)
    unlimited = make_policy("dp-tardy").plan(state_of(d, requests), 0.0)
    assert len(refused) > len(patient) and all(refused[len(patient) :])  # none had room
    assert unlimited.dropped_ids == plan.dropped_ids and unlimited.actions == plan.actions


def eight_waiting(first_two_deadline_ms: float) -> SchedulerState:
    """One stage, one layer group (so one unit of all eight): batches of 2 in 16 ms, 4 in 28,
    8 in 52 (6 in 40, interpolated); r0 and r1 (the oldest) due at `first_two_deadline_ms`, the
    rest at 200 ms."""
    d = Deployment([make_profile("m", [[10.0, 16.0, 28.0, 52.0]])])
    deadlines = [first_two_deadline_ms] * 2 + [200.0] * 6
    return state_of(d, [req(f"r{i}", "m", 0, float(i), dl) for i, dl in enumerate(deadlines)])


def test_dp_tardy_cuts_a_unit_after_its_late_requests() -> None:
    """The eight fill one unit, so the coarse plans run one batch of 8 (52 ms), late for r0
    and r1 (due at 40), and dropping either leaves a batch of 7, still late. Cut after r1, the
    unit runs as r0, r1 (16 ms) and then the other six (40 ms more): nobody is dropped."""
    state = eight_waiting(40.0)
    plan = make_policy("dp-tardy").plan(state, 0.0)
    check_plan(state, 0.0, plan, "dp-tardy")
    assert plan.dropped_ids == ()
    assert actions_as_sets(plan) == [
        ("m", (0, 1), {"r0", "r1"}),
        ("m", (0, 1), {f"r{i}" for i in range(2, 8)}),
    ]
    assert plan.completion_ms["r0"] == 16.0 and plan.completion_ms["r7"] == 56.0


def test_cut_after_splits_a_unit_after_each_run_of_marked_requests() -> None:
    """Furthest first (r5 at stage 1, then r0..r4 at stage 0 in arrival order), one layer
    group: one unit; marking r5, r0 and r3 cuts after r0 (r1 follows) and after r3 (r4
    follows), never inside a marked run, and the pieces keep the order."""
    d = Deployment([make_profile("m", [[1.0] * 4] * 2)], groups=1)
    own = [(req(f"r{i}", "m", 0, float(i), 10.0 + i), 0) for i in range(5)]
    own.append((req("r5", "m", 1, 5.0, 15.0), 1))
    whole = scheduler.dp.make_problem(d, "m", own, [], "group")
    assert [[rid for _, rid in u.members] for u in whole.units] == [
        ["r0", "r1", "r2", "r3", "r4", "r5"]
    ]
    cut = scheduler.dp.make_problem(d, "m", own, [], "group", frozenset({"r5", "r0", "r3"}))
    assert [[rid for _, rid in u.members] for u in cut.units] == [
        ["r0", "r5"],
        ["r1", "r2", "r3"],
        ["r4"],
    ]
    assert [u.deadlines for u in cut.units] == [(10.0, 15.0), (11.0, 12.0, 13.0), (14.0,)]


def test_dp_tardy_keeps_the_layer_group_whole_when_nobody_is_late() -> None:
    """With every deadline far, the coarse completion-time plan leaves nobody late and is kept
    (two batches of four would finish sooner in total): units are cut only for plans that
    leave someone late."""
    state = eight_waiting(200.0)
    plan = make_policy("dp-tardy").plan(state, 0.0)
    assert plan.dropped_ids == ()
    assert actions_as_sets(plan) == [("m", (0, 1), {f"r{i}" for i in range(8)})]


@FAST
@given(case=cases(), exact=st.booleans())
def test_dp_tardy_misses_no_more_than_dynamic(case: Case, exact: bool) -> None:
    """dp-tardy weighs `dynamic`'s plan among its own and, should its rounds of dropping leave
    more requests late than that plan does, takes it (policies/dp.py): with latencies that grow
    with batch size it never misses more than `dynamic`. Before the last rule a 3000-case run
    found a case with shared models (17 requests of 5 apps) where dp-tardy missed 2 and
    `dynamic` 1; before dynamic's plan was weighed, one without."""
    state, tardy = plan_of(case, "dp-tardy", exact=exact)
    _, dynamic = plan_of(case, "dynamic")
    assert misses(state, tardy) <= misses(state, dynamic)


def test_dp_tardy_takes_dynamic_s_plan_when_its_rounds_of_dropping_miss_more() -> None:
    """The case hypothesis found (shared models, flat latencies, B = 2): `dynamic`'s plan leaves
    only r9 late (due at 1 ms, it cannot finish even alone). dp-tardy drops r9 as hopeless, and
    its rounds of dropping then dropped one more as predicted late; it now takes `dynamic`'s
    plan without r9, which serves everyone else on time (r0, due at 4 ms, among them)."""
    flat = [0.5] * 4
    d = Deployment(
        [
            make_profile("m0", [flat] * 6, max_batch=4),
            make_profile("m1", [flat], max_batch=4),
            make_profile("m2", [[1.0] * 4], max_batch=4),
        ],
        [App("m0", ("m0",)), App("m1", ("m1",)), App("m2", ("m2",)), App("c01", ("m0", "m1")),
         App("c02", ("m0", "m2")), App("c21", ("m2", "m1"))],
        max_batch=2,
        groups=1,
    )  # fmt: skip
    inf = math.inf
    state = state_of(
        d,
        [req("r0", "c01", 2, 0.0, 4.0), req("r1", "c01", 0, 0.0, inf), req("r2", "c01", 0, 0.0, inf),
         req("r3", "c02", 0, 0.0, inf), req("r4", "m2", 0, 0.0, 1.0), req("r5", "c01", 0, 0.0, inf),
         req("r6", "c01", 0, 0.0, inf), req("r7", "c01", 0, 0.0, inf), req("r8", "c01", 0, 0.0, inf),
         req("r9", "c21", 0, -1.0, 1.0)],
    )  # fmt: skip
    dynamic = make_policy("dynamic").plan(state, 0.0)
    assert misses(state, dynamic) == 1
    plan = make_policy("dp-tardy").plan(state, 0.0)
    check_plan(state, 0.0, plan, "dp-tardy")
    assert misses(state, plan) == 1
    assert [x.request_id for x in plan.dropped] == ["r9"]
    assert plan.completion_ms["r0"] <= 4.0


def test_dp_tardy_takes_dynamic_s_plan_when_it_leaves_the_tightest_request_more_slack() -> None:
    """A heavy model's request (100 ms, due at 300) waits; a light one (10 ms) arrives. Least
    total completion runs the light one first (done at 160, the heavy one at 260: 40 ms to
    spare). `dynamic`'s oldest-first plan finishes the heavy one at 250 and the light one at
    260, leaving everyone 50 ms or more: dp-tardy takes it. Due at 255 instead, the light one
    would be late in `dynamic`'s plan, and the least-total plan is kept."""
    d = Deployment(
        [
            make_profile("heavy", [[100.0, 150.0, 250.0, 450.0]]),
            make_profile("light", [[10.0, 15.0, 25.0, 45.0]]),
        ]
    )
    for light_due_ms, order in ((440.0, ["heavy", "light"]), (255.0, ["light", "heavy"])):
        state = state_of(
            d, [req("old", "heavy", 0, 0.0, 300.0), req("new", "light", 0, 140.0, light_due_ms)]
        )
        timed = make_policy("dp-time").plan(state, 150.0)
        assert [a.model for a in timed.actions] == ["light", "heavy"]
        plan = make_policy("dp-tardy").plan(state, 150.0)
        check_plan(state, 150.0, plan, "dp-tardy")
        assert plan.dropped_ids == ()
        assert [a.model for a in plan.actions] == order


def test_dp_tardy_is_fifo_so_edf_can_serve_more_on_time() -> None:
    """Why "dp-tardy misses <= edf misses" is not a per-state guarantee (paper 4.2: "Lemma 1
    no longer holds when minimizing the number of tardy jobs"): dp-tardy only cuts the
    furthest-first/arrival order into segments, so with B = 1 it must run the older request
    first; EDF runs the one with the earlier deadline first and serves both on time."""
    d = Deployment([make_profile("m", [[10.0, 12.0, 14.0, 18.0]])], max_batch=1)
    state = state_of(d, [req("old", "m", 0, 0.0, 25.0), req("urgent", "m", 0, 1.0, 12.0)])
    edf = make_policy("edf").plan(state, 1.0)
    assert [a.request_ids for a in edf.actions] == [("urgent",), ("old",)]
    assert misses(state, edf) == 0
    for exact in (False, True):
        tardy = make_policy("dp-tardy", exact=exact).plan(state, 1.0)
        check_plan(state, 1.0, tardy, "dp-tardy")
        assert misses(state, tardy) == 1
        assert tardy.dropped_ids == ("urgent",)


# --- 4. dp-time by hand ---------------------------------------------------------------------------
def two_stage(stage0: list[float], stage1: list[float], max_batch: int = 4) -> Deployment:
    return Deployment([make_profile("m", [stage0, stage1], (1, 2), max_batch=max_batch)])


def actions_as_sets(plan: Any) -> list[tuple[str, tuple[int, int], set[str]]]:
    return [(a.model, a.stages, set(a.request_ids)) for a in plan.actions]


def test_dp_time_exact_batches_when_that_is_cheaper() -> None:
    # h0 = [1, 2], h1 = [4, 5] (b = 1, 2). a stands at stage 1 (arrived first), b at stage 0.
    # now = 10. Furthest-first order: a, b.
    #   {a},{b}: a runs stage 1 alone (4) -> 14; b runs 0..1 alone (1 + 4) -> 19; total 4 + 9 = 13
    #   {a,b}:   b runs stage 0 alone (1) -> 11; a+b run stage 1 (5) -> 16; total 6 + 6 = 12  <- best
    d = two_stage([1.0, 2.0], [4.0, 5.0])
    state = state_of(d, [req("a", "m", 1, 0.0), req("b", "m", 0, 1.0)])
    plan = make_policy("dp-time", exact=True).plan(state, 10.0)
    assert actions_as_sets(plan) == [("m", (0, 1), {"b"}), ("m", (1, 2), {"a", "b"})]
    assert dict(plan.completion_ms) == {"a": 16.0, "b": 16.0}
    assert plan.objective == 12.0
    check_plan(state, 10.0, plan, "dp-time")


def test_dp_time_exact_splits_when_that_is_cheaper() -> None:
    # h0 = [3, 4], h1 = [4, 5].
    #   {a},{b}: a -> 14 (4); b: 3 + 4 -> 21 (11); total 15  <- best
    #   {a,b}:   b stage 0 (3) -> 13; both stage 1 (5) -> 18; total 8 + 8 = 16
    d = two_stage([3.0, 4.0], [4.0, 5.0])
    state = state_of(d, [req("a", "m", 1, 0.0), req("b", "m", 0, 1.0)])
    plan = make_policy("dp-time", exact=True).plan(state, 10.0)
    assert actions_as_sets(plan) == [("m", (1, 2), {"a"}), ("m", (0, 2), {"b"})]
    assert dict(plan.completion_ms) == {"a": 14.0, "b": 21.0}
    assert plan.objective == 15.0


def test_dp_time_exact_respects_the_batch_bound() -> None:
    # the batching case above with B = 1: only {a},{b} is allowed -> completions 14 and 19
    d = Deployment([make_profile("m", [[1.0, 2.0], [4.0, 5.0]], (1, 2))], max_batch=1)
    state = state_of(d, [req("a", "m", 1, 0.0), req("b", "m", 0, 1.0)])
    plan = make_policy("dp-time", exact=True).plan(state, 10.0)
    assert actions_as_sets(plan) == [("m", (1, 2), {"a"}), ("m", (0, 2), {"b"})]
    assert dict(plan.completion_ms) == {"a": 14.0, "b": 19.0}
    assert plan.objective == 13.0


def test_dp_time_exact_three_requests_and_the_coarser_layer_units() -> None:
    # h0 = [1, 2, 3], h1 = [4, 5, 6] at b = 1, 2, 3 (extrapolated). r1 at stage 1; r2, r3 at
    # stage 0 (r2 arrived first). now = 10; order r1, r2, r3. All segmentations:
    #   {r1}{r2}{r3}: 4*3 + 5*2 + 5*1 = 27
    #   {r1}{r2,r3}:  4*3 + (2 + 5)*2 = 26
    #   {r1,r2}{r3}:  (1 + 5)*3 + 5*1 = 23   <- best: r2 joins r1, r3 runs alone afterwards
    #   {r1,r2,r3}:   (2 + 6)*3      = 24
    d = two_stage([1.0, 2.0], [4.0, 5.0])
    state = state_of(d, [req("r1", "m", 1, 0.0), req("r2", "m", 0, 1.0), req("r3", "m", 0, 2.0)])
    plan = make_policy("dp-time", exact=True).plan(state, 10.0)
    assert actions_as_sets(plan) == [
        ("m", (0, 1), {"r2"}),
        ("m", (1, 2), {"r1", "r2"}),
        ("m", (0, 2), {"r3"}),
    ]
    assert dict(plan.completion_ms) == {"r1": 16.0, "r2": 16.0, "r3": 21.0}
    assert plan.objective == 23.0
    # per-layer units keep r2 and r3 together: the best is then {r1,r2,r3} = 24
    for unit in ("layer", "group"):
        coarse = make_policy("dp-time", unit=unit).plan(state, 10.0)
        assert coarse.objective == 24.0
        assert actions_as_sets(coarse) == [
            ("m", (0, 1), {"r2", "r3"}),
            ("m", (1, 2), {"r1", "r2", "r3"}),
        ]


# --- 5. unit modes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["dp-time", "dp-tardy"])
@pytest.mark.parametrize("unit", ["layer", "group"])
@FAST
@given(case=cases())
def test_unit_modes_give_valid_plans(objective: str, unit: str, case: Case) -> None:
    state, plan = plan_of(case, objective, unit=unit)
    check_plan(state, case.now_ms, plan, objective)


@pytest.mark.parametrize("unit", ["layer", "group"])
@FAST
@given(case=cases(deadlines=False), big_b=st.booleans())
def test_coarser_units_never_beat_the_exact_form_on_one_app(
    unit: str, case: Case, big_b: bool
) -> None:
    """Layer and group units are contiguous runs of the furthest-first order with at most B
    requests, so every plan they can choose is a segmentation the exact form also considers."""
    case = one_app(case)
    if big_b:
        d = case.deployment
        case.deployment = Deployment(d.profiles.values(), d.apps.values(), None, d.groups)
    _, exact = plan_of(case, "dp-time", exact=True)
    _, coarse = plan_of(case, "dp-time", unit=unit)
    assert coarse.objective >= exact.objective - 1e-6 * max(1.0, exact.objective)


# --- 6. the incremental memo -------------------------------------------------------------------------
MEMO_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("dp-time", {}),
    ("dp-time", {"unit": "layer"}),
    ("dp-time", {"exact": True}),
    ("dp-tardy", {}),
]


def same_plan(a: Any, b: Any) -> None:
    assert a.actions == b.actions
    assert dict(a.completion_ms) == dict(b.completion_ms)
    assert a.dropped == b.dropped
    assert a.objective == b.objective


@pytest.mark.parametrize("variant", MEMO_VARIANTS, ids=variant_id)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_memo_never_changes_the_plan(variant: tuple[str, dict[str, Any]], data: Any) -> None:
    """One long-lived state (memo kept across arrivals and executed steps) plans exactly what
    a fresh state with an empty memo plans, at every step."""
    name, kw = variant
    case = data.draw(cases(max_requests=12))
    d = case.deployment
    policy = make_policy(name, **kw)
    live = state_of(d, case.requests)
    now = case.now_ms
    apps = sorted(d.apps)
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        plan = policy.plan(live, now)
        fresh = SchedulerState(d, live.requests())
        same_plan(plan, make_policy(name, **kw).plan(fresh, now))
        live.remove(plan.dropped_ids)
        if data.draw(st.booleans(), label="arrival") or not plan.actions:
            app = data.draw(st.sampled_from(apps), label="app")
            pos = data.draw(st.integers(0, d.app_length(app) - 1), label="position")
            live.add(req(f"n{step}", app, pos, now, now + data.draw(st.integers(5, 300))))
            now += data.draw(st.integers(0, 3))
        else:
            act = plan.actions[0]
            k0, k1 = act.stages
            done = data.draw(st.integers(1, k1 - k0), label="stages done")
            now += sum(d.latency_ms(act.model, k, act.batch_size) for k in range(k0, k0 + done))
            live.advance(Action(act.model, (k0, k0 + done), act.request_ids), done)


def count_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the segment walks the DP makes to price segments (scheduler.dp.walk)."""
    calls = [0]
    real: Callable[..., Any] = scheduler.dp.walk

    def counting(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(scheduler.dp, "walk", counting)
    return calls


def memo_deployment() -> Deployment:
    rows = [[float(k % 3 + 1), k % 3 + 1.5, k % 3 + 2.0, k % 3 + 3.0] for k in range(10)]
    return Deployment([make_profile("m", rows)], max_batch=8, groups=5)


def memo_requests() -> list[Request]:
    return [req(f"r{i}", "m", (7 * i) % 10, float(i)) for i in range(14)]


@pytest.mark.parametrize("variant", MEMO_VARIANTS, ids=variant_id)
def test_memo_serves_a_repeated_plan(
    variant: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, kw = variant
    calls = count_walks(monkeypatch)
    state = state_of(memo_deployment(), memo_requests())
    first = make_policy(name, **kw).plan(state, 0.0)
    assert calls[0] > 0
    assert state.memo, "the plan left nothing in state.memo"
    calls[0] = 0
    again = make_policy(name, **kw).plan(state, 0.0)
    assert calls[0] == 0, "an identical state re-priced segments instead of using the memo"
    same_plan(first, again)


@pytest.mark.parametrize("event", ["advance", "arrival"])
@pytest.mark.parametrize("variant", MEMO_VARIANTS, ids=variant_id)
def test_memo_reuses_entries_after_an_advance_or_arrival(
    event: str, variant: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, kw = variant
    calls = count_walks(monkeypatch)
    d = memo_deployment()
    state = state_of(d, memo_requests())
    plan = make_policy(name, **kw).plan(state, 0.0)
    now = 0.0
    if event == "advance":  # the runtime executes the first layer group of the plan
        act = plan.actions[0]
        k0 = act.stages[0]
        k1 = min(act.stages[1], d.group_end(act.model, k0))
        now = sum(d.latency_ms(act.model, k, act.batch_size) for k in range(k0, k1))
        state.advance(Action(act.model, (k0, k1), act.request_ids), k1 - k0)
    else:
        state.add(req("new", "m", 0, 0.5))
    calls[0] = 0
    incremental = make_policy(name, **kw).plan(state, now)
    reused = calls[0]
    calls[0] = 0
    fresh = make_policy(name, **kw).plan(SchedulerState(d, state.requests()), now)
    assert calls[0] > 0
    assert reused < calls[0], f"memo saved nothing: {reused} walks vs {calls[0]} from scratch"
    same_plan(incremental, fresh)


def test_memo_lives_in_the_state_not_the_policy() -> None:
    """Two states planned by one policy object do not share tables: a new state starts empty."""
    policy = make_policy("dp-time")
    a = state_of(memo_deployment(), memo_requests())
    policy.plan(a, 0.0)
    b = state_of(memo_deployment(), memo_requests()[:3])
    assert b.memo == {}
    plan_b = policy.plan(b, 0.0)
    fresh = make_policy("dp-time").plan(state_of(memo_deployment(), memo_requests()[:3]), 0.0)
    same_plan(plan_b, fresh)
    check_plan(b, 0.0, plan_b, "dp-time")

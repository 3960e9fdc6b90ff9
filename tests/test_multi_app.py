"""Several apps (paper 003, section 4.3): the exact order search, the heuristic above
EXACT_APPS apps, and shared layers (requests of different apps batching at a shared model).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler.search
from scheduler import Action, App, Deployment, Request, make_policy
from scheduler.dp import solve_time
from scheduler.search import AppSearch
from tests.sched_cases import (
    HEURISTIC_KEY,
    Case,
    best_segmentation,
    check_plan,
    latency_rows,
    make_profile,
    my_replay,
    req,
    state_of,
    total_ms,
)


# --- independent apps: the best order -----------------------------------------------------------
@st.composite
def independent_apps(draw: Any, max_apps: int = 4, max_per_app: int = 3) -> Case:
    """2..max_apps apps that share no model (one of them may be a two-model chain), each with
    1..max_per_app requests at random positions; no deadlines."""
    n_apps = draw(st.integers(2, max_apps))
    profiles = []
    apps = []
    for a in range(n_apps):
        chain = []
        for part in range(draw(st.integers(1, 2)) if a == 0 else 1):
            model = f"a{a}m{part}"
            stages = draw(st.integers(1, 3))
            profiles.append(make_profile(model, draw(latency_rows(stages))))
            chain.append(model)
        apps.append(App(f"app{a}", tuple(chain)))
    d = Deployment(profiles, apps, max_batch=draw(st.sampled_from([2, 3, 8])))
    now = 100.0
    requests = []
    for a in apps:
        for n in range(draw(st.integers(1, max_per_app))):
            pos = draw(st.integers(0, d.app_length(a.name) - 1))
            arrival = now - draw(st.integers(0, 50))
            requests.append(req(f"{a.name}.r{n}", a.name, pos, float(arrival)))
    return Case(d, requests, now)


def best_over_orders_exact(case: Case) -> float:
    """Exhaustive, independent of the DP: for a fixed order of independent apps the total
    completion time is the sum over apps of (own completion times from the app's start + the
    app's length times the requests of later apps), each app's part depends only on its own
    segmentation, so each is minimised over all its segmentations; then min over orders."""
    d = case.deployment
    by_app: dict[str, list[Request]] = {}
    for r in case.requests:
        by_app.setdefault(r.app, []).append(r)
    best = math.inf
    for order in itertools.permutations(sorted(by_app)):
        total = 0.0
        for n, app in enumerate(order):
            waiting = sum(len(by_app[b]) for b in order[n + 1 :])
            bound = min(d.batch_limit(m) for m in d.apps[app].models)
            cost, _ = best_segmentation(d, app, by_app[app], case.now_ms, bound, waiting)
            total += cost
        best = min(best, total)
    return best


def order_cost_with_dp(case: Case, order: tuple[str, ...], mode: Any) -> tuple[float, float]:
    """Run the apps in `order`, each with the DP weighted by the requests still waiting; returns
    (sum of the DP costs, replayed total completion time of the actions)."""
    d = case.deployment
    search = AppSearch(d, case.requests, mode, {}, case.now_ms)
    at = search.start()
    actions: list[Action] = []
    dp_cost = 0.0
    for n, app in enumerate(order):
        if at.left[app] == 0:
            continue
        waiting = sum(at.left[b] for b in order[n + 1 :])
        prob = search.problem(app, at)
        sol = solve_time(search.costs(prob), waiting, {})
        dp_cost += sol.cost_ms
        at, acts = search.run(prob, sol, at.copy(), build=True)
        actions.extend(acts)
    rep = my_replay(d, case.requests, case.now_ms, actions)
    assert len(rep.completion) == len(case.requests)
    return dp_cost, total_ms(rep.completion, case.now_ms)


def every_order_searched() -> Any:
    """The order search exact for the up to 4 apps of `independent_apps` (by default it is exact
    up to `scheduler.search.EXACT_APPS` apps)."""
    return mock.patch.object(scheduler.search, "EXACT_APPS", 4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(independent_apps())
def test_dp_time_exact_picks_the_best_order_of_apps(case: Case) -> None:
    state = case.state()
    with every_order_searched():
        plan = make_policy("dp-time", exact=True).plan(state, case.now_ms)
    check_plan(state, case.now_ms, plan, "dp-time")
    best = best_over_orders_exact(case)
    assert plan.objective == pytest.approx(best, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("mode", ["request", "layer", "group"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=independent_apps())
def test_dp_time_objective_is_min_over_app_orders(mode: str, case: Case) -> None:
    """For every permutation of the apps, the DP run in that fixed order (AppSearch.problem /
    solve_time with the waiting count / run): its cost is the replayed total completion time,
    and dp-time's objective is the minimum over permutations."""
    totals = []
    for order in itertools.permutations(sorted({r.app for r in case.requests})):
        dp_cost, replayed = order_cost_with_dp(case, order, mode)
        assert dp_cost == pytest.approx(replayed, rel=1e-9, abs=1e-6)
        totals.append(replayed)
    state = case.state()
    kw: dict[str, Any] = {"exact": True} if mode == "request" else {"unit": mode}
    with every_order_searched():
        plan = make_policy("dp-time", **kw).plan(state, case.now_ms)
    check_plan(state, case.now_ms, plan, "dp-time")
    assert plan.objective == pytest.approx(min(totals), rel=1e-9, abs=1e-6)


def test_dp_time_runs_the_cheap_app_first() -> None:
    # app "a" (10 ms, alphabetically first) and app "b" (1 ms), one request each:
    # b then a = 1 + 11 = 12 < a then b = 10 + 11 = 21
    d = Deployment([make_profile("a", [[10.0]], (1,)), make_profile("b", [[1.0]], (1,))])
    state = state_of(d, [req("x", "a", 0), req("y", "b", 0)])
    for exact in (False, True):
        plan = make_policy("dp-time", exact=exact).plan(state, 0.0)
        check_plan(state, 0.0, plan, "dp-time")
        assert [a.request_ids for a in plan.actions] == [("y",), ("x",)]
        assert plan.objective == 12.0


# --- more than EXACT_APPS apps: the heuristic ----------------------------------------------------
def eight_apps(seed: int) -> Case:
    rng = random.Random(seed)
    profiles, apps, requests = [], [], []
    for a in range(8):
        stages = rng.randint(1, 3)
        rows = []
        for _ in range(stages):
            h = rng.randint(1, 20) / 2
            row = [h]
            for _ in range(3):
                h += rng.randint(0, 8) / 2
                row.append(h)
            rows.append(row)
        profiles.append(make_profile(f"m{a}", rows))
        apps.append(App(f"app{a}", (f"m{a}",)))
        for n in range(rng.randint(1, 6)):
            requests.append(
                req(f"app{a}.r{n}", f"app{a}", rng.randint(0, stages - 1), -rng.randint(0, 40))
            )
    return Case(Deployment(profiles, apps, max_batch=8), requests, 0.0)


def app_blocks(case: Case, plan: Any) -> list[tuple[str, float, int]]:
    """The apps in the order the plan runs them, each as (app, block length ms, requests);
    asserts each app runs as one contiguous block (independent apps)."""
    rep = my_replay(case.deployment, case.requests, case.now_ms, plan.actions)
    app_of = {r.id: r.app for r in case.requests}
    blocks: list[tuple[str, float, int]] = []
    for n, act in enumerate(plan.actions):
        app = app_of[act.request_ids[0]]
        length = rep.spans[n][1] - rep.spans[n][0]
        if blocks and blocks[-1][0] == app:
            blocks[-1] = (app, blocks[-1][1] + length, blocks[-1][2])
        else:
            assert app not in [b[0] for b in blocks], f"{app} runs in two blocks"
            blocks.append((app, length, sum(1 for r in case.requests if r.app == app)))
    return blocks


@pytest.mark.parametrize("seed", range(8))
def test_many_apps_use_the_heuristic_and_stay_near_the_exact_search(
    seed: int, monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    case = eight_apps(seed)
    assert len({r.app for r in case.requests}) > scheduler.search.EXACT_APPS
    state = case.state()
    heuristic = make_policy("dp-time").plan(state, case.now_ms)
    check_plan(state, case.now_ms, heuristic, "dp-time")
    # the documented heuristic: Smith's rule, apps by ascending block length / requests
    blocks = app_blocks(case, heuristic)
    ratios = [length / count for _, length, count in blocks]
    assert ratios == sorted(ratios), blocks
    monkeypatch.setattr(scheduler.search, "EXACT_APPS", 8)
    exact_state = case.state()
    exact = make_policy("dp-time").plan(exact_state, case.now_ms)
    check_plan(exact_state, case.now_ms, exact, "dp-time")
    assert heuristic.objective >= exact.objective - 1e-6
    pytestconfig.stash.setdefault(HEURISTIC_KEY, []).append(heuristic.objective / exact.objective)


# --- shared layers ----------------------------------------------------------------------------------
def shared_deployment(max_batch: int | None = None, flat: bool = True) -> Deployment:
    """A = [det, head1], B = [det, head2]; det has 3 stages, the heads 2. With `flat`, latency
    does not grow with the batch, so batching as much as possible is always best."""

    def rows(base: float, n: int) -> list[list[float]]:
        return [[base] * 4 if flat else [base, base * 1.5, base * 2.5, base * 4.5]] * n

    return Deployment(
        [
            make_profile("det", rows(4.0, 3)),
            make_profile("head1", rows(2.0, 2)),
            make_profile("head2", rows(3.0, 2)),
        ],
        [App("A", ("det", "head1")), App("B", ("det", "head2"))],
        max_batch=max_batch,
    )


def check_rider(plan: Any, rider: str, det_stage: int) -> None:
    """`rider` runs det from `det_stage` to det's end, then head2 from its stage 0."""
    mine = [a for a in plan.actions if rider in a.request_ids]
    det = [a for a in mine if a.model == "det"]
    assert det and det[0].stages[0] == det_stage and det[-1].stages[1] == 3
    heads = [a for a in mine if a.model != "det"]
    assert heads and all(a.model == "head2" for a in heads)
    assert heads[0].stages[0] == 0 and heads[-1].stages[1] == 2
    assert plan.actions.index(heads[0]) > plan.actions.index(det[-1])


@pytest.mark.parametrize(
    "policy", [("dp-time", {}), ("dp-time", {"exact": True}), ("batch", {}), ("dp-tardy", {})]
)
def test_requests_of_two_apps_batch_at_the_shared_model(policy: tuple[str, dict[str, Any]]) -> None:
    d = shared_deployment()
    state = state_of(
        d,
        [
            req("a1", "A", 1, 0.0),  # det stage 1
            req("b1", "B", 1, 1.0),  # det stage 1
            req("b3", "B", 3, 2.0),  # past det: head2 stage 0
        ],
    )
    name, kw = policy
    plan = make_policy(name, **kw).plan(state, 0.0)
    check_plan(state, 0.0, plan, name)
    together = [a for a in plan.actions if {"a1", "b1"} <= set(a.request_ids)]
    assert together and all(a.model == "det" for a in together)
    assert together[0].stages[0] == 1
    check_rider(plan, "b1", 1)
    # a request past the shared model never runs det and never rides with A
    b3 = [a for a in plan.actions if "b3" in a.request_ids]
    assert all(a.model == "head2" for a in b3)


def test_batch_policy_shared_layers_exact_actions() -> None:
    # A's oldest request is older, so A runs first: one segment from a0 at det[0]; at det[1]
    # a1 joins and b1 (app B at det[1]) rides along to det's end; head1 runs A's two requests;
    # then B runs: b1 continues from head2[0].
    d = shared_deployment()
    state = state_of(d, [req("a0", "A", 0, 0.0), req("a1", "A", 1, 1.0), req("b1", "B", 1, 2.0)])
    plan = make_policy("batch").plan(state, 0.0)
    got = [(a.model, a.stages, set(a.request_ids)) for a in plan.actions]
    assert got == [
        ("det", (0, 1), {"a0"}),
        ("det", (1, 3), {"a0", "a1", "b1"}),
        ("head1", (0, 2), {"a0", "a1"}),
        ("head2", (0, 2), {"b1"}),
    ]
    # flat latencies: det 4 ms per stage, head1 2, head2 3
    assert dict(plan.completion_ms) == {"a0": 16.0, "a1": 16.0, "b1": 22.0}


def test_dp_time_shared_layers_exact_plan() -> None:
    # Flat latencies (det 4 per stage, head1 2, head2 3). a0 at det[0], a1 and b1 at det[1].
    # Best: run det[0] for a0 (4), det[1..3) for all three (8) -> t = 12, then head1 for A
    # (4) -> a0, a1 done at 16, then head2 for b1 (6) -> 22: total 16 + 16 + 22 = 54.
    # Other plans: A as {a1},{a0}: a1 with b1 riding (8) + head1 (4) -> 12, a0 (16) -> 28,
    # b1's head2 -> 34: 74. B first: b1 with a1 riding det[1..3) (8) + head2 (6) -> 14, then A:
    # {a1},{a0}: a1 head1 -> 18, a0 (16) -> 34: total 66; {a1,a0}: a0 det (12) + head1 -> 30
    # for both: 74. So 54 is the best plan that runs the apps one after the other.
    d = shared_deployment()
    state = state_of(d, [req("a0", "A", 0, 0.0), req("a1", "A", 1, 1.0), req("b1", "B", 1, 2.0)])
    for exact in (False, True):
        plan = make_policy("dp-time", exact=exact).plan(state, 0.0)
        check_plan(state, 0.0, plan, "dp-time")
        assert dict(plan.completion_ms) == {"a0": 16.0, "a1": 16.0, "b1": 22.0}
        assert plan.objective == 54.0
        check_rider(plan, "b1", 1)


def test_riders_fill_only_the_room_b_leaves() -> None:
    # B = 2: A's a1 stands at det[1] with two B requests; only one can ride, and whichever
    # stays behind still finishes, through its own app's plan.
    d = shared_deployment(max_batch=2)
    state = state_of(d, [req("a1", "A", 1, 0.0), req("b1", "B", 1, 1.0), req("b2", "B", 1, 2.0)])
    for name in ("dp-time", "batch"):
        plan = make_policy(name).plan(state, 0.0)
        check_plan(state, 0.0, plan, name)  # batches <= 2 at every stage
        det_batches = [set(a.request_ids) for a in plan.actions if a.model == "det"]
        assert all(len(b) <= 2 for b in det_batches)
        assert any(len(b) == 2 for b in det_batches), "no batching at the shared model at all"


def test_an_app_is_planned_from_where_the_earlier_apps_segmentation_left_its_requests() -> None:
    """Regression (found by hypothesis): m1 shares nothing, so whether it runs before or after
    m0 changes how many requests wait behind m0 and so m0's segmentation, and with it which c02
    requests ride m0 into m2 (B = 6 leaves room for two of the three). c02's problem was once
    memoised by the names of the apps before it alone, so an order with m1 last reused the
    positions of an order with m1 first and planned c3 at m2 while it stood at m0[0]."""
    d = Deployment(
        [
            make_profile(
                "m0",
                [
                    [0.5] * 4,
                    [0.5] * 4,
                    [0.5, 6.0, 12.0, 12.5],
                    [0.5, 0.5, 6.5, 12.5],
                    [7.5, 13.5, 19.5, 23.0],
                ],
            ),
            make_profile("m1", [[7.5] * 4]),
            make_profile("m2", [[1.0] * 4]),
        ],
        [App("m0", ("m0",)), App("m1", ("m1",)), App("c02", ("m0", "m2"))],
        max_batch=6,
        groups=1,
    )
    requests = [req("c1", "c02", 0, -2.0), req("c2", "c02", 0), req("c3", "c02", 0)]
    requests += [req("a1", "m0", 0), req("a2", "m0", 3), req("a3", "m0", 0), req("a4", "m0", 3)]
    state = state_of(d, requests + [req("b", "m1", 0)])
    variants: list[tuple[str, dict[str, Any]]] = [
        ("dp-time", {"exact": True}),
        ("dp-tardy", {"exact": True}),
        ("dp-time", {}),
    ]
    for name, kw in variants:
        check_plan(state, 0.0, make_policy(name, **kw).plan(state, 0.0), name)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    positions=st.lists(st.tuples(st.sampled_from("AB"), st.integers(0, 4)), min_size=1, max_size=7),
    max_batch=st.sampled_from([1, 2, 3, 8]),
    flat=st.booleans(),
)
def test_shared_layers_random_plans_are_valid_and_batch_across_apps(
    positions: list[tuple[str, int]], max_batch: int, flat: bool
) -> None:
    d = shared_deployment(max_batch=max_batch, flat=flat)
    requests = [req(f"{app}{n}", app, pos, float(n)) for n, (app, pos) in enumerate(positions)]
    state = state_of(d, requests)
    for name in ("dp-time", "batch", "dp-tardy"):
        plan = make_policy(name).plan(state, 0.0)
        check_plan(state, 0.0, plan, name)
    # with flat latencies and room in B, two requests of different apps at the same det stage
    # never both run that stage alone in dp-time's plan (batching them is free)
    if flat and max_batch >= len(requests):
        plan = make_policy("dp-time", exact=True).plan(state, 0.0)
        rep = my_replay(d, requests, 0.0, plan.actions)
        app_of = {r.id: r.app for r in requests}
        for stage in range(3):
            if {r.app for r in requests if r.position == stage} == {"A", "B"}:
                runs = [ids for m, k, ids, _, _ in rep.steps if m == "det" and k == stage]
                assert any({app_of[i] for i in ids} == {"A", "B"} for ids in runs), stage

"""The budget exchange (scheduler/cloud/exchange.py): latency traded between modules, exactly
over their Algorithm 1 frontiers, never costlier than the plan it starts from."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from scheduler.cloud import Workload, parse_workload, plan
from scheduler.cloud.configs import schedule_module
from scheduler.cloud.exchange import MAX_STEPS, algorithm1_frontier
from scheduler.cloud.generator import generate
from scheduler.cloud.latency import Assignment, module_latency_s
from scheduler.cloud.search import pareto
from scheduler.cloud.split import path_latencies_s
from tests.test_cloud_guarantees import random_workload
from tests.test_cloud_split import OFF, chain, fork, workload

PAPER = {**OFF, "merge": False, "cost_direct": False}  # Algorithm 2 and nothing after it
EXCHANGE = {**PAPER, "exchange": True}
SAME_SPACE = {"dispatch": "2d", "max_configs": 1, "dummy": False}


def trade() -> object:
    """A -> B at 100 req/s each, price 1, 2d model (GetWCL 2d, cost 100 d / b).

    A: batch 1 (0.12 s, cost 6) or batch 2 (0.2 s, cost 5): saves 1 for 0.08 s, LC 12.5.
    B: batch 1 (0.2 s, cost 10) or batch 8 (0.84 s, cost 5.25): saves 4.75 for 0.64 s, LC 7.4.
    SLO 0.96 s fits A fast + B slow. Algorithm 2 switches A first (higher LC), after which B's
    switch no longer fits: 5 + 10 = 15. The optimum gives A's 0.08 s back: 6 + 5.25 = 11.25."""
    return workload(
        {"A": [(1, 0.06), (2, 0.1)], "B": [(1, 0.1), (8, 0.42)]},
        [["A", "B"]],
        {"A": 100, "B": 100},
        0.96,
    )


def test_algorithm_2_alone_keeps_the_first_switch() -> None:
    assert plan(trade(), "harpagon", **PAPER)["cost"] == pytest.approx(15.0)


def test_exchange_gives_latency_back_for_a_bigger_saving() -> None:
    got = plan(trade(), "harpagon", **EXCHANGE)
    assert got["cost"] == pytest.approx(11.25)
    assert got["modules"]["A"]["wcl_s"] == pytest.approx(0.12)
    assert got["modules"]["B"]["wcl_s"] == pytest.approx(0.84)
    assert got["e2e_latency_s"]["app"] <= 0.96 * (1 + 1e-9)


@pytest.mark.parametrize(("make", "paper_cost"), [(fork, 16.0), (chain, 4.22), (trade, 15.0)])
def test_exchange_reaches_the_optimum_on_the_papers_split_examples(make, paper_cost) -> None:  # type: ignore[no-untyped-def]
    # The node merger's fork (16 -> 15.5) and cost-direct's chain (4.22 -> 3.42) without either.
    w = make()
    best = plan(w, "optimal", **SAME_SPACE)["cost"]
    assert best < paper_cost
    assert plan(w, "harpagon", **EXCHANGE)["cost"] == pytest.approx(best)


def test_frontier_sets_get_strictly_faster_and_each_fits_its_budget() -> None:
    w = parse_workload(generate(1, np.random.default_rng(3))[0])
    app = w.apps[0]
    m = app.modules[0]
    budgets: list[float] = []

    def build(budget_s: float):  # type: ignore[no-untyped-def]
        budgets.append(budget_s)
        return schedule_module(w.profiles[m], app.rate_rps[m], budget_s)

    sets = algorithm1_frontier(build, app.slo_s)
    assert len(sets) >= 2
    wcls = [s.wcl_s for s in sets]
    assert wcls == sorted(wcls, reverse=True) and len(set(wcls)) == len(wcls)
    assert all(s.wcl_s <= b * (1 + 1e-9) for s, b in zip(sets, budgets, strict=False))
    # The walk ends where Algorithm 1 finds nothing, or at its step limit.
    assert len(budgets) == len(sets) + 1 or len(sets) == MAX_STEPS


@pytest.mark.parametrize("seed", range(25))
def test_exchange_never_costs_more_and_keeps_the_slo(seed: int) -> None:
    w = parse_workload(random_workload(np.random.default_rng(seed)))
    with_it = plan(w, "harpagon")
    without = plan(w, "harpagon", exchange=False)
    assert with_it["cost"] <= without["cost"] * (1 + 1e-9)
    for app in w.apps:
        assert with_it["e2e_latency_s"][app.name] <= app.slo_s * (1 + 1e-9)
    assert plan(w, "optimal")["cost"] <= with_it["cost"] * (1 + 1e-9)


def cheapest_one_configuration_plan(w: Workload) -> float:
    """Brute force: one configuration per module (on its own rate, or on whole machines padded
    with dummy requests), timed under TC, the cheapest whose every path fits the SLO."""
    app = w.apps[0]
    options: dict[str, list[tuple[float, float]]] = {}
    for m in app.modules:
        pts = []
        for c in w.profiles[m]:
            whole_rps = max(1, math.ceil(app.rate_rps[m] / c.throughput_rps - 1e-9))
            for rate in (app.rate_rps[m], whole_rps * c.throughput_rps):
                a = Assignment(c, rate)
                pts.append((module_latency_s([a], "tc"), a.cost))
        options[m] = [pts[i] for i in pareto(pts)]
    best = math.inf
    for pick in itertools.product(*(options[m] for m in app.modules)):
        lat = {m: p[0] for m, p in zip(app.modules, pick, strict=True)}
        if path_latencies_s(app, lat)[0] <= app.slo_s * (1 + 1e-9):
            best = min(best, sum(p[1] for p in pick))
    return best


@pytest.mark.parametrize("seed", range(300))
def test_never_costlier_than_any_one_configuration_plan(seed: int) -> None:
    # Clipper's and InferLine's kind of plan, under the same dispatch: the exchange searches
    # every such combination (module docstring), so harpagon is never costlier.
    w = parse_workload(generate(1, np.random.default_rng(seed))[0])
    assert plan(w, "harpagon")["cost"] <= cheapest_one_configuration_plan(w) * (1 + 1e-9)

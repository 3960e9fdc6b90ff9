"""Harpagon's splitting optimisations (§III-D): node merger and cost-direct, on the paper's own
examples (LC 20 against 10 + 15; 0.01 s at LC 20 against 0.1 s at LC 10)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.cloud import Workload, parse_workload, plan
from scheduler.cloud.split import candidate_splits, latency_cost_efficiency
from tests.test_cloud_baselines import one_gpu
from tests.test_cloud_guarantees import random_workload

# Under 2d, GetWCL = 2d and the cost at rate T is T d / b (price 1, concurrency 1).
OFF = {"dispatch": "2d", "max_configs": 1, "dummy": False, "reassign": False, "exchange": False}


def workload(modules: dict[str, list[tuple[int, float]]], edges: list[list[str]],
             rates: dict[str, float], slo_s: float) -> Workload:  # fmt: skip
    return one_gpu(modules, {"app": {"edges": edges, "rate_rps": rates, "slo_s": slo_s}})


def fork() -> Workload:
    """M_x -> M_y, M_x -> M_z; each can afford one 0.1 s step, LC 20, 10 and 15."""
    rows = [(1, 0.1), (2, 0.15)]  # GetWCL 0.2 -> 0.3, saving T x 0.025: LC = 0.25 T
    return workload(
        {"Mx": rows, "My": rows, "Mz": rows},
        [["Mx", "My"], ["Mx", "Mz"]],
        {"Mx": 80, "My": 40, "Mz": 60},
        0.5,
    )


def chain() -> Workload:
    """M_x -> M_y: M_x's step takes 0.01 s at LC 20, M_y's 0.1 s at LC 10; room for one."""
    return workload(
        {"Mx": [(1, 0.105), (2, 0.11)], "My": [(1, 0.1), (2, 0.15)]},
        [["Mx", "My"]],
        {"Mx": 4, "My": 40},
        0.515,
    )


def test_paper_lc_values() -> None:
    w = fork()
    cfg = {m: w.profiles[m] for m in ("Mx", "My", "Mz")}
    rates = w.apps[0].rate_rps
    assert [latency_cost_efficiency(*cfg[m], rates[m], "2d") for m in cfg] == pytest.approx(
        [20.0, 10.0, 15.0]
    )
    c = chain()
    lc = [
        latency_cost_efficiency(*c.profiles[m], c.apps[0].rate_rps[m], "2d") for m in ("Mx", "My")
    ]
    assert lc == pytest.approx([20.0, 10.0])


def test_node_merger_switches_the_super_module() -> None:
    w = fork()
    (app,) = w.apps
    plain = candidate_splits(app, w.profiles, "2d")
    merged = candidate_splits(app, w.profiles, "2d", merge=True)
    # Without merging Algorithm 2 spends the 0.1 s on M_x (LC 20); merged, M_y + M_z (25).
    assert plain == [pytest.approx({"Mx": 0.3, "My": 0.2, "Mz": 0.2})]
    assert merged[1] == pytest.approx({"Mx": 0.2, "My": 0.3, "Mz": 0.3})
    # Costs: x at batch 2 (80 x 0.075) + y, z at batch 1 = 6 + 4 + 6; merged 8 + 3 + 4.5.
    assert plan(w, "harpagon", merge=False, cost_direct=False, **OFF)["cost"] == pytest.approx(16.0)
    assert plan(w, "harpagon", cost_direct=False, **OFF)["cost"] == pytest.approx(15.5)


def test_cost_direct_takes_the_bigger_saving_at_the_end() -> None:
    w = chain()
    (app,) = w.apps
    lc, *direct = candidate_splits(app, w.profiles, "2d", cost_direct=True)
    assert lc == pytest.approx({"Mx": 0.22 * 0.515 / 0.42, "My": 0.2 * 0.515 / 0.42})
    assert direct == [pytest.approx({"Mx": 0.21 * 0.515 / 0.51, "My": 0.3 * 0.515 / 0.51})]
    # LC: M_x saves 0.2, cost 0.22 + 4.0; cost-direct: M_y saves 1.0, cost 0.42 + 3.0.
    assert plan(w, "harpagon", merge=False, cost_direct=False, **OFF)["cost"] == pytest.approx(4.22)
    assert plan(w, "harpagon", merge=False, **OFF)["cost"] == pytest.approx(3.42)


@pytest.mark.parametrize("seed", range(30))
def test_merger_and_cost_direct_never_cost_more(seed: int) -> None:
    # Both only add candidate splits and the planner keeps the cheapest plan.
    w = parse_workload(random_workload(np.random.default_rng(seed)))
    full = plan(w, "harpagon")["cost"]
    for switches in (
        {"merge": False},
        {"cost_direct": False},
        {"merge": False, "cost_direct": False},
    ):
        assert full <= plan(w, "harpagon", **switches)["cost"] * (1 + 1e-9)
    assert plan(w, "piccolo", merge=True, cost_direct=True)["cost"] <= plan(w, "piccolo")[
        "cost"
    ] * (1 + 1e-9)

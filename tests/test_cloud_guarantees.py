"""Contracts of the cloud planner on seeded random workloads, and Algorithm 1's residual rules."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from scheduler.cloud import parse_workload, plan
from scheduler.cloud.configs import schedule_module
from scheduler.cloud.latency import module_latency_s
from scheduler.cloud.optimal import module_frontier
from scheduler.cloud.split import path_latencies_s
from scheduler.cloud.workload import Config
from scheduler.errors import InputError

M2 = [Config("GPU", b, 1, d, 1.0) for b, d in [(2, 0.125), (4, 0.16), (8, 0.25)]]


def test_unplaceable_residual_backtracks_instead_of_failing() -> None:
    # Greedy: 1 x b8 (32), 1 x b4 (25), then 3 req/s that nothing collects within 0.44 s.
    # One b4 machine fewer leaves 28 req/s for batch 2: 1 + 28/16 = 2.75.
    got = schedule_module(M2, 60.0, 0.44, "tc", None, "none")
    assert got is not None
    assert got.cost == pytest.approx(2.75)
    assert [(a.config.batch, a.machines) for a in got.assignments] == [(8, 1.0), (2, 1.75)]
    with_dummy = schedule_module(M2, 60.0, 0.44, "tc", None, "harpagon")
    assert with_dummy is not None and with_dummy.cost <= got.cost + 1e-9


def random_workload(rng: np.random.Generator) -> dict[str, Any]:
    hardware = {"A": {"price": 1.0}, "B": {"price": float(rng.uniform(1.2, 3.0))}}
    modules: dict[str, Any] = {}
    names = [f"M{i}" for i in range(int(rng.integers(1, 5)))]
    for name in names:
        base = float(rng.uniform(0.01, 0.1))
        profile = []
        for hw, speed in (("A", 1.0), ("B", float(rng.uniform(1.2, 3.0)))):
            for b in (1, 2, 4, 8, 16, 32):
                for s in (1, 2):
                    d = base * (1 + 0.6 * (b - 1) ** 0.9) * (1 + 0.7 * (s - 1)) / speed
                    profile.append({"hardware": hw, "batch": b, "concurrency": s, "duration_s": d})
        modules[name] = {"profile": profile}
    edges = [
        [names[i], names[j]] for j in range(1, len(names)) for i in range(j) if rng.random() < 0.5
    ]
    rates = {m: float(rng.uniform(5, 400)) for m in names}
    return {
        "hardware": hardware,
        "modules": modules,
        "apps": {"app": {"edges": edges, "rate_rps": rates, "slo_s": float(rng.uniform(0.6, 2.0))}},
    }


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("system", ["harpagon", "piccolo"])
def test_plan_meets_every_slo_and_accounts_every_request(seed: int, system: str) -> None:
    w = parse_workload(random_workload(np.random.default_rng(seed)))
    got = plan(w, system)
    app = w.apps[0]
    assert got["e2e_latency_s"]["app"] <= app.slo_s * (1 + 1e-9)
    for name, m in got["modules"].items():
        assert m["wcl_s"] <= m["budget_s"] * (1 + 1e-9)
        assert m["dummy_rps"] >= 0
        assert sum(c["rate_rps"] for c in m["configs"]) == pytest.approx(
            app.rate_rps[name] + m["dummy_rps"]
        )
    # Dummy requests are only kept when they lower a module's cost.
    assert got["cost"] <= plan(w, system, dummy=False)["cost"] * (1 + 1e-9)


def test_module_latency_is_max_over_machines() -> None:
    from scheduler.cloud.latency import Assignment

    b8 = M2[2]
    # 2.5 machines of batch 8: full ones collect at 80 req/s, the partial one at 16 req/s.
    assert module_latency_s([Assignment(b8, 80.0)], "tc") == pytest.approx(0.25 + 8 / 16)
    assert module_latency_s([Assignment(b8, 80.0)], "rr") == pytest.approx(0.25 + 8 / 16)
    assert module_latency_s([Assignment(b8, 64.0)], "rr") == pytest.approx(0.5)
    assert module_latency_s([Assignment(b8, 80.0)], "machine") == pytest.approx(0.5)


ALL_SYSTEMS = ("harpagon", "piccolo", "nexus", "scrooge", "inferline", "clipper", "optimal")


def with_slo(doc: dict[str, Any], slo_s: float) -> Any:
    out = {**doc, "apps": {"app": {**doc["apps"]["app"], "slo_s": slo_s}}}
    return parse_workload(out)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("system", ALL_SYSTEMS)
def test_budgets_are_a_split_of_the_slo(seed: int, system: str) -> None:
    # budget_s is each module's share of the SLO in the final plan: never below its worst case,
    # and along every path the budgets sum to at most the SLO (also after reassignment).
    doc = random_workload(np.random.default_rng(seed))
    w = parse_workload(doc)
    app = w.apps[0]
    try:
        got = plan(w, system)
    except InputError:
        return
    budgets = {m: body["budget_s"] for m, body in got["modules"].items()}
    assert path_latencies_s(app, budgets)[0] <= app.slo_s * (1 + 1e-9)
    for body in got["modules"].values():
        assert body["wcl_s"] <= body["budget_s"] * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("system", ALL_SYSTEMS)
def test_smallest_feasible_slo_is_reported_and_is_feasible(seed: int, system: str) -> None:
    doc = random_workload(np.random.default_rng(seed))
    with pytest.raises(InputError) as err:
        plan(with_slo(doc, 1e-4), system)
    msg = str(err.value)
    assert "\n" not in msg and "apps.app.slo_s" in msg
    found = re.search(r"at least ([0-9.e+-]+) s", msg)
    assert found is not None, msg
    min_slo = float(found.group(1))
    got = plan(with_slo(doc, min_slo), system)  # the reported SLO is met...
    assert got["e2e_latency_s"]["app"] <= min_slo * (1 + 1e-9)
    with pytest.raises(InputError):  # ... and nothing below it
        plan(with_slo(doc, min_slo * (1 - 1e-5)), system)


@pytest.mark.parametrize("seed", range(10))
def test_smallest_feasible_slo_with_dummy_requests_is_the_fastest_of_any_set(seed: int) -> None:
    # With dummy requests, one configuration on whole machines is the fastest set of any size:
    # the reported minimum is the longest path of those, for harpagon and optimal alike.
    doc = random_workload(np.random.default_rng(seed))
    w = parse_workload(doc)
    app = w.apps[0]
    fastest = {
        m: min(
            p.wcl_s
            for p in module_frontier(w.profiles[m], app.rate_rps[m], "tc", max_tuples=3, counts=5)
        )
        for m in app.modules
    }
    want = path_latencies_s(app, fastest)[0]
    for system in ("harpagon", "optimal"):
        with pytest.raises(InputError) as err:
            plan(with_slo(doc, want * (1 - 1e-5)), system)
        found = re.search(r"at least ([0-9.e+-]+) s", str(err.value))
        assert found is not None
        assert float(found.group(1)) == pytest.approx(want, rel=1e-5)


def test_backtracking_past_the_last_configuration_and_padding_a_large_residual() -> None:
    # Nexus' TITAN X yolo9000 rows at 306 req/s within 53 ms: Algorithm 1 backtracks from the
    # last configuration (once an IndexError) and pads a residual of several machines (once
    # padded with one machine only, a negative dummy rate and a set over its budget).
    rows = [(1, 0.0216757), (2, 0.0411762), (4, 0.0807939), (8, 0.155704), (16, 0.311602)]
    profile = [Config("TITANX", b, 1, d, 1.46) for b, d in [*rows, (24, 0.467635)]]
    got = schedule_module(profile, 306.0, 0.05257168468798555, "tc", None, "harpagon")
    assert got is not None and got.dummy_rps >= 0
    assert got.wcl_s <= 0.05257168468798555
    assert sum(a.rate_rps for a in got.assignments) == pytest.approx(306.0 + got.dummy_rps)


def test_deep_backtracking_does_not_recurse() -> None:
    # 500 machines of batch 1 and a 0.5 req/s residual nothing collects in time: Algorithm 1
    # backtracks machine by machine (once recursively, past Python's recursion limit).
    profile = [Config("A", 1, 1, 0.01, 1.0), Config("B", 50, 1, 0.2, 10.0)]
    assert schedule_module(profile, 50000.5, 0.3, "tc", None, "none") is None
    padded = schedule_module(profile, 50000.5, 0.3, "tc", None, "harpagon")
    assert padded is not None and padded.dummy_rps == pytest.approx(99.5)

"""Contracts of the cloud planner on seeded random workloads, and Algorithm 1's residual rules."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.cloud import parse_workload, plan
from scheduler.cloud.configs import schedule_module
from scheduler.cloud.latency import module_latency_s
from scheduler.cloud.workload import Config

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

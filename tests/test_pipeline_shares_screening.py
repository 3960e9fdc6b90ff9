"""Several models: the exact LP-bound screening (`shares.solve_screened_models`) finds the plain
MILP's optimum, its weights bound every solution, and a time limit still leaves a plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scheduler.pipeline.milp import Cluster, candidates_or_refusal, solve_candidates
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles
from scheduler.pipeline.screening import candidate_bounds, share_weights
from scheduler.pipeline.shares import Workload, plan_models, solve_screened_models

CLOUD = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles" / "cloud"


def bundled(name: str) -> ModelProfiles:
    return load_model_profiles(
        CLOUD / "ppipe", name, gpus=["L4", "T4"], transfer_dir=CLOUD / "ppipe-transfer-sizes"
    )


def cluster(l4: int, t4: int) -> Cluster:
    return Cluster.from_json(
        {
            "gpus": {"L4": {"count": l4, "per_server": 4}, "T4": {"count": t4, "per_server": 2}},
            "nic_gbps": 10,
        }
    )


def slo_ms(profiles: ModelProfiles, times: float) -> float:
    return times * profiles.partition_latency_ms("L4", 1, 0, profiles.num_blocks, 1)


# (models, shares, L4, T4, margin, P, MPS): 77 to 314 candidates in all
CASES = [
    (("cyclegan", "repvgg-b3"), (1.0, 1.0), 2, 2, 0.1, 3, 2),
    (("cyclegan", "repvgg-b3", "googlenet-v3-pytorch"), (1.0, 1.0, 1.0), 2, 4, 0.2, 3, 2),
    (("repvgg-b3", "googlenet-v3-pytorch"), (0.25, 0.75), 2, 4, 0.4, 3, 2),
    (("cyclegan", "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k"), (1.0, 2.0), 2, 2, 0.2, 2, 2),
]


def instance(case: tuple) -> tuple[list, Cluster, list[float]]:  # type: ignore[type-arg]
    names, shares, l4, t4, margin, parts, mps = case
    pool = cluster(l4, t4)
    groups = []
    for name in names:
        prof = bundled(name)
        groups.append(
            candidates_or_refusal(prof, pool, slo_ms(prof, 5), margin, parts, mps, "ppipe")
        )
    total = sum(shares)
    return groups, pool, [s / total for s in shares]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "+".join(n[:8] for n in c[0]))
def test_screening_finds_the_plain_optimum(case: tuple) -> None:  # type: ignore[type-arg]
    groups, pool, shares = instance(case)
    plain = solve_candidates(groups, pool, shares, None, 1e-6)
    screened = solve_screened_models(groups, pool, shares, None, 1e-6)
    assert plain.status == screened.status == "optimal"
    assert screened.normalized_rps == pytest.approx(plain.normalized_rps, rel=2e-6)
    # the total at that t (the second solve), which the models may split either way
    total = sum(p.throughput_rps for p in plain.plans)
    assert sum(p.throughput_rps for p in screened.plans) == pytest.approx(total, rel=1e-5)
    for plan, cands, share in zip(screened.plans, groups, shares, strict=True):
        assert plan.throughput_rps >= share * screened.normalized_rps * (1 - 1e-5)
        assert plan.candidates == len(cands)  # every candidate counted, kept or not


@pytest.mark.parametrize("case", CASES[:2], ids=["two", "three"])
def test_share_weights_bound_every_solution_and_drop_some_candidates(
    case: tuple,  # type: ignore[type-arg]
) -> None:
    """lambda >= 0 with sum lambda_g s_g = 1; the optimum's t is within the union's bound B,
    and some candidates' UB(c) lies below it (the screening has something to drop)."""
    groups, pool, shares = instance(case)
    weights = share_weights(groups, pool, shares)
    assert (weights >= 0).all() and float(weights @ np.array(shares)) == pytest.approx(1.0)
    union = [
        replace(c, rates_rps=tuple(w * r for r in c.rates_rps))
        for cands, w in zip(groups, weights, strict=True)
        for c in cands
    ]
    bounds = candidate_bounds(union, pool)
    best = solve_candidates(groups, pool, shares, None, 1e-6)
    t = best.normalized_rps
    assert t <= bounds.bound_rps * (1 + 1e-9)
    # the optimum's own weighted throughput is also at least t (t <= sum_g lambda_g X_g)
    weighted = sum(w * p.throughput_rps for w, p in zip(weights, best.plans, strict=True))
    assert weighted >= t * (1 - 1e-9)
    assert min(bounds.used_bound_rps) < t  # some candidate no solution at t can use


def test_a_time_limit_still_leaves_a_plan() -> None:
    """4571 candidates of two models on 8 GPUs under 2 s: the plain MILP stopped with no plan;
    the incumbent now gives one (whichever side of the limit the last MILP ends)."""
    pool = cluster(4, 4)
    loads = [Workload(bundled("cyclegan"), 1.0, 100.0), Workload(bundled("repvgg-b3"), 1.0, 100.0)]
    plan = plan_models(loads, pool, 0.1, 3, 4, time_limit_s=2.0)
    assert plan.status in ("optimal", "time_limit")
    assert plan.normalized_rps > 0 and plan.gap is not None and np.isfinite(plan.gap)
    for entry in plan.models.values():
        assert entry.plan.pipelines
        assert entry.plan.throughput_rps >= entry.share * plan.normalized_rps * (1 - 1e-6)
        assert all(p.latency_ms <= entry.slo_ms + 1e-9 for p in entry.plan.pipelines)


def test_progress_is_told_the_candidates_once_before_the_solve() -> None:
    pool = cluster(2, 2)
    loads = [Workload(bundled("cyclegan"), 1.0, 60.0), Workload(bundled("repvgg-b3"), 1.0, 60.0)]
    told: list[str] = []
    plan = plan_models(loads, pool, 0.1, 3, 2, time_limit_s=30.0, progress=told.append)
    counts = [entry.plan.candidates for entry in plan.models.values()]
    assert told == [
        f"{sum(counts)} candidate pipelines (cyclegan {counts[0]}, repvgg-b3 {counts[1]}); "
        "solving, at most 30 s"
    ]

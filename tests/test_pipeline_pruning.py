"""Exact candidate pruning (dominance) and LP-bound screening leave the MILP optimum unchanged."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from scheduler.pipeline.candidates import Candidate, enumerate_candidates, undominated
from scheduler.pipeline.milp import (
    Cluster,
    PipelinePlan,
    _solve_configs,
    plan_pipelines,
    solve_candidates,
    solve_screened,
)
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles
from scheduler.pipeline.screening import candidate_bounds, configs

CLOUD = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles" / "cloud"


def cand(gpus: tuple[str, ...], mps: tuple[int, ...], rates: tuple[float, ...]) -> Candidate:
    bounds = tuple(range(len(gpus) + 1))
    return Candidate(gpus, bounds, mps, 1, 1.0, (1.0,) * len(gpus), rates)


def test_dominance_by_hand() -> None:
    half = cand(("A",), (2,), (60.0,))  # 120 rps per GPU in halves
    whole = cand(("A",), (1,), (100.0,))  # 100 per GPU: half's workers replace it
    third = cand(("A",), (3,), (45.0,))  # 135 per GPU, but thirds do not fill halves
    assert undominated([whole, half, third]) == [half, third]
    twin = cand(("A",), (2,), (60.0,))
    assert undominated([half, twin]) == [half]  # equal: the first stays
    # Against a prefix: (A,) at 150 rps per GPU beats partition 0 of an (A, B) pipeline at
    # 100 and frees its B workers; an (A, B) pipeline faster on A stays.
    fast_a = cand(("A",), (1,), (150.0,))
    slow_chain = cand(("A", "B"), (1, 1), (100.0, 80.0))
    fast_chain = cand(("A", "B"), (1, 1), (200.0, 80.0))
    assert undominated([slow_chain, fast_chain], [fast_a]) == [fast_chain]


def repvgg() -> ModelProfiles:
    return load_model_profiles(
        CLOUD / "ppipe", "repvgg-b3", gpus=["L4", "T4"], transfer_dir=CLOUD / "ppipe-transfer-sizes"
    )


def small(l4: int, t4: int) -> Cluster:
    return Cluster.from_json(
        {
            "gpus": {"L4": {"count": l4, "per_server": 4}, "T4": {"count": t4, "per_server": 2}},
            "nic_gbps": 10,
        }
    )


@pytest.mark.parametrize(("l4", "t4", "margin"), [(2, 4, 0.4), (3, 5, 0.1), (4, 8, 0.4)])
def test_pruning_and_screening_keep_the_optimum(l4: int, t4: int, margin: float) -> None:
    profiles, cluster = repvgg(), small(l4, t4)
    slo_ms = 49.0
    every = enumerate_candidates(profiles, cluster, slo_ms, margin, 3, 2, prune=False)
    kept = enumerate_candidates(profiles, cluster, slo_ms, margin, 3, 2)
    assert len(kept) < len(every) and set(kept) <= set(every)
    exact = solve_candidates([every], cluster, None, None, 1e-9).plans[0]
    pruned = solve_candidates([kept], cluster, None, None, 1e-9).plans[0]
    screened = plan_pipelines(profiles, cluster, slo_ms, margin, 3, 2, mip_rel_gap=1e-9)
    assert exact.status == pruned.status == screened.status == "optimal"
    assert pruned.throughput_rps == pytest.approx(exact.throughput_rps, rel=1e-9)
    assert screened.throughput_rps == pytest.approx(exact.throughput_rps, rel=1e-9)
    assert screened.candidates == len(kept)
    # The LP bounds behind the screening: nothing beats B, nor UB(c) with c in use.
    bounds = candidate_bounds(every, cluster)
    assert bounds.bound_rps >= exact.throughput_rps - 1e-6
    for pipe in exact.pipelines:
        (index,) = [
            i
            for i, c in enumerate(every)
            if (c.gpus, c.mps, c.batch)
            == (pipe.gpus, tuple(q.mps for q in pipe.partitions), pipe.batch)
            and c.bounds[1:] == tuple(q.blocks[1] for q in pipe.partitions)
        ]
        assert bounds.used_bound_rps[index] >= exact.throughput_rps - 1e-6


def test_screening_on_a_hard_model_matches_the_plain_milp() -> None:
    profiles = load_model_profiles(
        CLOUD / "ppipe",
        "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k",
        gpus=["L4", "T4"],
        transfer_dir=CLOUD / "ppipe-transfer-sizes",
    )
    cluster = small(2, 4)
    slo_ms = 5 * profiles.partition_latency_ms("L4", 1, 0, profiles.num_blocks, 1)
    plain = plan_pipelines(profiles, cluster, slo_ms, 0.4, 3, 2, prune=False)
    screened = plan_pipelines(profiles, cluster, slo_ms, 0.4, 3, 2)
    assert plain.status == screened.status == "optimal"
    assert screened.gap is not None and screened.gap <= 1e-4
    assert screened.candidates < plain.candidates  # dominance pruning only
    low = max(plain.throughput_rps, screened.throughput_rps) * (1 - 1e-4)
    assert min(plain.throughput_rps, screened.throughput_rps) >= low


def brute_force(cands: list[Candidate], cluster: Cluster) -> tuple[float, list[tuple[float, ...]]]:
    """The optimum over every integer worker vector of every candidate (x_c = min_d r w), and
    the throughputs of every feasible solution (per candidate); no MILP, no breakpoints."""
    options = []
    for c in cands:
        ranges = [range(cluster.gpus[g].count * m + 1) for g, m in zip(c.gpus, c.mps, strict=True)]
        opts = {(0.0, (0,) * len(c.gpus))}
        for w in itertools.product(*ranges):
            if min(w) > 0:
                opts.add((min(r * n for r, n in zip(c.rates_rps, w, strict=True)), w))
        options.append(sorted(opts))
    best, solutions = 0.0, []
    for combo in itertools.product(*options):
        usage: dict[tuple[int, str], float] = {}
        for c, (_, w) in zip(cands, combo, strict=True):
            for d, (g, m) in enumerate(zip(c.gpus, c.mps, strict=True)):
                usage[d, g] = usage.get((d, g), 0.0) + w[d] / m
        per_type: dict[str, int] = {}
        for (_, g), used in usage.items():
            per_type[g] = per_type.get(g, 0) + math.ceil(used - 1e-9)
        if all(n <= cluster.gpus[g].count for g, n in per_type.items()):
            xs = tuple(x for x, _ in combo)
            solutions.append(xs)
            best = max(best, sum(xs))
    return best, solutions


@pytest.mark.parametrize("seed", range(6))
def test_configuration_milp_matches_brute_force(seed: int) -> None:
    """The configuration MILP (candidates at the points where a worker count steps up) and the
    per-configuration bounds UB(c, x) against every integer worker vector."""
    rng = random.Random(seed)
    cands = [
        cand(("A",), (1,), (rng.uniform(20, 100),)),
        cand(("B",), (2,), (rng.uniform(10, 60),)),
        cand(("A", "B"), (2, 1), (rng.uniform(10, 60), rng.uniform(20, 100))),
        cand(("B", "A"), (1, 2), (rng.uniform(20, 100), rng.uniform(10, 60))),
    ]
    cluster = Cluster.from_json(
        {"gpus": {"A": {"count": 2, "per_server": 1}, "B": {"count": 2}}, "nic_gbps": 10}
    )
    best, solutions = brute_force(cands, cluster)
    bounds = candidate_bounds(cands, cluster)
    listed, below = configs(cands, cluster, bounds, -math.inf)
    assert below == 0.0
    solved = _solve_configs(cands, listed, cluster, None, 1e-9, None)
    assert -solved.res.fun == pytest.approx(best, rel=1e-9)  # the MILP's own objective
    assert solved.plan.throughput_rps == pytest.approx(best, rel=1e-9)
    for cfg in listed:  # every configuration's workers carry its throughput
        rates = cands[cfg.cand].rates_rps
        assert min(w * r for w, r in zip(cfg.workers, rates, strict=True)) >= cfg.x_rps * (1 - 1e-9)
    assert plan_pipelines_of(cands, cluster).throughput_rps == pytest.approx(best, rel=1e-9)
    ub = {(cfg.cand, round(cfg.x_rps, 6)): cfg.bound_rps for cfg in listed}
    for xs in solutions:  # every used candidate at its throughput is bounded by UB(c, x)
        for c, x in enumerate(xs):
            if x > 0:
                assert ub[c, round(x, 6)] >= sum(xs) - 1e-6
    # Screening at the optimum keeps the configurations of an optimal solution.
    kept, below = configs(cands, cluster, bounds, best * (1 - 1e-9))
    assert below < best * (1 - 1e-9)
    again = _solve_configs(cands, kept, cluster, None, 1e-9, None).plan
    assert again.throughput_rps == pytest.approx(best, rel=1e-9)


def plan_pipelines_of(cands: list[Candidate], cluster: Cluster) -> PipelinePlan:
    """solve_screened with no incumbent MILP shortcut: the whole screened path."""
    return solve_screened(cands, cluster, None, 1e-9)

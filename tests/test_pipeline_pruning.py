"""Exact candidate pruning (dominance) and LP-bound screening leave the MILP optimum unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.pipeline.candidates import Candidate, enumerate_candidates, undominated
from scheduler.pipeline.milp import Cluster, plan_pipelines, solve_candidates
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles
from scheduler.pipeline.screening import candidate_bounds

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

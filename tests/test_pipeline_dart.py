"""DART-r (PPipe 7.1): chains over (high, low) GPU pairs plus leftovers running whole models."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.errors import InputError
from scheduler.pipeline.dart import gpu_classes, plan_dart_r
from scheduler.pipeline.milp import Cluster, plan_pipelines, solve
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles

REPO = Path(__file__).resolve().parent.parent
CLOUD = REPO / "traces" / "data" / "profiles" / "cloud"


def toy() -> ModelProfiles:
    """3 blocks at batch 1. A: 1 ms per block (MPS 2: 1.5 ms); B: 2, 2 and 6 ms; cuts 1250 B."""
    return ModelProfiles(
        model="toy",
        num_blocks=3,
        latency_us={
            ("A", 1): ((1000.0,), (1000.0,), (1000.0,)),
            ("A", 2): ((1500.0,), (1500.0,), (1500.0,)),
            ("B", 1): ((2000.0,), (2000.0,), (6000.0,)),
        },
        cut_bytes=(1250, 1250),
    )


def cluster(a: int, b: int) -> Cluster:
    gpus = {"A": {"count": a, "per_server": 1}, "B": {"count": b, "per_server": 1}}
    return Cluster.from_json({"gpus": gpus, "nic_gbps": 10})


def test_hand_instance_pairs_and_leftovers() -> None:
    # A runs the model in 3 ms, B in 10 ms: A is the high class. SLO 12 ms, no margin; a cut
    # costs 0.001 ms. Chains of one A and one B (batch 1):
    #   (A, B) cut 1: A 1 ms -> 1000 rps, B 8 ms -> 125 rps: 125 rps
    #   (A, B) cut 2: A 2 ms -> 500, B 6 ms -> 166.7: 166.7
    #   (B, A) cut 1: B 2 ms -> 500, A 2 ms -> 500: 500, the best
    #   (B, A) cut 2: B 4 ms -> 250, A 1 ms -> 1000: 250
    # 1 pair at 500 rps; the 2 leftover B GPUs run the whole model (10 ms <= 12): 2 x 100.
    assert gpu_classes(toy(), cluster(1, 3)) == ("A", "B")
    plan = plan_dart_r(toy(), cluster(1, 3), 12.0, 0.0)
    assert plan.status == "optimal" and plan.gap == 0.0
    assert plan.throughput_rps == pytest.approx(700.0)
    assert plan.to_json()["pipelines"] == [
        {
            "gpus": ["B", "A"],
            "batch": 1,
            "throughput_rps": pytest.approx(500.0),
            "latency_ms": pytest.approx(4.001),
            "partitions": [
                {"blocks": [0, 1], "gpu": "B", "mps": 1, "workers": 1, "gpus_used": 1.0},
                {"blocks": [1, 3], "gpu": "A", "mps": 1, "workers": 1, "gpus_used": 1.0},
            ],
        },
        {
            "gpus": ["B"],
            "batch": 1,
            "throughput_rps": pytest.approx(200.0),
            "latency_ms": pytest.approx(10.0),
            "partitions": [
                {"blocks": [0, 3], "gpu": "B", "mps": 1, "workers": 2, "gpus_used": 2.0}
            ],
        },
    ]
    # At 8 ms no leftover B meets the SLO alone and the pair is the whole plan; PPipe's search
    # space holds it (and uses A at MPS 2 to do better), NP only has A.
    dart = plan_pipelines(toy(), cluster(1, 2), 8.0, 0.0, system="dart-r")
    assert dart.throughput_rps == pytest.approx(500.0)
    assert plan_pipelines(toy(), cluster(1, 2), 8.0, 0.0, 3, 2).throughput_rps == pytest.approx(
        2000 / 3
    )
    assert plan_pipelines(toy(), cluster(1, 2), 8.0, 0.0, system="np").throughput_rps == (
        pytest.approx(1000 / 3)
    )


def test_no_chain_meets_the_slo_so_every_gpu_runs_whole_models() -> None:
    # SLO 3.5 ms: no chain fits (the fastest, (B, A) cut 1, takes 4.001 ms) and B alone
    # misses it; the one A GPU runs the model in 3 ms.
    plan = plan_dart_r(toy(), cluster(1, 2), 3.5, 0.0)
    assert [p.gpus for p in plan.pipelines] == [("A",)]
    assert plan.throughput_rps == pytest.approx(1000 / 3)
    with pytest.raises(InputError, match="dart-r chain or a whole model"):
        plan_dart_r(toy(), cluster(0, 2), 3.5, 0.0)


def test_more_than_two_types_and_one_type() -> None:
    three = Cluster.from_json(
        {
            "gpus": {t: {"count": 1, "per_server": 1} for t in ("A", "B", "C")},
            "nic_gbps": 10,
        }
    )
    with_c = replace(toy(), latency_us={**toy().latency_us, ("C", 1): ((500.0,),) * 3})
    with pytest.raises(InputError, match="at most two GPU types"):
        plan_dart_r(with_c, three, 12.0, 0.0)
    # One type: no pairs; all its GPUs are leftovers running the whole model.
    only_a = plan_dart_r(toy(), cluster(3, 0), 12.0, 0.0)
    assert only_a.throughput_rps == pytest.approx(1000.0)


@pytest.mark.parametrize("model", ["repvgg-b3", "googlenet-v3-pytorch", "cyclegan"])
def test_dart_r_never_beats_ppipe_on_bundled_models(model: str) -> None:
    """PPipe's candidates include every DART-r chain and whole-model pipeline, at GPU counts
    per (partition index, type) within the cluster: DART-r <= PPipe (up to PPipe's gap)."""
    profiles = load_model_profiles(
        CLOUD / "ppipe", model, gpus=["L4", "T4"], transfer_dir=CLOUD / "ppipe-transfer-sizes"
    )
    small = Cluster.from_json(
        {
            "gpus": {"L4": {"count": 4, "per_server": 4}, "T4": {"count": 8, "per_server": 2}},
            "nic_gbps": 10,
        }
    )
    slo_ms = 5 * profiles.partition_latency_ms("L4", 1, 0, profiles.num_blocks, 1)
    dart = solve(profiles, small, slo_ms, 0.4, system="dart-r")
    ppipe = plan_pipelines(profiles, small, slo_ms, 0.4, max_parts=2, max_mps=1)
    assert ppipe.status == "optimal" and ppipe.gap is not None
    assert dart.throughput_rps > 0
    assert dart.throughput_rps <= ppipe.throughput_rps * (1 + ppipe.gap) + 1e-9
    high, low = gpu_classes(profiles, small)
    assert (high, low) == ("L4", "T4")
    chains = [p for p in dart.pipelines if len(p.gpus) == 2]
    for pipe in chains:  # 4 pairs, one worker of each class per pair
        assert sorted(pipe.gpus) == ["L4", "T4"]
        assert [q.workers for q in pipe.partitions] == [4, 4]
        assert pipe.latency_ms <= slo_ms * 0.6 + 1e-9

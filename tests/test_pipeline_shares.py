"""Several models on one cluster: the largest t with every model g at >= share_g x t."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster, plan_pipelines
from scheduler.pipeline.plan import ModelsPlan
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles
from scheduler.pipeline.shares import Workload, parse_named_numbers, plan_models, solve_models

CLOUD = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles" / "cloud"


def one_block(name: str, a_us: float, b_us: float) -> ModelProfiles:
    return ModelProfiles(
        model=name,
        num_blocks=1,
        latency_us={("A", 1): ((a_us,),), ("B", 1): ((b_us,),)},
        cut_bytes=(),
    )


def ab_cluster() -> Cluster:
    return Cluster.from_json(
        {
            "gpus": {"A": {"count": 1, "per_server": 1}, "B": {"count": 1, "per_server": 1}},
            "nic_gbps": 10,
        }
    )


def check_shares(plan: ModelsPlan, cluster: Cluster) -> None:
    """Every model meets its share of t; each GPU serves one model; counts fit the cluster."""
    assert plan.status == "optimal"
    used = dict.fromkeys(cluster.gpus, 0)
    for entry in plan.models.values():
        assert entry.plan.throughput_rps >= entry.share * plan.normalized_rps * (1 - 1e-6)
        per_index: dict[tuple[int, str], float] = {}
        for pipe in entry.plan.pipelines:
            assert pipe.latency_ms <= entry.slo_ms + 1e-9
            for d, part in enumerate(pipe.partitions):
                key = (d, part.gpu)
                per_index[key] = per_index.get(key, 0.0) + part.gpus_used
        for (_, gpu), gpus in per_index.items():
            used[gpu] += -int(-round(gpus, 9) // 1)
    assert all(used[g] <= pool.count for g, pool in cluster.gpus.items())


def test_hand_instance_the_bottleneck_model_sets_t() -> None:
    # X: 1 ms on A (1000 rps), 2 ms on B (500). Y: 4 ms on A (250), 2 ms on B (500).
    # One GPU per model. Shares 1:1 -> X on A, Y on B: t = min(1000, 500) = 500 (the other
    # way: 250). Shares 3:1 -> t = min(1000 / 3, 500) = 333.3; both models keep their GPU.
    x, y = one_block("X", 1000, 2000), one_block("Y", 4000, 2000)
    even = plan_models([Workload(x, 1, 10.0), Workload(y, 1, 10.0)], ab_cluster(), 0.0, 1, 1)
    assert even.normalized_rps == pytest.approx(500.0)
    assert even.models["X"].plan.throughput_rps == pytest.approx(1000.0)
    assert even.models["Y"].plan.throughput_rps == pytest.approx(500.0)
    assert [p.gpus for p in even.models["X"].plan.pipelines] == [("A",)]
    check_shares(even, ab_cluster())
    skewed = plan_models([Workload(x, 3, 10.0), Workload(y, 1, 10.0)], ab_cluster(), 0.0, 1, 1)
    assert skewed.normalized_rps == pytest.approx(1000 / 3)
    assert skewed.throughput_rps == pytest.approx(1500.0)  # the second solve fills Y's GPU
    doc = skewed.to_json()
    assert doc["normalized_rps"] == pytest.approx(1000 / 3)
    assert doc["models"]["X"]["share"] == 3.0 and doc["models"]["Y"]["slo_ms"] == 10.0
    assert doc["models"]["Y"]["pipelines"][0]["partitions"][0]["gpu"] == "B"


def test_shares_are_weights_whatever_their_scale() -> None:
    # the same problem: t in the caller's shares, the same pipelines
    x, y = one_block("X", 1000, 2000), one_block("Y", 4000, 2000)
    plans = [
        plan_models([Workload(x, 3 * k, 10.0), Workload(y, k, 10.0)], ab_cluster(), 0.0, 1, 1)
        for k in (1.0, 0.01, 50.0)
    ]
    for plan, k in zip(plans, (1.0, 0.01, 50.0), strict=True):
        assert plan.normalized_rps * k == pytest.approx(1000 / 3)
        assert plan.models["X"].share == 3 * k
        assert plan.throughput_rps == pytest.approx(1500.0)


def test_one_model_is_the_single_model_optimum_over_its_share() -> None:
    profiles = load_model_profiles(
        CLOUD / "ppipe", "repvgg-b3", transfer_dir=CLOUD / "ppipe-transfer-sizes"
    )
    cluster = Cluster.from_json(
        {
            "gpus": {"L4": {"count": 2, "per_server": 2}, "T4": {"count": 4, "per_server": 2}},
            "nic_gbps": 10,
        }
    )
    single = plan_pipelines(profiles, cluster, 49.0, 0.4, 2, 2)
    alone = plan_models([Workload(profiles, 0.25, 49.0)], cluster, 0.4, 2, 2)
    assert alone.normalized_rps == pytest.approx(single.throughput_rps / 0.25, rel=2e-4)


def test_bundled_models_share_the_cluster() -> None:
    cluster = Cluster.from_json(
        {
            "gpus": {"L4": {"count": 4, "per_server": 4}, "T4": {"count": 8, "per_server": 2}},
            "nic_gbps": 10,
        }
    )
    loads = []
    for name, share in (("repvgg-b3", 0.25), ("googlenet-v3-pytorch", 0.75)):
        prof = load_model_profiles(
            CLOUD / "ppipe", name, gpus=["L4", "T4"], transfer_dir=CLOUD / "ppipe-transfer-sizes"
        )
        slo = 5 * prof.partition_latency_ms("L4", 1, 0, prof.num_blocks, 1)
        loads.append(Workload(prof, share, slo))
    ticks = iter([1.0, 3.0])
    plan = solve_models(loads, cluster, 0.4, 3, 2, clock=lambda: next(ticks))
    assert plan.solve_s == 2.0
    check_shares(plan, cluster)
    # Neither model alone on the whole cluster does worse than its share of t.
    for w in loads:
        alone = plan_pipelines(w.profiles, cluster, w.slo_ms, 0.4, 3, 2)
        assert w.share * plan.normalized_rps <= alone.throughput_rps * (1 + 1e-4)


def test_refusals() -> None:
    x = one_block("X", 1000, 2000)
    with pytest.raises(InputError, match="each model once"):
        plan_models([Workload(x, 1, 10.0), Workload(x, 1, 10.0)], ab_cluster())
    with pytest.raises(InputError, match=r"share\.X"):
        plan_models([Workload(x, 0, 10.0)], ab_cluster())
    with pytest.raises(InputError, match="for several models"):
        plan_models([Workload(x, 1, 10.0)], ab_cluster(), system="dart-r")
    with pytest.raises(InputError, match="plan X: slo_ms"):
        plan_models([Workload(x, 1, 0.5)], ab_cluster(), 0.0)
    assert parse_named_numbers("a=0.5, b=2", "--share") == {"a": 0.5, "b": 2.0}
    for bad in ("a", "a=0", "a=1,a=2", "a=x", "=1"):
        with pytest.raises(InputError, match="--share"):
            parse_named_numbers(bad, "--share")


def test_the_time_limit_is_split_between_the_two_solves(monkeypatch: pytest.MonkeyPatch) -> None:
    """--time-limit-s bounds HiGHS over both solves of several models (max-min t, then the
    total at that t), not each one: 0.7 and 0.3 of it."""
    import scheduler.pipeline.milp as milp

    limits: list[float | None] = []
    real_run = milp._run

    def recording_run(*args: Any, **kwargs: Any) -> Any:
        limits.append(args[3])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(milp, "_run", recording_run)
    x, y = one_block("X", 1000, 2000), one_block("Y", 4000, 2000)
    plan = plan_models(
        [Workload(x, 1, 10.0), Workload(y, 1, 10.0)], ab_cluster(), 0.0, 1, 1, time_limit_s=10.0
    )
    assert plan.normalized_rps == pytest.approx(500.0)
    assert limits == [pytest.approx(7.0), pytest.approx(3.0)]

"""PPipe control plane (issue 8): profiles, the MILP, the NP baseline, errors, determinism."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster, PipelinePlan, plan_pipelines, solve
from scheduler.pipeline.profiles import ModelProfiles, load_model_profiles

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "traces" / "data" / "profiles" / "cloud" / "ppipe"
# Bytes per sample at each of repvgg-b3's 9 cuts, copied from the PPipe repository's
# data/models/transfer-sizes/repvgg-b3.csv (../shared/data/profiles/ppipe/transfer-sizes/); the
# bundled copy of the profiles holds only the block timings.
REPVGG_CUT_BYTES = (4816896, 2408448) + (1204224,) * 7


def write_tables(folder: Path, tables: dict[str, list[list[int]]], cuts: list[int]) -> Path:
    """Write `{model}-{gpu}-{m}.csv` tables for model "toy" and its transfer sizes."""
    (folder / "transfer-sizes").mkdir(parents=True)
    for name, rows in tables.items():
        text = "".join(",".join(str(v) for v in row) + "\n" for row in rows)
        (folder / f"toy-{name}.csv").write_text(text)
    (folder / "transfer-sizes" / "toy.csv").write_text("".join(f"{c}\n" for c in cuts))
    return folder


@pytest.fixture
def toy(tmp_path: Path) -> ModelProfiles:
    """3 blocks, batch 1 only. A: 1 ms per block (A at MPS 2: 1.5 ms); B: 2, 2 and 6 ms."""
    folder = write_tables(
        tmp_path,
        {
            "A-1": [[1000], [1000], [1000]],
            "A-2": [[1500], [1500], [1500]],
            "B-1": [[2000], [2000], [6000]],
        },
        [1250, 1250],
    )
    return load_model_profiles(folder, "toy")


def toy_cluster(nic_gbps: float = 10.0) -> Cluster:
    return Cluster.from_json(
        {
            "gpus": {"A": {"count": 1, "per_server": 1}, "B": {"count": 2, "per_server": 1}},
            "nic_gbps": nic_gbps,
        }
    )


def test_hand_instance_optimum_is_exact(toy: ModelProfiles) -> None:
    # SLO 8 ms, no margin; each cut costs 1250 B * 8 / 10 Gbit/s = 0.001 ms per sample.
    # Block 2 on B takes 6 ms, so with blocks 0-1 (>= 2 ms) and a cut it misses 8 ms: block 2
    # always runs on A, and the single A GPU sits at one partition index.
    # NP: A runs the whole model, 3 ms -> 1000/3 rps; B alone takes 10 ms > 8 ms.
    np_plan = plan_pipelines(toy, toy_cluster(), 8.0, 0.0, system="np")
    assert np_plan.status == "optimal"
    assert np_plan.throughput_rps == pytest.approx(1000 / 3, rel=1e-9)
    # No MPS: (B, A) cut at 1 -> B 500 rps/GPU, A 500 rps; (B, A) cut at 2 -> 2 B GPUs 2 x 250,
    # (B, B, A) -> 500: the optimum is 500 rps.
    assert plan_pipelines(toy, toy_cluster(), 8.0, 0.0, 3, 1).throughput_rps == pytest.approx(500.0)
    # A at MPS 2: (B, A) cut at 1, A's blocks 1-2 take 3 ms on a half GPU -> 2 workers x 1000/3;
    # 2 B GPUs give 1000 on block 0: 2000/3 rps, the only plan reaching it.
    plan = plan_pipelines(toy, toy_cluster(), 8.0, 0.0, 3, 2)
    assert plan.status == "optimal"
    assert plan.throughput_rps == pytest.approx(2000 / 3, rel=1e-9)
    assert plan.to_json()["pipelines"] == [
        {
            "gpus": ["B", "A"],
            "batch": 1,
            "throughput_rps": pytest.approx(2000 / 3),
            "latency_ms": pytest.approx(5.001),
            "partitions": [
                {"blocks": [0, 1], "gpu": "B", "mps": 1, "workers": 2, "gpus_used": 2.0},
                {"blocks": [1, 3], "gpu": "A", "mps": 2, "workers": 2, "gpus_used": 1.0},
            ],
        }
    ]


def test_nic_share_caps_worker_rate(toy: ModelProfiles) -> None:
    # 0.004 Gbit/s: a cut takes 10000 bit / 4e6 bit/s = 2.5 ms per sample and caps a worker that
    # sends or receives it at 400 rps (200 on a half GPU). Every split pipeline then stays at
    # 400 rps, while A running the whole model at MPS 2 crosses no NIC: 2 x 1000/4.5 = 4000/9.
    plan = plan_pipelines(toy, toy_cluster(nic_gbps=0.004), 8.0, 0.0, 3, 2)
    assert plan.throughput_rps == pytest.approx(4000 / 9, rel=1e-9)
    assert [p.gpus for p in plan.pipelines] == [("A",)]
    assert plan.pipelines[0].partitions[0].mps == 2


@pytest.fixture
def repvgg(tmp_path: Path) -> ModelProfiles:
    folder = tmp_path / "ppipe"
    folder.mkdir()
    for path in sorted(BUNDLED.glob("repvgg-b3-*.csv")):
        shutil.copy(path, folder / path.name)
    (tmp_path / "transfer-sizes").mkdir()
    (tmp_path / "transfer-sizes" / "repvgg-b3.csv").write_text(
        "".join(f"{c}\n" for c in REPVGG_CUT_BYTES)
    )
    return load_model_profiles(folder, "repvgg-b3", gpus=["L4", "T4"])


def small_cluster() -> Cluster:
    return Cluster.from_json(
        {
            "gpus": {"L4": {"count": 4, "per_server": 4}, "T4": {"count": 8, "per_server": 2}},
            "nic_gbps": 10,
        }
    )


def check_plan(plan: PipelinePlan, cluster: Cluster, slo_ms: float, margin: float) -> None:
    """Every pipeline meets the SLO with the margin and the plan fits in the cluster."""
    assert plan.status == "optimal" and plan.gap is not None and plan.gap <= 1e-4
    used: dict[tuple[int, str], float] = {}
    for pipe in plan.pipelines:
        assert pipe.latency_ms + margin * slo_ms <= slo_ms + 1e-9
        parts = pipe.partitions
        assert parts[0].blocks[0] == 0 and parts[-1].blocks[1] == 10
        assert all(a.blocks[1] == b.blocks[0] < b.blocks[1] for a, b in itertools.pairwise(parts))
        for d, part in enumerate(parts):
            assert part.workers * part.worker_rate_rps >= pipe.throughput_rps - 1e-6
            used[(d, part.gpu)] = used.get((d, part.gpu), 0.0) + part.gpus_used
    for gpu, pool in cluster.gpus.items():
        whole = sum(-int(-round(v, 9) // 1) for (_, g), v in used.items() if g == gpu)
        assert whole <= pool.count


def test_np_never_beats_ppipe_on_repvgg_b3(repvgg: ModelProfiles) -> None:
    cluster = small_cluster()
    slo_ms = 5 * repvgg.partition_latency_ms("L4", 1, 0, 10, 1)  # PPipe 7.1: 5x L4 at batch 1
    np_plan = plan_pipelines(repvgg, cluster, slo_ms, 0.4, system="np")
    ppipe = plan_pipelines(repvgg, cluster, slo_ms, 0.4, max_parts=3, max_mps=2)
    check_plan(np_plan, cluster, slo_ms, 0.4)
    check_plan(ppipe, cluster, slo_ms, 0.4)
    # NP: T4 alone needs 51.8 ms at batch 1 > 0.6 x 49.0 ms, so only the 4 L4 serve.
    assert [p.gpus for p in np_plan.pipelines] == [("L4",)]
    assert np_plan.throughput_rps <= ppipe.throughput_rps
    # The T4s join through partitions: 646.10 against 501.53 rps (+28.8%), both proved optimal.
    assert np_plan.throughput_rps == pytest.approx(501.5254733, rel=1e-4)
    assert ppipe.throughput_rps == pytest.approx(646.0977831, rel=1e-4)
    assert any(len(p.gpus) > 1 for p in ppipe.pipelines)


def test_infeasible_slo_names_the_smallest_workable_one(repvgg: ModelProfiles) -> None:
    cluster = small_cluster()
    with pytest.raises(InputError) as caught:
        plan_pipelines(repvgg, cluster, 5.0, 0.1, system="np")
    message = str(caught.value)
    assert "\n" not in message and "slo_ms" in message
    whole_l4_ms = repvgg.partition_latency_ms("L4", 1, 0, 10, 1)
    assert f"at least {whole_l4_ms / 0.9:.3f} ms" in message
    plan = plan_pipelines(repvgg, cluster, whole_l4_ms / 0.9 + 1e-6, 0.1, system="np")
    assert plan.throughput_rps > 0
    empty = Cluster.from_json({"gpus": {"L4": {"count": 0, "per_server": 4}}, "nic_gbps": 10})
    with pytest.raises(InputError, match=r"cluster: gpus: expected at least one GPU \(every"):
        plan_pipelines(repvgg, empty, 50.0, 0.1)


def test_unknown_gpu_model_and_bad_inputs_say_which(repvgg: ModelProfiles, tmp_path: Path) -> None:
    h100 = Cluster.from_json({"gpus": {"H100": {"count": 2, "per_server": 8}}, "nic_gbps": 10})
    with pytest.raises(InputError, match="H100"):
        plan_pipelines(repvgg, h100, 50.0, 0.1)
    with pytest.raises(InputError, match=r"one of .*repvgg-b3"):
        load_model_profiles(BUNDLED, "resnet9000")
    with pytest.raises(InputError, match="on GPU type H100"):
        load_model_profiles(BUNDLED, "repvgg-b3", gpus=["H100"])
    with pytest.raises(InputError, match="transfer sizes of model repvgg-b3"):
        load_model_profiles(BUNDLED, "repvgg-b3", transfer_dir=tmp_path)
    with pytest.raises(InputError, match="margin"):
        plan_pipelines(repvgg, small_cluster(), 50.0, 1.0)
    with pytest.raises(InputError, match="nic_gbps"):
        Cluster.from_json({"gpus": {"L4": {"count": 1}}, "nic_gbps": 0})
    with pytest.raises(InputError, match="nic_gbps"):
        Cluster.from_json({"gpus": {"L4": {"count": 1}}, "nic_gbps": float("inf")})
    misspelt = {"gpus": {"L4": {"count": 4, "per_sever": 2}}, "nic_gbps": 10}
    with pytest.raises(InputError, match=r"gpus\.L4\.per_sever: .*did you mean per_server\?"):
        Cluster.from_json(misspelt)
    with pytest.raises(InputError, match=r"nic: expected only the keys gpus, nic_gbps"):
        Cluster.from_json({"gpus": {"L4": {"count": 1}}, "nic": 10})


def test_same_input_same_plan_and_the_clock_is_the_callers(repvgg: ModelProfiles) -> None:
    cluster = small_cluster()
    first = plan_pipelines(repvgg, cluster, 40.0, 0.2, max_parts=2, max_mps=2)
    second = plan_pipelines(repvgg, cluster, 40.0, 0.2, max_parts=2, max_mps=2)
    assert first == second and first.solve_s is None
    ticks = iter([10.0, 12.5])
    timed = solve(repvgg, cluster, 40.0, 0.2, 2, 2, clock=lambda: next(ticks))
    assert timed.solve_s == 2.5
    assert timed.to_json() == {**first.to_json(), "solve_s": 2.5}


def test_profiles_read_the_ppipe_repository_layout(tmp_path: Path) -> None:
    timing = tmp_path / "block-timing-tf32"
    timing.mkdir()
    write_tables(
        timing, {"A-1": [[1000, 1800], [500, 900]], "A-4": [[3000, 5000], [1500, 2600]]}, []
    )
    (tmp_path / "transfer-sizes").mkdir()
    (tmp_path / "transfer-sizes" / "toy.csv").write_text("4096\n")
    profiles = load_model_profiles(tmp_path, "toy", max_mps=2)
    assert profiles.gpus() == ("A",) and profiles.mps_levels("A") == (1,)
    assert profiles.cut_bytes == (4096,) and profiles.max_batch("A", 1) == 2
    assert profiles.partition_latency_ms("A", 1, 0, 2, 2) == pytest.approx(2.7)
    assert load_model_profiles(tmp_path, "toy").mps_levels("A") == (1, 4)
    (timing / "toy-B-1.csv").write_text("1000\nfast\n")
    with pytest.raises(InputError, match="row 2: expected comma-separated microseconds"):
        load_model_profiles(tmp_path, "toy")
    (timing / "toy-B-1.csv").write_text("1000\n")
    with pytest.raises(InputError, match="toy-B-1: rows: expected 2 blocks"):
        load_model_profiles(tmp_path, "toy")

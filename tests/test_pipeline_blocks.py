"""PPipe 5.2 pre-partitioning of layerbatch.profile/1 files into N equal-time blocks."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scheduler.errors import InputError
from scheduler.pipeline.blocks import (
    equal_time_bounds,
    group_blocks,
    load_block_models,
    load_block_profiles,
)
from scheduler.pipeline.milp import Cluster, plan_pipelines
from scheduler.profile import load_profile, parse_profile

SHIPPED = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles"


def block_times(times: list[float], bounds: tuple[int, ...]) -> list[float]:
    return [sum(times[a:b]) for a, b in itertools.pairwise(bounds)]


def test_hand_instance_least_worst_block_then_least_squares() -> None:
    # Total 12, 3 blocks, mean 4. [1, 3 | 2, 2 | 4] is exact; so the answer has no deviation.
    assert equal_time_bounds([1, 3, 2, 2, 4], 3) == (0, 2, 4, 5)
    # Total 10, 2 blocks, mean 5: [6 | 1, 3] deviates 1 and [6, 1 | 3] 2: the first wins.
    assert equal_time_bounds([6, 1, 3], 2) == (0, 1, 3)
    # One heavy layer: [9 | 1 | 1 | 1], mean 3; every other grouping has a block of >= 10.
    assert equal_time_bounds([9, 1, 1, 1], 4) == (0, 1, 2, 3, 4)
    assert equal_time_bounds([2.0, 2.0], 1) == (0, 2)


@pytest.mark.parametrize("seed", range(40))
def test_blocks_are_within_the_largest_layer_of_equal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    times = list(rng.lognormal(0.0, float(rng.uniform(0.1, 2.0)), n))
    if seed % 5 == 0:
        times[int(rng.integers(0, n))] = 0.0  # free layers are allowed
    blocks = int(rng.integers(1, n + 1))
    bounds = equal_time_bounds(times, blocks)
    assert len(bounds) == blocks + 1 and bounds[0] == 0 and bounds[-1] == n
    assert all(a < b for a, b in itertools.pairwise(bounds))
    mean = sum(times) / blocks
    for t in block_times(times, bounds):
        assert abs(t - mean) <= max(times) + 1e-9


@pytest.mark.parametrize("name", sorted(p.stem for p in SHIPPED.glob("*-cpu.json")))
def test_shipped_cpu_profiles_into_five_blocks(name: str) -> None:
    grouping = load_block_profiles([SHIPPED / f"{name}.json"], 5)
    prof = load_profile(SHIPPED / f"{name}.json")
    times = [prof.latency_ms(k, 1) for k in range(prof.num_stages)]
    mean = sum(times) / 5
    assert len(grouping.block_ms) == 5
    assert all(abs(t - mean) <= max(times) + 1e-9 for t in grouping.block_ms)
    model = grouping.profiles
    assert model.gpus() == ("cpu",) and model.mps_levels("cpu") == (1,)
    assert model.max_batch("cpu", 1) == prof.max_batch
    # The block table is the sum of its stages' interpolated latencies, in microseconds.
    a, b = grouping.stage_bounds[1], grouping.stage_bounds[2]
    expect_us = sum(prof.latency_ms(k, 3) for k in range(a, b)) * 1000
    assert model.latency_us[("cpu", 1)][1][2] == pytest.approx(expect_us)
    # Cut j is the output of block j's last stage (the CPU profiles measure out_bytes).
    assert model.cut_bytes == tuple(
        prof.stages[end - 1].out_bytes for end in grouping.stage_bounds[1:-1]
    )
    assert grouping.unmeasured_cuts == ()


def test_two_gpu_files_share_the_reference_cuts_and_plan() -> None:
    files = [SHIPPED / "repvgg-b3-V100.json", SHIPPED / "repvgg-b3-T4.json"]
    grouping = load_block_profiles(files, 5)
    v100 = load_profile(files[0])
    assert grouping.profiles.gpus() == ("T4", "V100")
    # V100 batch-1 stage times (ms): .888 1.399 2.169 .901 .895 .895 .903 .895 .895 1.556;
    # mean of 5 blocks 2.279: [.888 1.399 | 2.169 | .901 .895 .895 | .903 .895 | .895 1.556],
    # worst deviation .481 (1.798 ms); moving a .9 ms stage anywhere makes a block worse.
    assert grouping.stage_bounds == (0, 2, 3, 6, 8, 10)
    assert grouping.block_ms == pytest.approx((2.287, 2.169, 2.691, 1.798, 2.451), abs=1e-3)
    assert grouping.profiles.cut_bytes == tuple(
        v100.stages[end - 1].out_bytes for end in (2, 3, 6, 8)
    )
    cluster = Cluster.from_json(
        {
            "gpus": {"V100": {"count": 2, "per_server": 2}, "T4": {"count": 4, "per_server": 2}},
            "nic_gbps": 10,
        }
    )
    plan = plan_pipelines(grouping.profiles, cluster, 60.0, 0.4, max_parts=2, max_mps=1)
    assert plan.status == "optimal" and plan.throughput_rps > 0
    assert all(p.partitions[-1].blocks[1] == 5 for p in plan.pipelines)


def test_unmeasured_cut_sizes_are_estimated_or_zero(tmp_path: Path) -> None:
    doc = {
        "format": "layerbatch.profile/1",
        "model": "m",
        "device": "X-1",
        "input": {"shape": [3, 8, 8], "dtype": "float32"},
        "batch_sizes": [1, 2],
        "max_batch": 2,
        "stages": [
            {"name": "a", "latency_ms": [1.0, 1.5], "out_shape": [4, 2, 2], "out_bytes": 0},
            {"name": "b", "latency_ms": [1.0, 1.5], "out_shape": None, "out_bytes": 0},
            {"name": "c", "latency_ms": [1.0, 1.5], "out_shape": None, "out_bytes": 7},
            {"name": "d", "latency_ms": [1.0, 1.5], "out_shape": None, "out_bytes": 0},
        ],
    }
    grouping = group_blocks([("X", parse_profile(doc))], 4)
    # a: 16 float32 values = 64 bytes (estimated); b: unknown -> 0 and listed; c: measured.
    assert grouping.profiles.cut_bytes == (64, 0, 7)
    assert grouping.unmeasured_cuts == (1,)
    assert grouping.profiles.latency_us[("X", 1)][0] == (1000.0, 1500.0)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    (renamed,) = load_block_models([f"Y={path}"], 2)
    assert renamed.profiles.gpus() == ("Y",) and renamed.stage_bounds == (0, 2, 4)


def test_refusals_name_the_problem() -> None:
    cpu = SHIPPED / "resnet18-cpu.json"
    with pytest.raises(InputError, match="between 1 and the 10 stages"):
        load_block_profiles([cpu], 11)
    with pytest.raises(InputError, match="profiles of one model"):
        group_blocks([("A", load_profile(cpu)), ("B", load_profile(SHIPPED / "vgg16-cpu.json"))], 2)
    with pytest.raises(InputError, match="one profile per GPU type"):
        load_block_profiles([cpu, cpu], 2)
    v100 = load_profile(SHIPPED / "repvgg-b3-V100.json")
    with pytest.raises(InputError, match="10 stages like V100"):
        group_blocks(
            [
                ("V100", v100),
                ("X", replace(v100, stages=v100.stages[:5])),
            ],
            2,
        )

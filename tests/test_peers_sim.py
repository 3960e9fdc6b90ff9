"""bench/peers_sim.py (issue 9): the policies in the simulator under bench/peers.py's own arrivals."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from bench.peers_arrivals import AZURE_TRACE, arrivals_for
from bench.peers_crossing import THRESHOLD
from bench.peers_sim import (
    DECODE_MS,
    START,
    STEP,
    admission_share,
    deployment,
    gain,
    main,
    profile_bound_rps,
    results,
    sweep,
    workload,
)
from scheduler import make_policy
from server.build import BUNDLED_PROFILES, profile_path
from sim.metrics import summarise
from sim.simulator import simulate
from traces.arrivals import load_timestamps


@pytest.fixture(scope="module")
def trace() -> np.ndarray:
    return load_timestamps(AZURE_TRACE)


def test_the_workload_is_exactly_what_the_benchmark_sends(trace: np.ndarray) -> None:
    for arrival in ("poisson", "azure"):
        w = workload("resnet18", arrival, 12.0, 300.0, 150, 1, trace)
        sent = arrivals_for(arrival, 12.0, 150 / 12.0, 1, trace, 150) * 1000.0
        assert np.allclose(w.arrival_ms, sent)
        assert set(w.apps) == {"resnet18"} and w.deadline_ms == 300.0


def test_each_request_pays_its_decode_on_the_device_before_the_next_step(
    trace: np.ndarray,
) -> None:
    d = deployment("resnet18", 8)
    assert d.batch_limit("resnet18") == 8
    assert 1000.0 / profile_bound_rps(d, 2.0) == pytest.approx(
        1000.0 / profile_bound_rps(d, 0.0) + 2.0
    )
    on_time = sweep(d, "resnet18", "azure", 300.0, 100, 1, trace, ("dp-tardy",), max_rates=3)
    rate = START["azure"] * profile_bound_rps(d, DECODE_MS)  # the sweep's first rate
    w = workload("resnet18", "azure", rate, 300.0, 100, 1, trace)
    run = simulate(d, make_policy("dp-tardy"), w, admission_share=2 / 3, decode_ms=DECODE_MS)
    assert on_time["dp-tardy"][round(rate, 2)] == summarise(run)["on_time_ratio"]


def test_the_sweep_grows_the_rate_until_every_policy_misses_twice(trace: np.ndarray) -> None:
    d = deployment("resnet18", 8)
    on_time = sweep(d, "resnet18", "azure", 300.0, 100, 1, trace, ("dp-tardy", "dynamic"))
    rates = sorted(on_time["dp-tardy"])
    assert rates == sorted(on_time["dynamic"])
    assert all(b / a == pytest.approx(STEP, rel=0.01) for a, b in itertools.pairwise(rates))
    below = [all(on_time[p][r] < THRESHOLD for p in on_time) for r in rates]
    assert below[-2:] == [True, True] and not any(
        a and b for a, b in itertools.pairwise(below[:-1])
    )
    assert on_time["dp-tardy"][rates[0]] == 1.0  # the first rate is far below capacity


def test_rows_and_gain_compare_dp_tardy_with_the_best_other_policy() -> None:
    on_time = {
        "dp-tardy": {10.0: 1.0, 11.0: 0.95, 12.1: 0.85},
        "dynamic": {10.0: 0.95, 11.0: 0.85, 12.1: 0.5},
        "tfs": {10.0: 0.8, 11.0: 0.7, 12.1: 0.6},
    }
    rows = {r["server"]: r for r in results("googlenet", "azure", 300.0, on_time)}
    assert rows["dp-tardy"]["crossing_rps"] == pytest.approx(11.5, abs=0.06)
    assert rows["dynamic"]["crossing_rps"] == pytest.approx(10.5, abs=0.06)
    assert rows["tfs"]["capacity_rps"] == 0.0 and rows["tfs"]["crossing_rps"] is None
    assert rows["dp-tardy"]["arrival"] == "azure, simulated"
    assert gain(list(rows.values())) == pytest.approx(11.5 / 10.5, abs=0.01)


def test_only_dp_tardy_keeps_the_servers_door(trace: np.ndarray) -> None:
    d = deployment("resnet18", 8)
    policies = ("dp-tardy", "dynamic")
    door = sweep(d, "resnet18", "azure", 300.0, 100, 1, trace, policies, admission_share=2 / 3)
    open_ = sweep(d, "resnet18", "azure", 300.0, 100, 1, trace, policies, admission_share=None)
    common = door["dynamic"].keys() & open_["dynamic"].keys()  # the sweeps stop on dp-tardy too
    assert len(common) > 10
    for rate in common:  # the peers' batchers turn nobody away
        assert door["dynamic"][rate] == open_["dynamic"][rate]
    turned_away = 0
    rate = START["azure"] * profile_bound_rps(d, DECODE_MS)  # the sweep's rates, unrounded
    for key, on_time in door["dp-tardy"].items():
        assert key == round(rate, 2)
        w = workload("resnet18", "azure", rate, 300.0, 100, 1, trace)
        run = summarise(
            simulate(d, make_policy("dp-tardy"), w, admission_share=2 / 3, decode_ms=DECODE_MS)
        )
        assert on_time == run["on_time_ratio"]
        turned_away += run["turned_away"]
        rate *= STEP
    assert turned_away > 0  # past capacity the door turned requests away


def test_admission_share_takes_off_or_a_share_of_the_deadline() -> None:
    assert admission_share("off") is None
    assert admission_share("1") == 1.0 and admission_share("0.5") == 0.5
    for bad in ("0", "1.5", "-0.2", "nan", "half"):
        with pytest.raises(argparse.ArgumentTypeError, match="off or a share"):
            admission_share(bad)


def test_replicas_and_a_time_scale_give_the_servers_shape(trace: np.ndarray) -> None:
    one, slow = deployment("resnet18", 8), deployment("resnet18", 8, 1.8)
    assert 1000.0 / profile_bound_rps(slow, 0.0) == pytest.approx(
        1.8 * 1000.0 / profile_bound_rps(one, 0.0)
    )
    on_time = sweep(slow, "resnet18", "azure", 300.0, 100, 1, trace, ("dp-tardy",), 2, replicas=2)
    rate = START["azure"] * 2 * profile_bound_rps(slow, DECODE_MS)  # the sweep's first rate
    w = workload("resnet18", "azure", rate, 300.0, 100, 1, trace)
    run = simulate(
        slow, make_policy("dp-tardy"), w, admission_share=2 / 3, decode_ms=DECODE_MS, replicas=2
    )
    assert on_time["dp-tardy"][round(rate, 2)] == summarise(run)["on_time_ratio"]


def test_profiles_come_from_the_folder_given(tmp_path: Path) -> None:
    shipped = json.loads(profile_path(BUNDLED_PROFILES, "resnet18").read_text())
    for stage in shipped["stages"]:
        stage["latency_ms"] = [2.0 * ms for ms in stage["latency_ms"]]
    profile_path(tmp_path, "resnet18").write_text(json.dumps(shipped))
    mine, theirs = deployment("resnet18", 8, profiles=tmp_path), deployment("resnet18", 8)
    assert 1000.0 / profile_bound_rps(mine, 0.0) == pytest.approx(
        2.0 * 1000.0 / profile_bound_rps(theirs, 0.0)
    )
    with pytest.raises(SystemExit, match=r"googlenet-cpu\.json is missing"):
        main(["--profiles", str(tmp_path), "--models", "resnet18,googlenet"])


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--replicas", "0", "--replicas: expected at least 1 device, got 0"),
        ("--time-scale", "0", "--time-scale: expected a positive factor, got 0"),
        ("--overrun", "nan", "--overrun: expected a positive factor, got nan"),
        ("--decode-ms", "-1", "--decode-ms: expected a time of at least 0 ms, got -1"),
    ],
)
def test_bad_flags_are_named(flag: str, value: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        main([flag, value])

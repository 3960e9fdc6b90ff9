"""bench/peers_crossing.py: a server's crossing of the on-time threshold, layerbatch's over the
best peer's with its bootstrap interval over rounds; and `bench/peers.py --report`, which pools
saved --interleave runs of one cell and reports them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.peers_arrivals import AZURE_TRACE, ROOT, trace_arrivals_s
from bench.peers_crossing import (
    capacity_rules,
    edge_crossing,
    highest_on_time,
    monotone_means,
    ratio_interval,
)
from bench.peers_ideal import equivalent_ceiling_rps, ideal_crossing_rps
from bench.peers_report import interleaved_results, pool_interleaved, pooled_support
from traces.arrivals import load_timestamps


def test_edge_crossing_interpolates_or_names_the_edge_it_lies_beyond() -> None:
    assert edge_crossing({10.0: 1.0, 20.0: 0.8}) == (15.0, "")
    assert edge_crossing({10.0: 1.0, 20.0: 0.95}) == (20.0, "above")  # never under: 20 or later
    assert edge_crossing({10.0: 0.5, 20.0: 0.95}) == (10.0, "below")  # under at once: 10 or before


def test_the_monotone_fit_merges_a_dip_with_the_higher_mean_after_it() -> None:
    # 20 req/s reads 0.8 in one disturbed round of two; 30 reads higher: the two pool, weighted
    got = monotone_means({10.0: [1.0, 1.0], 20.0: [0.8, 0.98], 30.0: [0.95], 40.0: [0.5]})
    assert got[10.0] == 1.0 and got[40.0] == 0.5
    assert got[20.0] == got[30.0] == pytest.approx((0.8 + 0.98 + 0.95) / 3)
    assert list(got.values()) == sorted(got.values(), reverse=True)
    # means already in order are left alone, and a rate without rounds is left out
    assert monotone_means({10.0: [0.99], 20.0: [0.7], 30.0: []}) == {10.0: 0.99, 20.0: 0.7}


def test_a_dip_ends_the_first_crossing_but_not_the_highest_rate_or_the_monotone_fit() -> None:
    rounds = {
        "layerbatch": {26.0: [1.0, 1.0], 30.0: [0.8, 0.96], 34.0: [0.95, 0.93], 38.0: [0.6, 0.6]},
        "triton": {26.0: [0.97, 0.97], 30.0: [0.8, 0.8], 34.0: [0.5, 0.5], 38.0: [0.2, 0.2]},
    }
    read = capacity_rules(rounds)
    first, highest, fit = (
        read[r] for r in ("first crossing", "highest rate on time", "monotone fit")
    )
    assert {r.best_peer for r in read.values()} == {"triton"}
    assert first.ours == (29.3, "")  # 0.88 at 30: under 0.9 there already
    assert highest.ours == (34.0, "") and highest.peer == (26.0, "")
    assert fit.ours[0] == pytest.approx(34.0 + 4.0 * (0.91 - 0.9) / (0.91 - 0.6), abs=0.05)
    assert fit.peer == first.peer == (27.6, "")  # triton's means are in order: the rules agree
    assert fit.ratio == pytest.approx(fit.ours[0] / 27.6)
    assert capacity_rules({"layerbatch": rounds["layerbatch"]}) == {}  # no peer to compare


def test_the_highest_rate_on_time_names_the_edge_it_lies_beyond() -> None:
    assert highest_on_time({10.0: 0.95, 20.0: 0.5, 30.0: 0.92}) == (30.0, "above")
    assert highest_on_time({10.0: 0.5, 20.0: 0.8}) == (10.0, "below")
    assert highest_on_time({10.0: 0.95, 20.0: 0.5}) == (10.0, "")


def test_rounds_that_agree_give_an_interval_of_one_point() -> None:
    rounds = {
        "layerbatch": {10.0: [1.0, 1.0], 20.0: [0.8, 0.8]},  # crosses at 15
        "triton": {10.0: [0.95, 0.95], 20.0: [0.5, 0.5]},  # at 11.1
        "ray": {10.0: [0.2, 0.2], 20.0: [0.1, 0.1]},  # under at once: counted at 10
    }
    got = ratio_interval(rounds, np.random.default_rng(0), draws=200)
    assert got is not None
    assert got.ratio == pytest.approx(15.0 / 11.1)  # crossings to 0.1 req/s
    assert got.low == pytest.approx(got.ratio) and got.high == pytest.approx(got.ratio)
    assert got.bound == ""  # the best peer's crossing was measured; ray's edge does not count


def test_rounds_that_spread_widen_the_interval_around_the_point() -> None:
    rng = np.random.default_rng(3)
    rounds = {
        "layerbatch": {10.0: [1.0, 0.98, 1.0], 20.0: [0.95, 0.6, 0.85], 30.0: [0.4, 0.7, 0.5]},
        "torchserve": {10.0: [0.99, 0.7, 0.95], 20.0: [0.9, 0.3, 0.8], 30.0: [0.1, 0.2, 0.3]},
    }
    got = ratio_interval(rounds, rng, draws=500)
    assert got is not None
    assert got.low < got.ratio < got.high
    again = ratio_interval(rounds, np.random.default_rng(3), draws=500)
    assert again == got  # the generator passed in decides every draw
    narrow = ratio_interval(rounds, np.random.default_rng(3), draws=500, level=0.5)
    assert narrow is not None and got.low <= narrow.low <= narrow.high <= got.high
    assert "90% of 500 resamplings" in got.text()


def test_a_crossing_beyond_the_rates_makes_the_ratio_a_bound_in_its_direction() -> None:
    rng = np.random.default_rng(0)
    never_under = {10.0: [1.0], 20.0: [0.95]}  # 20 or later
    crosses_15 = {10.0: [1.0], 20.0: [0.8]}
    under_at_once = {10.0: [0.5], 20.0: [0.2]}  # 10 or before
    cases = [
        ({"layerbatch": never_under, "triton": crosses_15}, "at least", 20 / 15),
        ({"layerbatch": crosses_15, "triton": under_at_once}, "at least", 15 / 10),
        ({"layerbatch": under_at_once, "triton": crosses_15}, "at most", 10 / 15),
        ({"layerbatch": crosses_15, "triton": never_under}, "at most", 15 / 20),
        ({"layerbatch": never_under, "triton": never_under}, "beyond the rates both ways", 1.0),
    ]
    for rounds, bound, ratio in cases:
        got = ratio_interval(rounds, rng, draws=20)
        assert got is not None and got.bound == bound and got.ratio == pytest.approx(ratio)
    assert got.text().startswith("1.00x") and got.text().endswith("both ways")
    tie = {"layerbatch": crosses_15, "ray": under_at_once, "triton": {10.0: [0.9], 20.0: [0.5]}}
    got = ratio_interval(tie, rng, draws=20)  # triton crosses at 10 exactly, ray at 10 or before
    assert got is not None and got.bound == "" and got.ratio == pytest.approx(1.5)
    assert ratio_interval({"layerbatch": crosses_15}, rng) is None  # no peer
    assert ratio_interval({"triton": crosses_15, "ray": crosses_15}, rng) is None  # no layerbatch


def _doc(rounds: dict[str, dict[str, list[float]]], **extra: Any) -> dict[str, Any]:
    """An --interleave document with these on-time ratios by server, rate and round."""
    runs = {
        s: {r: [{"on_time_ratio": v} for v in vs] for r, vs in per.items()}
        for s, per in rounds.items()
    }
    return {
        "model": "resnet18",
        "deadline_ms": 300.0,
        "arrival": "azure",
        "rounds": max(len(vs) for per in rounds.values() for vs in per.values()),
        "knobs": {"layerbatch": "default", "torchserve": "B=8,20ms"},
        "runs": runs,
        "mean_on_time": {
            s: {r: float(np.mean(vs)) for r, vs in per.items()} for s, per in rounds.items()
        },
        "compute_bound": {"rps": 30.0, "batched_rps": 45.0, "speed_change": 1.0},
        **extra,
    }


def test_pooling_keeps_every_round_of_every_rate_and_refuses_another_cell() -> None:
    a = _doc({"layerbatch": {"5": [1.0, 0.9]}, "torchserve": {"5": [0.8, 0.6]}})
    b = _doc({"layerbatch": {"5": [0.7], "7": [0.8]}, "torchserve": {"5": [0.5], "7": [0.2]}})
    b["compute_bound"] = {"rps": 34.0, "batched_rps": 47.0, "speed_change": 1.0}
    pooled = pool_interleaved([a, b], ["a.json", "b.json"])
    assert [x["on_time_ratio"] for x in pooled["runs"]["layerbatch"]["5"]] == [1.0, 0.9, 0.7]
    assert pooled["mean_on_time"]["torchserve"] == {"5": pytest.approx(0.6333, abs=1e-4), "7": 0.2}
    assert pooled["compute_bound"]["rps"] == 32.0 and pooled["compute_bound"]["batched_rps"] == 46.0
    assert pooled["rounds"] == "2/1" and pooled["pooled_runs"] == 2
    assert interleaved_results(pooled)[0]["arrival"] == "azure, 2 runs pooled"
    assert pool_interleaved([a], ["a.json"]) == a
    other = _doc({"layerbatch": {"5": [1.0]}}, deadline_ms=1000.0)
    with pytest.raises(ValueError, match=r"b\.json: measured resnet18 at 1000 ms under azure"):
        pool_interleaved([a, other], ["a.json", "b.json"])


def test_pooled_report_names_the_runs_a_pooled_crossing_rests_on() -> None:
    """A run whose rates all lie above a server's crossing says only "below its lowest rate":
    the pooled curve there is the other runs' alone, and the report says so."""
    low = _doc({"layerbatch": {"80": [1.0], "90": [1.0], "100": [0.95], "110": [0.8]},
                "torchserve": {"80": [1.0], "90": [0.8], "100": [0.5], "110": [0.1]}})  # fmt: skip
    high = _doc({"layerbatch": {"100": [0.95], "110": [0.85], "120": [0.7]},
                 "torchserve": {"100": [0.6], "110": [0.2], "120": [0.1]}})  # fmt: skip
    pooled = pool_interleaved([low, high], ["low.json", "high.json"])
    lines = pooled_support([low, high], pooled)
    assert lines[0] == "layerbatch, each run alone: 103.3, 105"
    assert "layerbatch's pooled" not in " ".join(lines)
    assert lines[1] == "torchserve, each run alone: 85, below 100"
    assert lines[2] == (
        "warning: torchserve's pooled crossing (85 req/s) lies outside the rates of 1 of 2 runs; "
        "there it rests on the other 1"
    )


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--report", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def _trace_arrivals(rate: float) -> np.ndarray:
    """A saved run's arrivals at `rate` (a run that stored no `load` used a full run's)."""
    return trace_arrivals_s(load_timestamps(AZURE_TRACE), rate, 200)


def test_report_pools_saved_runs_and_prints_the_ratio_with_its_interval(tmp_path: Path) -> None:
    a = _doc(
        {
            "layerbatch": {"4": [1.0, 0.95], "8": [0.85, 0.75]},
            "torchserve": {"4": [0.9, 0.8], "8": [0.3, 0.5]},
        }
    )
    b = _doc({"layerbatch": {"6": [0.95, 0.9]}, "torchserve": {"6": [0.6, 0.7]}})
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, doc in zip(paths, (a, b), strict=True):
        path.write_text(json.dumps(doc))
    out = tmp_path / "pooled.json"
    done = _report(",".join(str(p) for p in paths), "--out", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "resnet18, 300 ms, azure: a.json, b.json"
    assert "     6       0.925       0.650" in lines  # b's rate between a's
    assert "layerbatch: crosses 0.9 at 6.4 req/s" in lines  # between 6 (0.925) and 8 (0.8)
    assert "torchserve: crosses 0.9 at below 4 req/s" in lines  # 0.85 at 4 already
    ratio = next(line for line in lines if line.startswith("layerbatch / best peer:"))
    assert "resamplings of the rounds" in ratio
    # the highest rate on time is 6 (0.925), the monotone fit's crossing the means' (all in order)
    assert (
        "layerbatch / best peer by the other rules (bench/peers_crossing.py): "
        "highest rate on time 1.50x, monotone fit 1.60x"
    ) in lines
    assert out.with_suffix(".png").stat().st_size > 0
    assert not any("ceilings differ" in line for line in lines)  # 45 req/s both
    # the ideal server at the pooled ceiling (45 req/s), under the same trace arrivals
    ideal = ideal_crossing_rps(_trace_arrivals, 300.0, 45.0)
    line = next(line for line in lines if line.startswith("an ideal server at the ceiling"))
    assert f"crosses 0.9 at {ideal:.1f} req/s" in line
    layerbatch = equivalent_ceiling_rps(_trace_arrivals, 300.0, 6.4)
    assert f"layerbatch {layerbatch:.1f} ({layerbatch / 45:.2f} of the ceiling)" in line
    # under 0.9 already at the lowest rate: it crosses there or earlier, so the ceiling is a bound
    torchserve = equivalent_ceiling_rps(_trace_arrivals, 300.0, 4.0)
    assert f"torchserve at most {torchserve:.1f} ({torchserve / 45:.2f} of the ceiling)" in line

    b["compute_bound"] = {"rps": 30.0, "batched_rps": 60.0, "speed_change": 1.0}
    paths[1].write_text(json.dumps(b))
    done = _report(",".join(str(p) for p in paths), "--out", str(out))
    assert "warning: these runs' batched ceilings differ (45.0 to 60.0 req/s)" in done.stdout


def test_report_bounds_the_equivalent_ceiling_of_a_server_that_never_falls_under(
    tmp_path: Path,
) -> None:
    doc = _doc({"layerbatch": {"4": [1.0], "8": [0.95]}, "torchserve": {"4": [0.95], "8": [0.5]}})
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    done = _report(str(path), "--out", str(tmp_path / "pooled.json"))
    assert done.returncode == 0, done.stderr
    assert "layerbatch: crosses 0.9 at 8 or more req/s" in done.stdout
    at_top = equivalent_ceiling_rps(_trace_arrivals, 300.0, 8.0)
    assert f"layerbatch at least {at_top:.1f} ({at_top / 45:.2f} of the ceiling)" in done.stdout


def test_report_names_a_file_that_is_not_an_interleaved_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"table": []}))
    done = _report(str(bad))
    assert done.returncode != 0
    assert f"--report: {bad}: expected an --interleave JSON file" in done.stderr
    done = _report(str(tmp_path / "missing.json"))
    assert (
        done.returncode != 0 and "missing.json: expected an --interleave JSON file" in done.stderr
    )


def test_report_says_when_an_ideal_server_never_falls_under(tmp_path: Path) -> None:
    # 200 trace arrivals within 1000 ms: at a ceiling of 300 req/s an ideal server serves them
    # all on time however fast they come, so it has no crossing to compare a target with
    doc = _doc(
        {"layerbatch": {"250": [1.0], "650": [1.0]}, "torchserve": {"250": [0.95], "650": [0.8]}},
        deadline_ms=1000.0,
    )
    doc["compute_bound"] = {"rps": 100.0, "batched_rps": 300.0, "speed_change": 1.0}
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    done = _report(str(path), "--out", str(tmp_path / "pooled.json"))
    assert done.returncode == 0, done.stderr
    assert math.isinf(ideal_crossing_rps(_trace_arrivals, 1000.0, 300.0))
    assert (
        "an ideal server at the ceiling (bench/peers_ideal.py) stays at 0.9 or more at every rate"
        in done.stdout
    )
    target = next(line for line in done.stdout.splitlines() if line.startswith("1.3x the best"))
    assert "of the ceiling" in target and "ideal" not in target

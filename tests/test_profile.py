"""Profiles: the latency model, the shipped GPU profiles, bad profile files, layer groups."""

from __future__ import annotations

import copy
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.deployment import Deployment, groups_by_duration
from scheduler.errors import InputError
from scheduler.profile import load_profile, parse_profile, scaled, scaled_stages, with_entry_cost
from tests.sim_cases import PPIPE_TIMING, SHIPPED_PROFILES, profile_doc, write_json

# the GPU profiles converted from PPipe (the *-cpu.json ones are measured: tests/test_layerexec_misc.py)
SHIPPED = sorted(p for p in SHIPPED_PROFILES.glob("*.json") if not p.stem.endswith("-cpu"))


# --- the latency model (module docstring of scheduler/profile.py) -------------------------------
@pytest.fixture
def measured() -> Any:
    # One stage measured at batch 2, 4 and 8; B = 12.
    return parse_profile(profile_doc([[4.0, 6.0, 12.0]], batch_sizes=(2, 4, 8), max_batch=12))


def test_zero_batch_costs_nothing(measured: Any) -> None:
    assert measured.latency_ms(0, 0) == 0.0


def test_measured_sizes_are_returned_as_measured(measured: Any) -> None:
    assert [measured.latency_ms(0, b) for b in (2, 4, 8)] == [4.0, 6.0, 12.0]


def test_between_measured_sizes_is_linear(measured: Any) -> None:
    assert measured.latency_ms(0, 3) == pytest.approx(5.0)
    assert measured.latency_ms(0, 5) == pytest.approx(7.5)
    assert measured.latency_ms(0, 6) == pytest.approx(9.0)
    assert measured.latency_ms(0, 7) == pytest.approx(10.5)


def test_below_the_smallest_size_is_linear_from_the_origin(measured: Any) -> None:
    # between (0, 0) and (2, 4)
    assert measured.latency_ms(0, 1) == pytest.approx(2.0)


def test_above_the_largest_size_extrapolates_the_last_two_points_up_to_max_batch(
    measured: Any,
) -> None:
    # slope of (4, 6) -> (8, 12) is 1.5 ms per request
    assert measured.latency_ms(0, 9) == pytest.approx(13.5)
    assert measured.latency_ms(0, 10) == pytest.approx(15.0)
    assert measured.latency_ms(0, 12) == pytest.approx(18.0)


def test_above_max_batch_is_infinite(measured: Any) -> None:
    assert measured.latency_ms(0, 13) == math.inf
    assert measured.latency_ms(0, 100) == math.inf


def test_extrapolation_never_goes_below_the_last_measured_latency() -> None:
    p = parse_profile(profile_doc([[4.0, 6.0, 5.0]], batch_sizes=(2, 4, 8), max_batch=16))
    assert p.latency_ms(0, 12) == 5.0
    assert p.latency_ms(0, 16) == 5.0


def test_table_matches_latency_ms(measured: Any) -> None:
    table = measured.table(14)
    assert len(table) == 1
    assert len(table[0]) == 15
    assert table[0][:4] == (0.0, 2.0, 4.0, 5.0)
    assert table[0][13] == math.inf
    assert all(table[0][b] == measured.latency_ms(0, b) for b in range(15))


def test_to_json_round_trips() -> None:
    doc = profile_doc([[1.0, 1.5], [2.0, 3.0]], max_batch=8)
    p = parse_profile(doc)
    assert parse_profile(p.to_json()) == p
    assert p.to_json()["stages"][1]["latency_ms"] == [2.0, 3.0]


# --- the shipped profiles -----------------------------------------------------------------------
def test_the_issue_list_of_models_is_shipped_for_v100_and_t4() -> None:
    names = {p.stem for p in SHIPPED}
    for model in (
        "googlenet-v3-pytorch",
        "repvgg-b3",
        "wide_resnet101_2",
        "resnext152-32x4d",
        "efficientnet-b8",
        "fcn-r101-cityscapes",
    ):
        for gpu in ("V100", "T4"):
            assert f"{model}-{gpu}" in names


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_profile_loads_with_ten_stages(path: Path) -> None:
    p = load_profile(path)
    assert p.num_stages == 10
    assert p.batch_sizes == tuple(range(1, 9))
    assert p.max_batch == 32
    assert path.stem == f"{p.model}-{p.device.split('-')[0]}"
    for s in p.stages:
        assert len(s.latency_ms) == 8
        assert all(x > 0 for x in s.latency_ms)
    # defined (finite) up to max_batch, infinite just above
    assert math.isfinite(p.latency_ms(9, 32))
    assert p.latency_ms(9, 33) == math.inf


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_profile_equals_the_ppipe_source_in_ms(path: Path) -> None:
    if not PPIPE_TIMING.is_dir():
        pytest.skip("../shared/data/profiles/ppipe is not on this machine (CI has no ../shared)")
    raw = json.loads(path.read_text())
    csv_name = Path(raw["source"]).name
    rows = [ln for ln in (PPIPE_TIMING / csv_name).read_text().splitlines() if ln.strip()]
    source_us = [[float(x) for x in ln.split(",")] for ln in rows]
    p = load_profile(path)
    assert len(source_us) == p.num_stages
    for k, row in enumerate(source_us):
        assert len(row) == len(p.batch_sizes)
        assert p.stages[k].latency_ms == pytest.approx([x / 1000.0 for x in row], abs=5e-5)


# --- malformed profiles -------------------------------------------------------------------------
def _good() -> dict[str, Any]:
    return profile_doc([[1.0, 1.8], [2.0, 3.5]], batch_sizes=(1, 2), max_batch=8)


def _without(key: str) -> dict[str, Any]:
    d = _good()
    del d[key]
    return d


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    d = copy.deepcopy(_good())
    target: Any = d
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return d


BAD_PROFILES = {
    "missing-format": (_without("format"), "format"),
    "missing-model": (_without("model"), "model"),
    "missing-device": (_without("device"), "device"),
    "missing-input": (_without("input"), "input"),
    "missing-batch-sizes": (_without("batch_sizes"), "batch_sizes"),
    "missing-stages": (_without("stages"), "stages"),
    "missing-max-batch": (_without("max_batch"), "max_batch"),
    "missing-latency": (
        {**_good(), "stages": [{"name": "s0"}, _good()["stages"][1]]},
        "stages[0].latency_ms",
    ),
    "wrong-format": (_with(("format",), "layerbatch.profile/0"), "format"),
    "model-not-a-string": (_with(("model",), 7), "model"),
    "max-batch-a-string": (_with(("max_batch",), "32"), "max_batch"),
    "max-batch-bool": (_with(("max_batch",), True), "max_batch"),
    "max-batch-zero": (_with(("max_batch",), 0), "max_batch"),
    "batch-sizes-not-a-list": (_with(("batch_sizes",), 4), "batch_sizes"),
    "shape-with-floats": (_with(("input", "shape"), [3, 8.5, 8]), "input.shape"),
    "stages-empty": (_with(("stages",), []), "stages"),
    "stage-not-an-object": (_with(("stages", 1), [1.0, 2.0]), "stages[1]"),
    "latency-too-short": (_with(("stages", 1, "latency_ms"), [2.0]), "stages[1].latency_ms"),
    "latency-too-long": (
        _with(("stages", 0, "latency_ms"), [1.0, 2.0, 3.0]),
        "stages[0].latency_ms",
    ),
    "latency-negative": (_with(("stages", 1, "latency_ms"), [2.0, -3.5]), "stages[1].latency_ms"),
    "latency-a-string": (_with(("stages", 0, "latency_ms"), [1.0, "2"]), "stages[0].latency_ms"),
    "batch-sizes-not-increasing": (_with(("batch_sizes",), [2, 1]), "batch_sizes"),
    "batch-sizes-repeated": (_with(("batch_sizes",), [1, 1]), "batch_sizes"),
    "batch-size-zero": (_with(("batch_sizes",), [0, 2]), "batch_sizes"),
    "out-bytes-negative": (_with(("stages", 0, "out_bytes"), -1), "stages[0].out_bytes"),
    "top-level-list": ([_good()], "top level"),
}


@pytest.mark.parametrize(("doc", "field"), BAD_PROFILES.values(), ids=BAD_PROFILES.keys())
def test_malformed_profile_names_the_file_and_the_field(
    tmp_path: Path, doc: Any, field: str
) -> None:
    path = write_json(tmp_path / "broken-profile.json", doc)
    with pytest.raises(InputError) as info:
        load_profile(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ")
    assert field in msg
    assert "expected" in msg
    assert "\n" not in msg
    assert info.value.source == str(path)


def test_profile_with_nan_latency_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(_good()).replace("3.5", "NaN"))
    with pytest.raises(InputError, match=r"stages\[1\]\.latency_ms"):
        load_profile(path)


def test_profile_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "garbled.json"
    path.write_text('{"format": "layerbatch.profile/1", "model": ')
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert str(path) in str(info.value)
    assert "JSON" in str(info.value)


def test_missing_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert str(path) in str(info.value)


# --- layer groups (Deployment) -------------------------------------------------------------------
def _batch1_profile(batch1_ms: list[float], model: str = "m") -> Any:
    return parse_profile(
        profile_doc([[x, 2 * x] for x in batch1_ms], batch_sizes=(1, 2), model=model)
    )


def test_uniform_stages_split_into_equal_groups() -> None:
    d = Deployment([_batch1_profile([1.0] * 10)], groups=5)
    assert d.group_bounds("m") == (0, 2, 4, 6, 8)
    assert [d.group_end("m", k) for k in range(10)] == [2, 2, 4, 4, 6, 6, 8, 8, 10, 10]
    assert [d.group_of("m", k) for k in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_groups_have_about_equal_batch1_time() -> None:
    # total 16 ms in 4 groups: 4 | 1+1+1+1 | 4 | 1+1+1+1 is the exact equal split
    lat = [4.0, 1.0, 1.0, 1.0, 1.0, 4.0, 1.0, 1.0, 1.0, 1.0]
    d = Deployment([_batch1_profile(lat)], groups=4)
    assert d.group_bounds("m") == (0, 1, 5, 6)


def test_groups_follow_the_time_not_the_stage_count() -> None:
    # one heavy first stage: the first group is that stage alone
    lat = [10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    d = Deployment([_batch1_profile(lat)], groups=2)
    assert d.group_bounds("m") == (0, 1)


@pytest.mark.parametrize("groups", [10, 11, 1000])
def test_at_least_as_many_groups_as_stages_gives_one_stage_per_group(groups: int) -> None:
    d = Deployment([_batch1_profile([3.0, 1.0, 2.0] * 3 + [1.0])], groups=groups)
    assert d.group_bounds("m") == tuple(range(10))
    assert [d.group_end("m", k) for k in range(10)] == list(range(1, 11))


def test_one_group_is_the_whole_model() -> None:
    d = Deployment([_batch1_profile([3.0, 1.0, 2.0])], groups=1)
    assert d.group_bounds("m") == (0,)
    assert d.group_end("m", 0) == 3
    assert d.group_end("m", 2) == 3


def test_short_models_get_fewer_groups_of_at_least_the_floor() -> None:
    # batch-1 totals 23.0, 10.0 and 1.9 ms, about resnet18, mobilenet_v2 and resnet20_cifar10 here
    long_, mid, short = (
        _batch1_profile([2.3] * 10, "long"),
        _batch1_profile([0.5] * 20, "mid"),
        _batch1_profile([0.19] * 10, "short"),
    )
    per_model = groups_by_duration([long_, mid, short], 5, 4.0)
    assert per_model == {"long": 5, "mid": 2, "short": 1}
    assert groups_by_duration([long_, mid, short], 5, 0.0) == {"long": 5, "mid": 5, "short": 5}
    assert groups_by_duration([long_], 3, 1.0) == {"long": 3}  # never more than G
    d = Deployment([long_, mid, short], groups=per_model)
    assert [len(d.group_bounds(m)) for m in ("long", "mid", "short")] == [5, 2, 1]
    assert d.group_bounds("mid") == (0, 10)
    assert d.group_end("short", 0) == 10  # one group: a step runs the whole model
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(InputError, match="min_group_ms: expected a finite number of ms >= 0"):
            groups_by_duration([long_], 5, bad)


def test_groups_per_model_must_name_every_model_with_a_positive_count() -> None:
    a, b = _batch1_profile([1.0] * 4, "a"), _batch1_profile([1.0] * 4, "b")
    with pytest.raises(InputError, match=r"groups: expected a number of layer groups for each"):
        Deployment([a, b], groups={"a": 2})
    with pytest.raises(InputError, match=r"groups\.b: expected a positive number"):
        Deployment([a, b], groups={"a": 2, "b": 0})
    with pytest.raises(InputError, match=r"groups\.a: expected a positive number"):
        Deployment([a, b], groups=0)


@settings(max_examples=60, deadline=None)
@given(
    lat=st.lists(st.floats(0.05, 20.0), min_size=2, max_size=14),
    groups=st.integers(1, 16),
)
def test_group_bounds_are_a_partition_close_to_the_equal_split(
    lat: list[float], groups: int
) -> None:
    d = Deployment([_batch1_profile(lat)], groups=groups)
    bounds = d.group_bounds("m")
    n = len(lat)
    assert bounds[0] == 0
    assert list(bounds) == sorted(set(bounds))
    assert bounds[-1] < n
    assert len(bounds) == min(groups, n)
    # the documented contract: no other cut into as many contiguous parts has a smaller sum of
    # squared deviations of the part times from their mean (checked by brute force)
    parts = len(bounds)
    mean = sum(lat) / parts

    def cost(starts: tuple[int, ...]) -> float:
        ends = [*starts[1:], n]
        return sum((sum(lat[a:b]) - mean) ** 2 for a, b in zip(starts, ends, strict=True))

    every = [(0, *c) for c in itertools.combinations(range(1, n), parts - 1)]
    assert cost(tuple(bounds)) == pytest.approx(min(cost(c) for c in every))


def test_deployment_refuses_bad_bounds() -> None:
    p = _batch1_profile([1.0, 1.0])
    with pytest.raises(InputError, match="groups"):
        Deployment([p], groups=0)
    with pytest.raises(InputError, match="max_batch"):
        Deployment([p], max_batch=0)
    with pytest.raises(InputError, match="profiles"):
        Deployment([p, p])


def test_deployment_batch_limit_is_the_smaller_of_cap_and_profile() -> None:
    p = _batch1_profile([1.0, 1.0])  # profile max_batch 4
    assert Deployment([p]).batch_limit("m") == 4
    assert Deployment([p], max_batch=2).batch_limit("m") == 2
    assert Deployment([p], max_batch=64).batch_limit("m") == 4
    d = Deployment([p], max_batch=2)
    assert d.latency_ms("m", 0, 3) == math.inf
    assert d.run_ms("m", 0, 2, 2) == pytest.approx(4.0)


# --- what the executor's profiler adds: activation peaks and stacking slowdowns -------------------
def test_peak_bytes_and_stacking_are_read_and_written_back() -> None:
    doc = profile_doc([[1.0, 2.0]], batch_sizes=[1, 2])
    doc["stages"][0]["peak_bytes"] = 4096
    doc["stacking"] = {"other": {"batch": 1, "slowdown": 1.75}}
    p = parse_profile(doc, "p.json")
    assert p.stages[0].peak_bytes == 4096
    assert p.stacking_slowdown == {"other": 1.75}
    again = parse_profile(p.to_json(), "again.json")
    assert again.stages[0].peak_bytes == 4096 and again.stacking_slowdown == {"other": 1.75}


def test_profiles_without_peaks_or_stacking_default_to_unmeasured() -> None:
    p = parse_profile(profile_doc([[1.0]], batch_sizes=[1]), "p.json")
    assert p.stages[0].peak_bytes == 0 and p.stacking_slowdown == {}
    assert p.peak_bytes == 0


def test_a_profiles_peak_is_its_largest_stage_peak() -> None:
    doc = profile_doc([[1.0], [2.0], [3.0]], batch_sizes=[1])
    for stage, peak in zip(doc["stages"], [4096, 12288, 8192], strict=True):
        stage["peak_bytes"] = peak
    assert parse_profile(doc, "p.json").peak_bytes == 12288


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (lambda d: d["stages"][0].__setitem__("peak_bytes", -1), "stages[0].peak_bytes"),
        (
            lambda d: d.__setitem__("stacking", {"other": {"slowdown": 0}}),
            "stacking.other.slowdown",
        ),
        (lambda d: d.__setitem__("stacking", {"other": 2.0}), "stacking.other.slowdown"),
        (lambda d: d.__setitem__("stacking", []), "stacking"),
    ],
)
def test_bad_peaks_or_stacking_name_the_field(patch: Any, field: str) -> None:
    doc = profile_doc([[1.0]], batch_sizes=[1])
    patch(doc)
    with pytest.raises(InputError) as info:
        parse_profile(doc, "p.json")
    assert str(info.value).startswith(f"p.json: {field}:")


# --- N blocks of about equal time (PPipe section 5.2) ---------------------------------------------
def test_coarsen_merges_stages_into_blocks_of_about_equal_time() -> None:
    from scheduler.profile import balanced_bounds, coarsen

    doc = profile_doc([[1.0, 1.5], [1.0, 1.5], [2.0, 3.0], [0.5, 0.75], [1.5, 2.0]])
    for k, s in enumerate(doc["stages"]):
        s["peak_bytes"] = 100 * (k + 1)
        s["out_bytes"] = 10 * (k + 1)
    p = parse_profile(doc, "p.json")
    blocks = coarsen(p, 3)
    starts = balanced_bounds([1.0, 1.0, 2.0, 0.5, 1.5], 3)
    assert starts == (0, 2, 3)  # block times 2, 2, 2: exactly equal
    assert blocks.num_stages == 3
    assert [s.latency_ms for s in blocks.stages] == [(2.0, 3.0), (2.0, 3.0), (2.0, 2.75)]
    # a block hands over what its last stage outputs, and peaks at its worst stage
    assert [s.out_bytes for s in blocks.stages] == [20, 30, 50]
    assert [s.peak_bytes for s in blocks.stages] == [200, 300, 500]
    # running the blocks costs what running the stages costs, at every batch size
    for b in range(1, p.max_batch + 1):
        whole = sum(p.latency_ms(k, b) for k in range(p.num_stages))
        assert sum(blocks.latency_ms(k, b) for k in range(3)) == pytest.approx(whole)
    assert coarsen(p, 99).num_stages == p.num_stages


# --- per-request work on the device (server/runtime.py: decodes on the executor thread) -----
def test_an_entry_cost_is_added_per_sample_to_the_first_stage_only() -> None:
    p = parse_profile(profile_doc([[4.0, 6.0, 12.0], [1.0, 2.0, 3.0]], batch_sizes=(2, 4, 8)))
    q = with_entry_cost(p, 1.5)
    for b in range(1, 9):
        assert q.latency_ms(0, b) == pytest.approx(p.latency_ms(0, b) + 1.5 * b)
        assert q.latency_ms(1, b) == p.latency_ms(1, b)
    assert with_entry_cost(p, 0.0) is p


# --- rescaled to what a machine measures (server/calibration.py) -------------------------------
def test_each_stage_is_rescaled_by_its_own_factor() -> None:
    p = parse_profile(profile_doc([[4.0, 6.0, 12.0], [1.0, 2.0, 3.0]], batch_sizes=(2, 4, 8)))
    q = scaled_stages(p, [2.0, 0.5])
    for b in range(1, 13):
        assert q.latency_ms(0, b) == pytest.approx(2.0 * p.latency_ms(0, b))
        assert q.latency_ms(1, b) == pytest.approx(0.5 * p.latency_ms(1, b))
    one = scaled(p, 1.5)
    assert [one.latency_ms(k, 3) for k in (0, 1)] == pytest.approx(
        [1.5 * p.latency_ms(k, 3) for k in (0, 1)]
    )
    with pytest.raises(ValueError, match="1 factors for 2 stages"):
        scaled_stages(p, [2.0])

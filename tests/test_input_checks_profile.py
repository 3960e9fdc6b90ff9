"""Profile loading refuses absurd numbers by name (latencies above an hour, batch sizes above
MAX_BATCH, stacking slowdowns above MAX_SLOWDOWN), so nothing downstream can overflow; every
shipped profile still loads."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler.errors import InputError
from scheduler.profile import (
    MAX_BATCH,
    MAX_LATENCY_MS,
    MAX_SLOWDOWN,
    balanced_bounds,
    coarsen,
    parse_profile,
)
from scheduler.validate import MAX_SAMPLE_BYTES
from sim.ppipe import profile_json
from tests.sim_cases import REPO

PROFILES = REPO / "traces" / "data" / "profiles"
BASE: dict[str, Any] = json.loads((PROFILES / "googlenet-v3-pytorch-V100.json").read_text())


def with_change(**change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc.update(change)
    return doc


def refusal(doc: object) -> str:
    with pytest.raises(InputError) as info:
        parse_profile(doc, "p.json")
    return str(info.value)


@pytest.mark.parametrize("absurd", [1e200, 1e300, MAX_LATENCY_MS * 1.001])
def test_a_latency_above_an_hour_is_refused_by_name(absurd: float) -> None:
    doc = copy.deepcopy(BASE)
    doc["stages"][2]["latency_ms"][1] = absurd
    assert refusal(doc).startswith(
        "p.json: stages[2].latency_ms[1]: expected a latency of at most 3600000 ms (one hour)"
    )


def test_latencies_up_to_an_hour_load_and_coarsen_without_overflow() -> None:
    doc = copy.deepcopy(BASE)
    for stage in doc["stages"]:
        stage["latency_ms"] = [MAX_LATENCY_MS] * len(doc["batch_sizes"])
    profile = parse_profile(doc, "p.json")
    assert coarsen(profile, 3).num_stages == 3
    assert balanced_bounds([MAX_LATENCY_MS] * 100, 7)[0] == 0


def test_batch_sizes_and_max_batch_are_bounded() -> None:
    huge = 10**30
    sizes = [*BASE["batch_sizes"][:-1], huge]
    assert refusal(with_change(batch_sizes=sizes)).startswith(
        f"p.json: batch_sizes: expected batch sizes of at most {MAX_BATCH}"
    )
    assert refusal(with_change(max_batch=huge)).startswith(
        f"p.json: max_batch: expected an integer from 1 to {MAX_BATCH}"
    )
    assert parse_profile(with_change(max_batch=MAX_BATCH)).max_batch == MAX_BATCH


@pytest.mark.parametrize("key", ["out_bytes", "peak_bytes"])
@pytest.mark.parametrize(
    "absurd", [10**400, MAX_SAMPLE_BYTES + 1, -1], ids=["1e400", "2^40+1", "-1"]
)
def test_a_byte_count_past_a_tebibyte_is_refused_by_name(key: str, absurd: int) -> None:
    """10**400 bytes overflowed a float once summed or converted; 2**40 per sample still loads."""
    doc = copy.deepcopy(BASE)
    doc["stages"][1][key] = absurd
    assert refusal(doc).startswith(
        f"p.json: stages[1].{key}: expected a byte count from 0 to {MAX_SAMPLE_BYTES}, got "
    )
    doc["stages"][1][key] = MAX_SAMPLE_BYTES
    assert parse_profile(doc, "p.json").num_stages == len(BASE["stages"])


@pytest.mark.parametrize("factor", [1e300, float("inf"), float("nan"), 0.0, -1.0])
def test_an_absurd_stacking_slowdown_is_refused_by_name(factor: float) -> None:
    doc = with_change(stacking={"resnet50": {"slowdown": factor}})
    assert refusal(doc).startswith(
        "p.json: stacking.resnet50.slowdown: expected a positive factor of at most "
        f"{MAX_SLOWDOWN:g}"
    )


def test_every_shipped_profile_still_loads() -> None:
    paths = sorted(PROFILES.glob("*.json"))
    assert len(paths) > 10
    paths += sorted((REPO / "bench" / "results").glob("profiles-*/*/*.json"))  # measured ones
    for path in paths:
        parse_profile(json.loads(path.read_text()), str(path))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(max_btach=8),
         "p.json: max_btach: expected only the keys format, model, device, input, batch_sizes, "
         "stages, max_batch, stacking, layout, weights, batch_norm, source, memory_budget_mb "
         "(unknown key; did you mean max_batch?)"),
        (lambda d: d["input"].update(dtpye="float16"),
         "p.json: input.dtpye: expected only the keys shape, dtype (unknown key; did you mean "
         "dtype?)"),
        (lambda d: d["stages"][3].update(latency=[1.0]),
         "p.json: stages[3].latency: expected only the keys name, latency_ms, out_shape, "
         "out_bytes, peak_bytes (unknown key; did you mean latency_ms?)"),
        (lambda d: d.update(stacking={"resnet50": {"slowdwon": 1.5, "slowdown": 1.2}}),
         "p.json: stacking.resnet50.slowdwon: expected only the keys slowdown, batch (unknown "
         "key; did you mean slowdown?)"),
    ],
)  # fmt: skip
def test_an_unknown_key_is_refused_naming_it_and_the_closest_known_one(
    edit: Any, message: str
) -> None:
    doc = copy.deepcopy(BASE)
    edit(doc)
    assert refusal(doc) == message


def test_what_the_project_writes_reads_back() -> None:
    """`Profile.to_json`, the PPipe conversion (sim/ppipe.py) and the extra keys
    `layerbatch profile` writes (layout, weights, batch_norm, memory_budget_mb, stacking with
    its batch) all load."""
    profile = parse_profile(BASE, "p.json")
    assert parse_profile(profile.to_json(), "again.json") == profile
    measured = with_change(
        layout="channels_last", weights="seeded", batch_norm="folded", memory_budget_mb=64.0,
        stacking={"resnet50": {"batch": 1, "slowdown": 1.5}},
    )  # fmt: skip
    assert parse_profile(measured).stacking_slowdown == {"resnet50": 1.5}
    converted = profile_json("toy", "T4", np.ones((2, 3)) * 1000.0, [4096], [3, 8, 8])
    assert parse_profile(converted).num_stages == 2


def test_the_cli_answers_a_misspelt_key_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import layerbatch

    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(with_change(max_batchsize=64)))
    code = layerbatch.main(["sim", "--profile", str(profile), "--requests", "10"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"layerbatch: {profile}: max_batchsize: expected only the keys format, model, device, "
        "input, batch_sizes, stages, max_batch, stacking, layout, weights, batch_norm, source, "
        "memory_budget_mb (unknown key; did you mean max_batch?)"
    ]


def test_the_cli_answers_an_absurd_latency_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import layerbatch

    doc = copy.deepcopy(BASE)
    doc["stages"][0]["latency_ms"][0] = 1e300
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(doc))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"now_ms": 0.0, "requests": []}))
    code = layerbatch.main(["schedule", "--profile", str(profile), "--state", str(state)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        f"layerbatch: {profile}: stages[0].latency_ms[0]: expected a latency of at most "
        "3600000 ms (one hour), got 1e+300"
    ]

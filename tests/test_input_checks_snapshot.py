"""state.json (`layerbatch schedule --state`): unknown keys are refused by name at every level,
with the keys expected; a request may not arrive after now_ms nor be due before it arrived. The
README's example states still load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.errors import InputError
from scheduler.profile import load_profile
from scheduler.snapshot import REQUEST_KEYS, STATE_KEYS, Snapshot, load_apps, load_state
from tests.sim_cases import REPO

PROFILES = REPO / "traces" / "data" / "profiles"
GOOGLENET = load_profile(PROFILES / "googlenet-v3-pytorch-V100.json")
APP = "googlenet-v3-pytorch"
REQUEST: dict[str, Any] = {
    "id": "r0",
    "app": APP,
    "position": 6,
    "arrival_ms": -9.0,
    "deadline_ms": 141.0,
}


def load(tmp_path: Path, doc: object) -> Snapshot:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(doc))
    return load_state(path, [GOOGLENET], [])


def refusal(tmp_path: Path, doc: object) -> str:
    with pytest.raises(InputError) as info:
        load(tmp_path, doc)
    return str(info.value).removeprefix(f"{tmp_path / 'state.json'}: ")


def test_the_readme_states_load(tmp_path: Path) -> None:
    state = {
        "now_ms": 0.0,
        "max_batch": 16,
        "groups": None,
        "requests": [
            {**REQUEST},
            {**REQUEST, "id": "r1", "position": 3, "arrival_ms": -5.0, "deadline_ms": 145.0},
            {**REQUEST, "id": "r2", "position": 0, "arrival_ms": -1.0, "deadline_ms": 149.0},
        ],
    }
    assert len(load(tmp_path, state).state) == 3
    # state2.json with apps.json: a two-model app
    apps_path = tmp_path / "apps.json"
    apps_path.write_text(json.dumps({"apps": {"faces": ["ultraface_slim320", "resnet18"]}}))
    two = [load_profile(PROFILES / f"{m}-cpu.json") for m in ("ultraface_slim320", "resnet18")]
    state2 = {
        "now_ms": 0.0,
        "max_batch": None,
        "groups": None,
        "requests": [
            {"id": "a", "app": "faces", "position": 17, "arrival_ms": -9.0, "deadline_ms": 141.0},
            {"id": "b", "app": "resnet18", "position": 0, "arrival_ms": -5.0, "deadline_ms": 145.0},
        ],
    }
    path = tmp_path / "state2.json"
    path.write_text(json.dumps(state2))
    assert len(load_state(path, two, load_apps(apps_path)).state) == 2


def test_missing_optional_keys_and_edge_times_still_load(tmp_path: Path) -> None:
    minimal = {"id": "r0", "app": APP, "arrival_ms": 5.0}  # no position, no deadline
    due_on_arrival = {**REQUEST, "id": "r1", "arrival_ms": 5.0, "deadline_ms": 5.0}
    snap = load(tmp_path, {"now_ms": 5.0, "requests": [minimal, due_on_arrival]})
    assert snap.now_ms == 5.0 and len(snap.state) == 2


def test_a_misspelt_request_key_is_refused_by_name(tmp_path: Path) -> None:
    request = {k: v for k, v in REQUEST.items() if k != "deadline_ms"} | {"deadline": 141.0}
    message = refusal(tmp_path, {"now_ms": 0.0, "requests": [REQUEST, request]})
    assert message == (
        "requests[1].deadline: expected only the keys id, app, position, arrival_ms, "
        "deadline_ms (unknown key; did you mean deadline_ms?)"
    )


def test_a_misspelt_top_level_key_is_refused_by_name(tmp_path: Path) -> None:
    message = refusal(tmp_path, {"now_ms": 0.0, "maxbatch": 4, "requests": [REQUEST]})
    assert message == (
        "maxbatch: expected only the keys now_ms, max_batch, groups, requests "
        "(unknown key; did you mean max_batch?)"
    )


def test_an_unrelated_key_is_refused_without_a_guess(tmp_path: Path) -> None:
    message = refusal(tmp_path, {"now_ms": 0.0, "requests": [{**REQUEST, "zzz": 1}]})
    assert (
        message
        == f"requests[0].zzz: expected only the keys {', '.join(REQUEST_KEYS)} (unknown key)"
    )
    assert STATE_KEYS == ("now_ms", "max_batch", "groups", "requests")


def test_a_request_arriving_after_now_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, {"now_ms": 10.0, "requests": [{**REQUEST, "arrival_ms": 50.0}]})
    assert (
        message
        == "requests[0].arrival_ms: expected an arrival at or before now_ms (10 ms), got 50.0"
    )


def test_a_deadline_before_arrival_is_refused(tmp_path: Path) -> None:
    late = {**REQUEST, "arrival_ms": -9.0, "deadline_ms": -100.0}
    message = refusal(tmp_path, {"now_ms": 0.0, "requests": [late]})
    assert message == (
        "requests[0].deadline_ms: expected a deadline at or after the request's arrival_ms "
        "(-9 ms), got -100.0"
    )
    # a deadline already past now_ms but after arrival is a real (missed) deadline: kept
    missed = {**REQUEST, "deadline_ms": -1.0}
    assert len(load(tmp_path, {"now_ms": 0.0, "requests": [missed]}).state) == 1

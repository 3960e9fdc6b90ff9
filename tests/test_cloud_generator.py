"""The cost-planner workload generator (issue 7): the papers' five apps on measured profiles."""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler.cloud import parse_workload, plan
from scheduler.cloud.generator import (
    APPS,
    DATA_DIR,
    MODELS,
    PRICE_PER_HOUR,
    SLO_MAX_S,
    SLO_MIN_SPAN,
    SOURCE_RATE_RPS,
    app_shapes,
    generate,
    load_catalog,
    slo_bounds_s,
)
from scheduler.errors import InputError
from tests.sim_cases import REPO

# The shapes the generator's docstring documents, written out independently.
SHAPES = {
    "traffic": {
        ("traffic_detector", "traffic_vehicle"),
        ("traffic_detector", "traffic_pedestrian"),
    },
    "face": {("face_detector", "face_prnet")},
    "pose": {("pose_person_detector", "pose_openpose")},
    "caption": {("caption_vgg_features", "caption_s2vt")},
    "actdet": {("actdet_detector", "actdet_tracker"), ("actdet_tracker", "actdet_activity")},
}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return generate(1000, np.random.default_rng(7))


def app_of(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((name, body),) = doc["apps"].items()
    return name, body


def test_thousand_distinct_workloads_in_under_five_seconds() -> None:
    start = time.perf_counter()
    got = generate(1000, np.random.default_rng(1))
    assert time.perf_counter() - start < 5.0
    assert len(got) == 1000
    assert len({json.dumps(d, sort_keys=True) for d in got}) == 1000


def test_every_workload_parses(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        w = parse_workload(doc, "generated")
        assert len(w.apps) == 1
        assert set(w.apps[0].modules) == set(doc["modules"])


def test_dag_shapes_are_as_documented(docs: list[dict[str, Any]]) -> None:
    assert {a: set(e) for a, e in app_shapes().items()} == SHAPES
    for doc in docs:
        name, body = app_of(doc)
        assert {tuple(e) for e in body["edges"]} == SHAPES[name]
        w = parse_workload(doc)
        assert w.apps[0].modules[0] == APPS[[a.name for a in APPS].index(name)].modules[0].name


def test_same_seed_same_workloads_other_seed_others() -> None:
    a = generate(50, np.random.default_rng(42))
    b = generate(50, np.random.default_rng(42))
    c = generate(50, np.random.default_rng(43))
    assert a == b
    assert a != c


def test_documents_share_no_lists() -> None:
    a, _, _, _, _, b = generate(6, np.random.default_rng(0))  # both traffic
    a["modules"]["traffic_detector"]["profile"].clear()
    assert b["modules"]["traffic_detector"]["profile"]


def test_all_five_apps_appear_balanced(docs: list[dict[str, Any]]) -> None:
    counts: dict[str, int] = {}
    for doc in docs:
        name, _ = app_of(doc)
        counts[name] = counts.get(name, 0) + 1
    assert counts == dict.fromkeys(SHAPES, 200)
    assert {app_of(d)[0] for d in generate(5, np.random.default_rng(3))} == set(SHAPES)


def test_rates_and_slos_within_documented_ranges(docs: list[dict[str, Any]]) -> None:
    lo_rate, hi_rate = SOURCE_RATE_RPS
    slos = []
    for doc in docs:
        name, body = app_of(doc)
        spec = APPS[[a.name for a in APPS].index(name)]
        source = body["rate_rps"][spec.modules[0].name]
        assert lo_rate <= source <= hi_rate
        for m in spec.modules[1:]:
            lo, hi = m.rate_factor
            rate = body["rate_rps"][m.name]
            assert rate >= 1
            assert max(1.0, round(lo * source) - 1) <= rate <= round(hi * source) + 1
        w = parse_workload(doc)
        slo_lo, slo_hi = slo_bounds_s(w.apps[0], w.profiles)
        assert 0 < slo_lo <= body["slo_s"] <= slo_hi
        assert slo_hi <= max(SLO_MAX_S, SLO_MIN_SPAN * slo_lo) + 1e-12
        slos.append(body["slo_s"])
    # the draws spread over the range, from tens of milliseconds to seconds
    assert min(slos) < 0.1 and max(slos) > 1.0


def test_profiles_are_the_bundled_measurements_summed(docs: list[dict[str, Any]]) -> None:
    # googlenet-v3 (the traffic vehicle classifier) on V100, batch 3, MPS level 2: the column sum
    path = DATA_DIR / "ppipe" / "googlenet-v3-pytorch-V100-2.csv"
    with path.open() as f:
        want_s = sum(float(r[2]) for r in csv.reader(f) if r) / 1e6
    traffic = next(d for d in docs if app_of(d)[0] == "traffic")
    rows = traffic["modules"]["traffic_vehicle"]["profile"]
    got = [r for r in rows if (r["hardware"], r["batch"], r["concurrency"]) == ("V100", 3, 2)]
    assert [r["duration_s"] for r in got] == [pytest.approx(want_s)]
    levels = {(r["hardware"], r["concurrency"]) for r in rows}
    assert levels == {(g, c) for g in ("L4", "T4", "V100") for c in (1, 2)} | {("P4", 1)}
    assert max(r["batch"] for r in rows if r["concurrency"] == 1) == 8
    assert max(r["batch"] for r in rows if r["concurrency"] == 2) == 4
    # Nexus TITAN X table, caption's VGG-16 at batch 1: 6277.4 us
    caption = next(d for d in docs if app_of(d)[0] == "caption")
    vgg = caption["modules"]["caption_vgg_features"]["profile"]
    assert vgg[0] == {"hardware": "TITANX", "batch": 1, "concurrency": 1, "duration_s": 6277.4e-6}
    for doc in docs:
        assert {h: v["price"] for h, v in doc["hardware"].items()} == {
            h: PRICE_PER_HOUR[h] for h in doc["hardware"]
        }


def test_catalog_covers_every_model_with_positive_rows() -> None:
    cat = load_catalog()
    assert set(cat.rows) == set(MODELS)
    assert all(cat.rows[m] for m in MODELS)
    assert all(r.duration_s > 0 and r.batch >= 1 for rs in cat.rows.values() for r in rs)


def test_bad_measurement_directory_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        load_catalog(tmp_path)
    assert "\n" not in str(err.value)
    assert str(tmp_path) in str(err.value)


@pytest.mark.parametrize(
    ("name", "edit", "field"),
    [
        (
            "ppipe/cyclegan-L4-1.csv",
            lambda text: text.replace("778,", "1e300,", 1),
            "row 1, column 1: expected a latency of at most 3600000000 us (one hour), got 1e+300",
        ),
        (  # each block within an hour, the whole model (their sum) not
            "ppipe/cyclegan-L4-1.csv",
            lambda text: text.replace("778,", "3e9,", 1).replace("\n1124,", "\n3e9,", 1),
            "batch 1 (summed over its blocks): expected a latency of at most 3600000000 us "
            "(one hour), got 6000005132.0",
        ),
        (
            "nexus/caffe_vgg16_1.txt",
            lambda text: text.replace("\n2,14499,", "\n2,1e300,", 1),
            "batch 2: expected a latency of at most 3600000000 us (one hour), got 1e+300",
        ),
        (
            "nexus/caffe_vgg16_1.txt",
            lambda text: text.replace("\n2,14499,", "\n2,fast,", 1),
            "batch 2: expected a latency in microseconds, got 'fast'",
        ),
    ],
)
def test_a_measured_latency_above_an_hour_is_refused_naming_file_and_batch(
    tmp_path: Path, name: str, edit: Any, field: str
) -> None:
    shutil.copytree(DATA_DIR, tmp_path, dirs_exist_ok=True)
    path = tmp_path / name
    text = path.read_text()
    path.write_text(edit(text))
    assert path.read_text() != text
    with pytest.raises(InputError) as err:
        load_catalog(tmp_path)
    assert str(err.value) == f"{path}: {field}"


def test_bundled_data_has_license_and_notice() -> None:
    assert (DATA_DIR / "SOURCE.txt").is_file()
    assert (DATA_DIR / "nexus" / "NEXUS_LICENSE.txt").is_file()
    notice = (REPO / "NOTICE").read_text()
    assert "traces/data/profiles/cloud/ppipe/" in notice
    assert "traces/data/profiles/cloud/nexus/" in notice


def test_harpagon_plans_or_refuses_in_one_line(docs: list[dict[str, Any]]) -> None:
    planned = 0
    for doc in docs[:50]:
        w = parse_workload(doc)
        try:
            got = plan(w, "harpagon")
        except InputError as exc:
            assert "\n" not in str(exc)
            continue
        planned += 1
        name, body = app_of(doc)
        assert got["cost"] > 0
        assert got["e2e_latency_s"][name] <= body["slo_s"] * (1 + 1e-9)
    assert planned >= 40

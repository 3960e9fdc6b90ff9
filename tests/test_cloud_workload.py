"""Workload validation and the plan document of the cloud cost planner (issue 7)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from scheduler.cloud import parse_workload, plan
from scheduler.errors import InputError

M3_ROWS = [(2, 0.100), (8, 0.250), (32, 0.800)]


def rows(spec: list[tuple[int, float]], hardware: str = "P100") -> list[dict[str, Any]]:
    return [{"hardware": hardware, "batch": b, "concurrency": 1, "duration_s": d} for b, d in spec]


def traffic() -> dict[str, Any]:
    return {
        "hardware": {"P100": {"price": 1.0}, "V100": {"price": 1.8}},
        "modules": {
            "M1": {"profile": rows([(2, 0.16), (4, 0.2), (8, 0.32)])},
            "M2": {"profile": rows([(2, 0.125), (4, 0.16), (8, 0.25)])},
            "M3": {"profile": rows(M3_ROWS) + rows([(8, 0.1), (32, 0.3)], "V100")},
        },
        "apps": {
            "traffic": {
                "edges": [["M1", "M2"], ["M1", "M3"]],
                "rate_rps": {"M1": 100, "M2": 60, "M3": 40},
                "slo_s": 0.9,
            }
        },
    }


def refused(doc: dict[str, Any]) -> str:
    with pytest.raises(InputError) as err:
        parse_workload(doc, "W.json")
    return str(err.value)


def test_valid_workload_parses_in_topological_order() -> None:
    w = parse_workload(traffic())
    (app,) = w.apps
    assert app.modules[0] == "M1" and set(app.modules) == {"M1", "M2", "M3"}
    assert w.profiles["M3"][3].price == 1.8
    assert w.profiles["M3"][4].throughput_rps == pytest.approx(32 / 0.3)


def test_cycle_is_named() -> None:
    doc = traffic()
    doc["apps"]["traffic"]["edges"] += [["M3", "M1"]]
    msg = refused(doc)
    assert "acyclic" in msg and "M1 -> M3 -> M1" in msg


def test_module_without_profile() -> None:
    doc = traffic()
    del doc["modules"]["M2"]
    msg = refused(doc)
    assert "modules.M2" in msg and "profile" in msg


def test_unknown_hardware() -> None:
    doc = traffic()
    doc["modules"]["M1"]["profile"][0]["hardware"] = "A100"
    msg = refused(doc)
    assert "modules.M1.profile[0].hardware" in msg and "A100" in msg


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("apps", "traffic", "rate_rps", "M2"), 0, "apps.traffic.rate_rps.M2"),
        (("apps", "traffic", "rate_rps", "M1"), -5, "apps.traffic.rate_rps.M1"),
        (("apps", "traffic", "slo_s"), 0.0, "apps.traffic.slo_s"),
        (("hardware", "P100", "price"), 0, "hardware.P100.price"),
        (("apps", "traffic", "slo_s"), True, "apps.traffic.slo_s"),
        (("apps", "traffic", "slo_s"), math.inf, "apps.traffic.slo_s"),  # JSON's Infinity
        (("apps", "traffic", "rate_rps", "M1"), math.inf, "apps.traffic.rate_rps.M1"),
        (("hardware", "P100", "price"), math.inf, "hardware.P100.price"),
    ],
)
def test_non_positive_numbers(path: tuple[str, ...], value: object, where: str) -> None:
    doc = traffic()
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert where in refused(doc)


def test_missing_rate_for_a_module_in_the_dag() -> None:
    doc = traffic()
    del doc["apps"]["traffic"]["rate_rps"]["M3"]
    assert "apps.traffic.rate_rps.M3" in refused(doc)


def test_bad_profile_row() -> None:
    doc = traffic()
    doc["modules"]["M1"]["profile"][1]["batch"] = 0
    assert "modules.M1.profile[1].batch" in refused(doc)


def test_plan_document_shape_and_guarantees() -> None:
    w = parse_workload(traffic())
    got = plan(w)
    assert set(got) == {"cost", "e2e_latency_s", "modules"}
    assert got["e2e_latency_s"]["traffic"] <= 0.9 + 1e-9
    total = 0.0
    for name, m in got["modules"].items():
        assert set(m) == {"budget_s", "wcl_s", "dummy_rps", "configs"}
        assert m["wcl_s"] <= m["budget_s"] + 1e-9
        rate = sum(c["rate_rps"] for c in m["configs"])
        assert rate == pytest.approx(w.apps[0].rate_rps[name] + m["dummy_rps"])
        for c in m["configs"]:
            assert set(c) == {"hardware", "batch", "concurrency", "machines", "rate_rps", "wcl_s"}
            price = {"P100": 1.0, "V100": 1.8}[c["hardware"]]
            total += price * c["machines"]
        assert max(c["wcl_s"] for c in m["configs"]) == pytest.approx(m["wcl_s"])
    assert got["cost"] == pytest.approx(total)
    # Both branches of the DAG fit the SLO with their budgets.
    b = {n: m["budget_s"] for n, m in got["modules"].items()}
    assert b["M1"] + b["M2"] <= 0.9 + 1e-9 and b["M1"] + b["M3"] <= 0.9 + 1e-9


def test_plan_is_deterministic_and_does_not_mutate_input() -> None:
    doc = traffic()
    before = copy.deepcopy(doc)
    w = parse_workload(doc)
    assert plan(w) == plan(w)
    assert doc == before


def test_features_never_make_harpagon_costlier_on_a_single_module() -> None:
    doc = traffic()
    doc["apps"] = {"one": {"edges": [], "rate_rps": {"M3": 198}, "slo_s": 1.0}}
    doc["modules"]["M3"]["profile"] = rows(M3_ROWS)
    w = parse_workload(doc)
    full = plan(w)["cost"]
    assert full == pytest.approx(5.0)
    assert plan(w, dummy=False)["cost"] == pytest.approx(5.3)
    assert plan(w, dummy=False, max_configs=2)["cost"] == pytest.approx(5.9)
    assert plan(w, dispatch="rr", dummy=False, max_configs=2)["cost"] == pytest.approx(6.3)


def test_slo_no_configuration_meets_names_smallest() -> None:
    doc = traffic()
    doc["apps"]["traffic"]["slo_s"] = 0.1
    with pytest.raises(InputError) as err:
        plan(parse_workload(doc))
    msg = str(err.value)
    assert "apps.traffic.slo_s" in msg and "at least" in msg


def test_unknown_system_and_dispatch() -> None:
    w = parse_workload(traffic())
    with pytest.raises(InputError, match="harpagon"):
        plan(w, system="triton")
    with pytest.raises(InputError, match="tc"):
        plan(w, dispatch="fifo")  # type: ignore[arg-type]


def test_module_shared_between_apps_is_refused() -> None:
    doc = traffic()
    doc["apps"]["other"] = {"rate_rps": {"M2": 5}, "slo_s": 1.0}
    assert "M2" in refused(doc)

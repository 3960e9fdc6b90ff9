"""Workload validation and the plan document of the cloud cost planner (issue 7)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import layerbatch
from scheduler.cloud import SYSTEMS, parse_workload, plan
from scheduler.cloud.generator import generate
from scheduler.cloud.planner import switches_used
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


@pytest.mark.parametrize("duration_s", [3600.0 * 1.001, 1e300])
def test_a_duration_above_an_hour_is_refused_naming_the_row_and_the_bound(
    duration_s: float,
) -> None:
    doc = traffic()
    doc["modules"]["M3"]["profile"][2]["duration_s"] = duration_s
    assert refused(doc) == (
        "W.json: modules.M3.profile[2].duration_s: expected a latency of at most 3600 s "
        f"(one hour), got {duration_s!r}"
    )
    doc["modules"]["M3"]["profile"][2]["duration_s"] = 3600.0  # an hour itself is a latency
    assert parse_workload(doc).profiles["M3"][2].duration_s == 3600.0


RATE = "a request rate per second from 1e-06 to 1e+09"
PRICE = "a price per machine-hour from 1e-09 to 1e+09"


BOUND_CASES = [
    (("apps", "traffic", "slo_s"), 1e300,
     "apps.traffic.slo_s: expected a latency of at most 3600 s (one hour), got 1e+300"),
    (("apps", "traffic", "slo_s"), 3601.0,
     "apps.traffic.slo_s: expected a latency of at most 3600 s (one hour), got 3601.0"),
    (("apps", "traffic", "rate_rps", "M2"), 1e300,
     f"apps.traffic.rate_rps.M2: expected {RATE}, got 1e+300"),
    (("apps", "traffic", "rate_rps", "M2"), 1.001e9,
     f"apps.traffic.rate_rps.M2: expected {RATE}, got 1001000000.0"),
    (("apps", "traffic", "rate_rps", "M2"), 5e-324,
     f"apps.traffic.rate_rps.M2: expected {RATE}, got 5e-324"),
    (("apps", "traffic", "rate_rps", "M2"), 0, f"apps.traffic.rate_rps.M2: expected {RATE}, got 0"),
    (("hardware", "V100", "price"), 1e300, f"hardware.V100.price: expected {PRICE}, got 1e+300"),
    (("hardware", "V100", "price"), 1e-300, f"hardware.V100.price: expected {PRICE}, got 1e-300"),
    (("modules", "M3", "profile", 1, "batch"), 4097,
     "modules.M3.profile[1].batch: expected an integer from 1 to 4096, got 4097"),
    (("modules", "M3", "profile", 1, "batch"), 10**400,
     "modules.M3.profile[1].batch: expected an integer from 1 to 4096, got "
     + repr(10**400)[:57] + "..."),
    (("modules", "M3", "profile", 1, "concurrency"), 1025,
     "modules.M3.profile[1].concurrency: expected an integer from 1 to 1024, got 1025"),
    (("modules", "M3", "profile", 1, "duration_s"), 5e-324,
     "modules.M3.profile[1].duration_s: expected a duration of at least 1e-06 s "
     "(a microsecond), got 5e-324"),
    (("modules", "M3", "profile", 1, "duration_s"), 0.0,
     "modules.M3.profile[1].duration_s: expected a duration of at least 1e-06 s "
     "(a microsecond), got 0.0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "value", "message"),
    BOUND_CASES,
    ids=[f"{path[-1]}={value!r:.10}" for path, value, _ in BOUND_CASES],
)
def test_plan_refuses_a_number_out_of_its_bounds_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: tuple[str | int, ...],
    value: float,
    message: str,
) -> None:
    """Before these bounds `layerbatch plan` crashed on some (a tiny duration or rate divided to
    inf, a huge batch overflowed float), searched for long on others (a huge SLO or price, with
    `--system optimal`) and planned the rest as if they were real."""
    doc: Any = traffic()
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    file = tmp_path / "w.json"
    file.write_text(json.dumps(doc))
    assert layerbatch.main(["plan", "--workload", str(file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [f"layerbatch: {file}: {message}"]


def test_numbers_at_their_bounds_parse_and_plan() -> None:
    doc = traffic()
    doc["hardware"]["P100"]["price"] = 1e9
    doc["hardware"]["V100"]["price"] = 1e-9
    doc["modules"]["M3"]["profile"][1].update(batch=4096, concurrency=1024, duration_s=1e-6)
    doc["apps"]["traffic"]["rate_rps"].update(M1=1e9, M2=1e-6)
    doc["apps"]["traffic"]["slo_s"] = 3600.0
    w = parse_workload(doc)
    assert w.profiles["M3"][1].throughput_rps == 4096 * 1024 / 1e-6
    (app,) = w.apps
    assert (app.rate_rps["M1"], app.rate_rps["M2"], app.slo_s) == (1e9, 1e-6, 3600.0)
    result = plan(w)
    assert math.isfinite(result["cost"]) and result["cost"] > 0


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


def test_modules_no_slo_within_an_hour_serves_are_named_as_such() -> None:
    """Two modules of 40 minutes a batch in a chain: no SLO a workload may name (an hour at
    most) is met, so the message does not ask for one above an hour."""
    doc = traffic()
    for module in ("M1", "M2"):
        doc["modules"][module]["profile"] = rows([(1, 2400.0)])
    doc["apps"]["traffic"] = {
        "edges": [["M1", "M2"]], "rate_rps": {"M1": 1, "M2": 1}, "slo_s": 3600,
    }  # fmt: skip
    with pytest.raises(InputError) as err:
        plan(parse_workload(doc, "W.json"))
    message = str(err.value)
    assert message.startswith(
        "W.json: apps.traffic.slo_s: expected modules some harpagon plan serves within an hour "
        "(the largest SLO a workload names); "
    )
    assert message.endswith(
        " s, the smallest end-to-end worst case a harpagon plan reaches, got 3600.0"
    )


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


OFF = {
    "dummy": {"dummy": False},
    "reassign": {"reassign": False},
    "merge": {"merge": False},
    "cost_direct": {"cost_direct": False},
    "exchange": {"exchange": False},
}


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_a_switch_switches_used_leaves_out_changes_no_plan(system: str) -> None:
    """`layerbatch plan` refuses the switches `switches_used` leaves out: each really changes
    nothing (here on traffic and ten generated workloads), and its list matches the systems'
    features (Harpagon Table III, Piccolo Table III)."""
    expected = {
        "harpagon": {"split", "dummy", "reassign", "merge", "cost_direct", "exchange"},
        "piccolo": {"split", "dummy", "reassign"},
        "optimal": {"dummy"},
    }.get(system, {"split"})
    assert switches_used(system) == expected
    docs = [traffic(), *generate(10, np.random.default_rng(3))]
    for doc in docs:
        w = parse_workload(doc)
        try:
            base: object = plan(w, system)
        except InputError as exc:
            base = str(exc)
        for switch, kwargs in OFF.items():
            if switch in expected:
                continue
            try:
                got: object = plan(w, system, **kwargs)  # type: ignore[arg-type]
            except InputError as exc:
                got = str(exc)
            assert got == base, (system, switch)
    if "split" not in expected:
        with pytest.raises(InputError, match="--split"):
            plan(parse_workload(traffic()), system, split="lc")


def test_a_split_that_is_not_lc_runs_no_merger_or_cost_direct() -> None:
    assert switches_used("harpagon", "throughput") == {"split", "dummy", "reassign", "exchange"}
    assert switches_used("harpagon", "exact") == {"split", "dummy"}  # a search: nothing after
    with pytest.raises(InputError, match="--split"):
        switches_used("harpagon", "quantized:0")


def _misspell(doc: dict[str, Any], path: tuple[Any, ...], wrong: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[wrong] = parent.pop(path[-1])
    return out


@pytest.mark.parametrize(
    ("path", "wrong", "message"),
    [
        (("apps",), "app", "W.json: app: expected only the keys hardware, modules, apps "
         "(unknown key; did you mean apps?)"),
        (("hardware", "P100", "price"), "prise", "W.json: hardware.P100.prise: expected only "
         "the keys price (unknown key; did you mean price?)"),
        (("modules", "M1", "profile"), "profiles", "W.json: modules.M1.profiles: expected only "
         "the keys profile (unknown key; did you mean profile?)"),
        (("modules", "M2", "profile", 0, "concurrency"), "concurency",
         "W.json: modules.M2.profile[0].concurency: expected only the keys hardware, batch, "
         "concurrency, duration_s (unknown key; did you mean concurrency?)"),
        (("apps", "traffic", "slo_s"), "slo", "W.json: apps.traffic.slo: expected only the keys "
         "edges, rate_rps, slo_s (unknown key; did you mean slo_s?)"),
    ],
)  # fmt: skip
def test_a_misspelt_key_is_refused_not_read_as_its_default(
    path: tuple[Any, ...], wrong: str, message: str
) -> None:
    """A misspelt `concurrency` was read as 1, a misspelt `edges` as none: now refused."""
    assert refused(_misspell(traffic(), path, wrong)) == message

"""`layerbatch plan`: a workload file in, the plan document out; bad files refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import layerbatch

WORKLOAD = {
    "hardware": {"P100": {"price": 1.0}, "V100": {"price": 1.8}},
    "modules": {
        "M1": {
            "profile": [
                {"hardware": "P100", "batch": 2, "concurrency": 1, "duration_s": 0.16},
                {"hardware": "P100", "batch": 8, "concurrency": 1, "duration_s": 0.4},
                {"hardware": "V100", "batch": 8, "concurrency": 1, "duration_s": 0.2},
            ]
        },
        "M2": {
            "profile": [
                {"hardware": "P100", "batch": 4, "concurrency": 1, "duration_s": 0.2},
                {"hardware": "V100", "batch": 16, "concurrency": 1, "duration_s": 0.3},
            ]
        },
    },
    "apps": {"traffic": {"edges": [["M1", "M2"]], "rate_rps": {"M1": 100, "M2": 60}, "slo_s": 1.5}},
}


def write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_plan_json_fits_the_slo_and_serves_every_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert layerbatch.main(["plan", "--workload", write(tmp_path, WORKLOAD), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["e2e_latency_s"]["traffic"] <= 1.5 + 1e-9
    assert doc["runtime_ms"] >= 0
    for name, rate in (("M1", 100), ("M2", 60)):
        m = doc["modules"][name]
        served = sum(c["rate_rps"] for c in m["configs"])
        assert served == pytest.approx(rate + m["dummy_rps"])
    # cost = sum of price x machines (frame-rate proportional machines)
    price = {"P100": 1.0, "V100": 1.8}
    total = sum(
        price[c["hardware"]] * c["machines"] for m in doc["modules"].values() for c in m["configs"]
    )
    assert doc["cost"] == pytest.approx(total)


def test_one_config_per_module_never_costs_less(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, WORKLOAD)
    layerbatch.main(["plan", "--workload", path, "--json"])
    anyc = json.loads(capsys.readouterr().out)["cost"]
    layerbatch.main(["plan", "--workload", path, "--json", "--configs", "1"])
    one = json.loads(capsys.readouterr().out)["cost"]
    assert one >= anyc - 1e-9


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["apps"]["traffic"]["edges"].append(["M2", "M1"]), "M1 -> M2 -> M1"),
        (lambda d: d["modules"].pop("M2"), "M2"),
        (lambda d: d["apps"]["traffic"].__setitem__("slo_s", 0.01), "slo_s"),
        (
            lambda d: d["modules"]["M2"]["profile"][1].__setitem__("duration_s", 1e300),
            "modules.M2.profile[1].duration_s: expected a latency of at most 3600 s (one hour), "
            "got 1e+300",
        ),
    ],
)
def test_bad_workloads_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: object, needle: str
) -> None:
    doc = json.loads(json.dumps(WORKLOAD))
    mutate(doc)  # type: ignore[operator]
    path = write(tmp_path, doc)
    assert layerbatch.main(["plan", "--workload", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    assert err.startswith(f"layerbatch: {path}: ")  # the file named, found parsing or planning


def test_budgets_along_the_chain_fit_the_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Once M1 0.700 + M2 1.004 s for a 1.5 s SLO: the reassigner gave M1 the slack left by M2's
    # worst case, not by its budget. budget_s is now the final split: worst case x SLO / path.
    assert layerbatch.main(["plan", "--workload", write(tmp_path, WORKLOAD), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m1, m2 = doc["modules"]["M1"], doc["modules"]["M2"]
    assert m1["budget_s"] + m2["budget_s"] <= 1.5 + 1e-9
    assert m1["wcl_s"] <= m1["budget_s"] and m2["wcl_s"] <= m2["budget_s"]
    e2e = doc["e2e_latency_s"]["traffic"]
    assert m1["budget_s"] == pytest.approx(m1["wcl_s"] * 1.5 / e2e)


def test_infeasible_slo_names_the_smallest_feasible_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(json.dumps(WORKLOAD))
    doc["apps"]["traffic"]["slo_s"] = 0.01
    assert layerbatch.main(["plan", "--workload", write(tmp_path, doc)]) == 2
    err = capsys.readouterr().err.strip()
    found = re.search(r"at least ([0-9.]+) s", err)
    assert found is not None, err
    doc["apps"]["traffic"]["slo_s"] = float(found.group(1))
    assert layerbatch.main(["plan", "--workload", write(tmp_path, doc), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["e2e_latency_s"]["traffic"] <= doc["apps"]["traffic"]["slo_s"] + 1e-9


def test_the_readmes_workload_example_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    after = readme.split("W.json names hardware", 1)[1]
    example = after.split("```json\n", 1)[1].split("```", 1)[0]
    assert layerbatch.main(["plan", "--workload", write(tmp_path, json.loads(example))]) == 0
    assert capsys.readouterr().out.startswith("cost ")


@pytest.mark.parametrize(
    "argv",
    [
        ["--system", "harpagon", "--no-dummy", "--no-reassign", "--no-merge", "--no-cost-direct",
         "--no-exchange", "--split", "lc"],
        ["--system", "piccolo", "--no-dummy", "--no-reassign", "--split", "throughput"],
        ["--system", "optimal", "--no-dummy"],
        ["--system", "nexus", "--split", "even"],
    ],
)  # fmt: skip
def test_plan_takes_every_switch_of_the_system_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert layerbatch.main(["plan", "--workload", write(tmp_path, WORKLOAD), *argv]) == 0
    assert capsys.readouterr().out.startswith("cost ")

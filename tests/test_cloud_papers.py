"""The worked examples of Harpagon (paper 001) and Piccolo (paper 000), as issue 7 lists them."""

from __future__ import annotations

import pytest

from scheduler.cloud import parse_workload, plan
from scheduler.cloud.configs import schedule_module
from scheduler.cloud.latency import Assignment, module_latency_s, single_config_latency_s
from scheduler.cloud.split import latency_cost_efficiency
from scheduler.cloud.workload import Config


def profile(*rows: tuple[int, float]) -> list[Config]:
    """One homogeneous machine type at price 1.0: (batch, duration_s) rows."""
    return [Config("GPU", b, 1, d, 1.0) for b, d in rows]


# Harpagon Table I; Piccolo Table I.
H_M1 = profile((2, 0.160), (4, 0.200), (8, 0.320))
H_M3 = profile((2, 0.100), (8, 0.250), (32, 0.800))
P_M1 = profile((5, 0.100), (20, 0.250), (100, 1.000))
P_M2 = profile((2, 0.125), (4, 0.160), (8, 0.267))
P_M3 = profile((2, 0.167), (4, 0.200), (8, 0.320))


def summary(p: object) -> list[tuple[int, float]]:
    assert p is not None
    return [(a.config.batch, round(a.machines, 9)) for a in p.assignments]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("dispatch", "max_tuples", "dummy", "cost", "sets"),
    [
        ("rr", 2, "none", 6.3, [(8, 6.0), (2, 0.3)]),  # S1
        ("tc", 2, "none", 5.9, [(32, 4.0), (2, 1.9)]),  # S2
        ("tc", None, "none", 5.3, [(32, 4.0), (8, 1.0), (2, 0.3)]),  # S3
        ("tc", None, "harpagon", 5.0, [(32, 5.0)]),  # S4: 2 req/s of dummy requests
    ],
)
def test_harpagon_table_ii(dispatch, max_tuples, dummy, cost, sets) -> None:  # type: ignore[no-untyped-def]
    got = schedule_module(H_M3, 198.0, 1.0, dispatch, max_tuples, dummy)
    assert got is not None
    assert got.cost == pytest.approx(cost)
    assert summary(got) == sets
    assert got.wcl_s <= 1.0 + 1e-9
    assert got.dummy_rps == pytest.approx(2.0 if dummy == "harpagon" else 0.0)


def test_harpagon_s2_needs_partial_machine_after_full_siblings() -> None:
    # Batch 8 for the 38 req/s residual: its full machine collects at 38 req/s (0.46 s) but its
    # partial machine only at 6 req/s (0.25 + 8/6 > 1.0 s), which is why S2 costs 5.9, not 5.19.
    b8 = H_M3[1]
    assert module_latency_s([Assignment(H_M3[2], 160.0), Assignment(b8, 38.0)], "tc") > 1.0


def test_harpagon_m1_at_100_rps() -> None:
    tc = [single_config_latency_s(c, 100.0, "tc") for c in H_M1]
    assert tc == pytest.approx([0.18, 0.24, 0.40])
    assert [single_config_latency_s(c, 100.0, "2d") for c in H_M1] == pytest.approx(
        [0.32, 0.40, 0.64]
    )
    batch_aware = schedule_module(H_M1, 100.0, 0.4, "tc", None, "none")
    round_robin = schedule_module(H_M1, 100.0, 0.4, "rr", None, "none")
    assert summary(batch_aware) == [(8, 4.0)]
    assert summary(round_robin) == [(4, 5.0)]


def test_latency_cost_efficiency() -> None:
    b2, b4, b8 = H_M1
    assert latency_cost_efficiency(b2, b4, 100.0, "tc") == pytest.approx(50.0)
    assert latency_cost_efficiency(b2, b8, 100.0, "tc") == pytest.approx(18.2, abs=0.05)
    b5, b20, b100 = P_M1
    assert latency_cost_efficiency(b5, b20, 100.0, "tc") == pytest.approx(2.50)
    assert latency_cost_efficiency(b5, b100, 100.0, "tc") == pytest.approx(0.54, abs=0.005)


@pytest.mark.parametrize(
    ("dispatch", "max_tuples", "dummy", "cost"),
    [
        ("rr", 2, "none", 3.7),
        ("tc", 2, "none", 3.7),
        ("tc", None, "none", 3.1),
        ("tc", None, "piccolo", 3.0),
        ("tc", None, "harpagon", 3.0),
    ],
)
def test_piccolo_m1_at_285_rps(dispatch, max_tuples, dummy, cost) -> None:  # type: ignore[no-untyped-def]
    got = schedule_module(P_M1, 285.0, 2.0, dispatch, max_tuples, dummy)
    assert got is not None
    assert got.cost == pytest.approx(cost)
    if dummy == "piccolo":
        assert got.dummy_rps == pytest.approx(15.0)  # 100 / (2.0 - 1.0) - 85
        assert summary(got) == [(100, 3.0)]


def test_piccolo_tc_dispatch_example() -> None:
    a_b = Config("GPU", 6, 1, 2.0, 1.0)
    c = Config("GPU", 2, 1, 1.0, 1.0)
    machines = [Assignment(a_b, 6.0), Assignment(c, 2.0)]  # A and B at 3 req/s each, C at 2
    assert module_latency_s(machines, "tc") == pytest.approx(2.75)
    assert module_latency_s(machines, "2d") == pytest.approx(4.0)  # not the misprinted 3.375


def test_piccolo_table_ii_row_1_under_2d() -> None:
    m2 = schedule_module(P_M2, 50.0, 0.25, "2d", 1, "none")
    m3 = schedule_module(P_M3, 40.0, 0.65, "2d", 1, "none")
    assert summary(m2) == [(2, 3.125)] and summary(m3) == [(8, 1.6)]
    assert m2 is not None and m3 is not None
    assert m2.cost + m3.cost == pytest.approx(4.725)  # 3.125 + 1.6, printed as 4.73


def test_piccolo_table_ii_row_2_is_what_the_splitter_finds() -> None:
    doc = {
        "hardware": {"GPU": {"price": 1.0}},
        "modules": {
            name: {
                "profile": [
                    {
                        "hardware": "GPU",
                        "batch": c.batch,
                        "concurrency": 1,
                        "duration_s": c.duration_s,
                    }
                    for c in prof
                ]
            }
            for name, prof in (("M2", P_M2), ("M3", P_M3))
        },
        "apps": {"app": {"edges": [["M2", "M3"]], "rate_rps": {"M2": 50, "M3": 40}, "slo_s": 0.9}},
    }
    got = plan(parse_workload(doc), dispatch="2d", max_configs=1, dummy=False)
    assert got["cost"] == pytest.approx(4.00)
    assert got["modules"]["M2"]["budget_s"] == pytest.approx(0.40)
    assert got["modules"]["M3"]["budget_s"] == pytest.approx(0.50)
    assert [c["batch"] for c in got["modules"]["M2"]["configs"]] == [4]
    assert [c["batch"] for c in got["modules"]["M3"]["configs"]] == [4]

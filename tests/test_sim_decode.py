"""Decodes on the device in the simulator (`simulate(decode_ms=...)`): each admitted request is
decoded on its device, between steps, before it joins the queue, as on a server that decodes on
its executor thread; the plans count it in the first stage, the device runs that stage in its own
time."""

from __future__ import annotations

import numpy as np
import pytest

import layerbatch
from scheduler.deployment import Deployment
from scheduler.policies import make_policy
from scheduler.profile import load_profile, parse_profile
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import Workload, make_workload
from tests.sim_cases import GOOGLENET, GOOGLENET_V100, cli_json, googlenet_sim_args, profile_doc

# One model "m", two stages, one per group: 10 ms and 20 ms alone, 12 ms and 22 ms for two.
TINY = profile_doc([[10.0, 12.0], [20.0, 22.0]], batch_sizes=(1, 2), max_batch=4)

# q0 at 0 ms, q1 at 5 ms (while q0's first step runs), q2 at 100 ms; deadlines far away.
THREE = Workload((0.0, 5.0, 100.0), ("m",) * 3, 1000.0, 10)


@pytest.fixture(scope="module")
def tiny() -> Deployment:
    return Deployment([parse_profile(TINY)], groups=2)


def runs_ms(log: list[tuple[float, str, str]] | None) -> list[float]:
    return [t for t, kind, _ in log or [] if kind == "run"]


def test_each_decode_holds_back_the_next_step(tiny: Deployment) -> None:
    """nobatch, 2 ms a decode, by hand: q0 arrives to an idle device, is decoded 0 -> 2 and runs
    stage 0 in its profiled 10 ms (not the plans' 12), 2 -> 12. q1, arriving while it runs, is
    decoded when it ends, 12 -> 14, before q0's stage 1 (14 -> 34); q1 then runs 34 -> 64. q2
    finds the device idle again: 100 -> 102 -> 132."""
    out = simulate(tiny, make_policy("nobatch"), THREE, keep_log=True, decode_ms=2.0)
    assert runs_ms(out.log) == [2.0, 14.0, 34.0, 44.0, 102.0, 112.0]
    assert out.latency_ms == {"q0": 34.0, "q1": 59.0, "q2": 32.0}
    assert out.queue_ms == {"q0": 2.0, "q1": 29.0, "q2": 2.0}
    assert out.busy_ms == pytest.approx(3 * 30.0 + 3 * 2.0)  # the decodes are device time
    assert simulate(tiny, make_policy("nobatch"), THREE, decode_ms=0.0).latency_ms == {
        "q0": 30.0, "q1": 55.0, "q2": 30.0,
    }  # fmt: skip


def test_decodes_overlap_the_gap_between_steps(tiny: Deployment) -> None:
    """As above with 1 ms between steps: q1's decode after q0's first step (12 -> 14) covers that
    gap (12 -> 13), so q0's stage 1 starts at 14, not 15; later steps keep their 1 ms gaps."""
    out = simulate(
        tiny, make_policy("nobatch"), THREE, keep_log=True, decode_ms=2.0, step_gap_ms=1.0
    )
    assert runs_ms(out.log) == [2.0, 14.0, 35.0, 46.0, 102.0, 113.0]


def test_decodes_take_turns_with_steps_in_the_order_they_came(tiny: Deployment) -> None:
    """nobatch, 2 ms a decode, a request every ms from 0 to 9 ms, by hand. q0 finds the device idle:
    decoded 0 -> 2, it joins the queue and runs stage 0, 2 -> 12. q1 (at 1 ms) came while the
    device decoded q0 (q2 at the instant it ended), so its decode waits for that step, as on
    the server's executor thread; q1..q9 are decoded 12 -> 30 and join one by one; the next
    step starts at 30."""
    burst = Workload(tuple(float(t) for t in range(10)), ("m",) * 10, 1000.0, 10)
    out = simulate(tiny, make_policy("nobatch"), burst, keep_log=True, decode_ms=2.0)
    assert runs_ms(out.log)[:2] == [2.0, 30.0]
    decoded = [(t, rid) for t, kind, rid in out.log or [] if kind == "decoded"]
    assert decoded == [(2.0, "q0")] + [(12.0 + 2 * i, f"q{i}") for i in range(1, 10)]
    assert len(out.on_time) == 10


def test_the_plans_count_the_decode_and_a_dropped_request_still_cost_it(
    tiny: Deployment,
) -> None:
    """dp-tardy, two requests at once, 2 ms a decode, by hand. Both are decoded 0 -> 4; the plan
    made then counts the decode in stage 0 as the server's plans do (12 ms alone, 16 ms for
    two), so it sees the pair done at 4 + 16 + 22 = 42. With a 42 ms deadline the pair runs
    4 -> 16 -> 38 (stage 0 in its profiled 12 ms); with 41 ms the plan runs one alone
    (4 -> 14 -> 34) and drops the other, whose decode the device had already paid."""
    out = simulate(tiny, make_policy("dp-tardy"), Workload((0.0, 0.0), ("m",) * 2, 42.0, 10),
                   decode_ms=2.0)  # fmt: skip
    assert out.latency_ms == {"q0": 38.0, "q1": 38.0} and out.on_time == {"q0", "q1"}
    tight = Workload((0.0, 0.0), ("m",) * 2, 41.0, 10)
    out = simulate(tiny, make_policy("dp-tardy"), tight, decode_ms=2.0)
    assert len(out.dropped) == 1 and list(out.latency_ms.values()) == [34.0]
    assert out.busy_ms == pytest.approx(4.0 + 30.0)
    # without decodes the pair (12 + 22 ms) makes the same deadline
    assert simulate(tiny, make_policy("dp-tardy"), tight).on_time == {"q0", "q1"}


def test_under_overload_decodes_cost_capacity_and_no_request_is_lost() -> None:
    googlenet = Deployment([load_profile(GOOGLENET_V100)])
    rng = np.random.default_rng(5)
    w = make_workload(googlenet, 3000, 400, "poisson", {GOOGLENET: 1}, 150, rng)
    policy = "dp-tardy"
    free = simulate(googlenet, make_policy(policy), w, replicas=2, admission_share=2 / 3)
    paid = simulate(
        googlenet, make_policy(policy), w, replicas=2, admission_share=2 / 3, decode_ms=1.0
    )
    for out in (free, paid):
        assert set(out.latency_ms) | set(out.dropped) == {f"q{i}" for i in range(len(w.arrival_ms))}
        assert not set(out.latency_ms) & set(out.dropped)
    assert summarise(paid)["on_time_ratio"] < summarise(free)["on_time_ratio"]


def test_a_negative_decode_time_is_refused(tiny: Deployment) -> None:
    with pytest.raises(ValueError, match="decode_ms: expected a time of at least 0 ms, got -1"):
        simulate(tiny, make_policy("nobatch"), THREE, decode_ms=-1.0)


def test_sim_and_capacity_cli_take_the_decode(capsys: pytest.CaptureFixture[str]) -> None:
    args = googlenet_sim_args(200)
    free = cli_json(capsys, args)
    paid = cli_json(capsys, [*args, "--decode-ms", "1.5"])
    assert paid["utilisation"] > free["utilisation"]
    assert paid["mean_ms"] > free["mean_ms"]
    for bad in ("-1", "nan", "two"):
        assert layerbatch.main([*args, "--decode-ms", bad]) == 2
        err = capsys.readouterr().err
        assert "--decode-ms" in err and "a finite number >= 0" in err
    cap = ["sim", "capacity", "--profile", "googlenet-v3-pytorch-V100", "--policies", "dp-tardy"]
    cap += ["--rates", "100,200,300,400", "--requests", "300", "--deadline-ms", "150", "--json"]
    free_cap = cli_json(capsys, cap)
    paid_cap = cli_json(capsys, [*cap, "--decode-ms", "2"])
    # 2 ms a request beside googlenet's few ms a sample on a V100: a far lower capacity
    assert paid_cap["capacity_rps"]["dp-tardy"] < free_cap["capacity_rps"]["dp-tardy"]

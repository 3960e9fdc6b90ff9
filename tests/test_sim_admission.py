"""Admission on arrival in the simulator (`simulate(admission_share=...)`, `layerbatch sim
--admission-share`): the server's rule (scheduler/admission.py), applied to the same queue."""

from __future__ import annotations

import numpy as np
import pytest

import layerbatch
from scheduler.deployment import Deployment
from scheduler.policies import make_policy
from scheduler.policies.common import QUEUE_FULL_AHEAD
from scheduler.profile import load_profile, parse_profile
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import Workload, make_workload
from tests.sim_cases import GOOGLENET, GOOGLENET_V100, cli_json, googlenet_sim_args, profile_doc

# One model "m", two stages in one group: a request costs 30 ms alone, 34 ms in a pair (17 ms a
# sample, its tail), and a batch of up to 2.
TINY = profile_doc([[10.0, 12.0], [20.0, 22.0]], batch_sizes=(1, 2), max_batch=2)


@pytest.fixture(scope="module")
def tiny() -> Deployment:
    return Deployment([parse_profile(TINY)], groups=1)


@pytest.fixture(scope="module")
def googlenet() -> Deployment:
    return Deployment([load_profile(GOOGLENET_V100)])


def test_three_at_once_the_third_finds_no_room(tiny: Deployment) -> None:
    """By hand, deadline 40 ms, share 1: q0 needs 17 ms of its 40, q1 17 + 17 = 34, q2 51 > 40:
    q2 is turned away on arrival; q0 and q1 run as a pair, done at 34 ms, on time."""
    assert tiny.tail_ms("m", 0) == pytest.approx(17.0)
    three = Workload(arrival_ms=(0.0, 0.0, 0.0), apps=("m",) * 3, deadline_ms=40.0, rate_rps=10)
    out = simulate(tiny, make_policy("dp-tardy"), three, keep_log=True, admission_share=1.0)
    assert out.dropped == {"q2": QUEUE_FULL_AHEAD}
    assert out.latency_ms == pytest.approx({"q0": 34.0, "q1": 34.0})
    assert out.on_time == {"q0", "q1"}
    assert out.log is not None and (0.0, "drop", "q2") in out.log
    s = summarise(out)
    assert (s["dropped"], s["turned_away"]) == (1, 1)
    # before any drop the queue is not overloaded: a smaller share admits the same
    out = simulate(tiny, make_policy("dp-tardy"), three, admission_share=0.5)
    assert out.dropped == {"q2": QUEUE_FULL_AHEAD} and out.on_time == {"q0", "q1"}


def test_the_share_holds_from_a_drop_until_an_arrival_finds_the_queue_empty(
    tiny: Deployment,
) -> None:
    """By hand, deadline 70 ms. At 0: q0..q3 fill 68 ms, q4 (85) is turned away, and the queue
    is overloaded. At 35 ms q5 finds q2 and q3 running (34 ms counted from their start) and
    needs 51: within its 70 ms, not within half of them. At 300 ms the queue is empty again:
    q6, q7 and q8 need 17, 34 and 51, all admitted as within 70 (q8 not within 35)."""
    arrivals = (0.0,) * 5 + (35.0, 300.0, 300.0, 300.0)
    w = Workload(arrival_ms=arrivals, apps=("m",) * 9, deadline_ms=70.0, rate_rps=10)
    everyone = {f"q{i}" for i in range(9)}
    out = simulate(tiny, make_policy("dp-tardy"), w, admission_share=1.0)
    assert out.dropped == {"q4": QUEUE_FULL_AHEAD}
    assert out.on_time == everyone - {"q4"}
    assert out.latency_ms["q5"] == pytest.approx(63.0)  # after the pair, done at 98 of 105
    out = simulate(tiny, make_policy("dp-tardy"), w, admission_share=0.5)
    assert out.dropped == {"q4": QUEUE_FULL_AHEAD, "q5": QUEUE_FULL_AHEAD}
    assert out.on_time == everyone - {"q4", "q5"}


def overload(d: Deployment) -> Workload:
    return make_workload(d, 3000, 600, "poisson", {GOOGLENET: 1}, 150, np.random.default_rng(3))


def test_under_overload_the_newest_are_turned_away_and_none_is_lost(
    googlenet: Deployment,
) -> None:
    w = overload(googlenet)
    out = simulate(googlenet, make_policy("dp-tardy"), w, admission_share=2 / 3, replicas=2)
    turned = {r for r, why in out.dropped.items() if why == QUEUE_FULL_AHEAD}
    assert 0 < len(turned) < 600
    assert turned.isdisjoint(out.queue_ms)  # never ran a step
    assert set(out.latency_ms) | set(out.dropped) == {f"q{i}" for i in range(600)}
    assert summarise(out)["turned_away"] == len(turned)
    # off, or under a policy that serves late requests rather than drop them: none turned away
    for policy, share in (("dp-tardy", None), ("dp-time", 2 / 3)):
        out = simulate(googlenet, make_policy(policy), w, admission_share=share, replicas=2)
        assert QUEUE_FULL_AHEAD not in out.dropped.values()


def test_sim_cli_admission_share(capsys: pytest.CaptureFixture[str]) -> None:
    args = googlenet_sim_args(1000)
    plain = cli_json(capsys, args)
    admitted = cli_json(capsys, [*args, "--admission-share", "0.5"])
    assert plain["turned_away"] == 0 < admitted["turned_away"] <= admitted["dropped"]
    for bad in ("0", "1.5", "half"):
        assert layerbatch.main([*args, "--admission-share", bad]) == 2
        err = capsys.readouterr().err
        assert "--admission-share" in err and "a share of the deadline in (0, 1]" in err

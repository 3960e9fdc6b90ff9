"""`irina` and `tfs` (paper 002): the paper's three illustrations (section 2), in the policy and
through the simulator, with the paper's numbers.

Models are split into equal stages (the paper's numbers are whole-model latencies; a layer-wise
model can stop at any stage boundary, so with 20 stages a preemption waits at most 1/20 of the
running batch). Average JCT weighs each request (sample) once, as Irina's formula does.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from scheduler.deployment import Deployment
from scheduler.policies import make_policy
from scheduler.policies.irina import Irina
from scheduler.profile import parse_profile
from scheduler.types import App, Request
from sim.simulator import simulate
from sim.workload import Workload

STAGES = 20


def profile(
    model: str,
    batch_latency_ms: dict[int, float],
    stages: int = STAGES,
    peak_per_sample: int = 0,
    stacking: dict[str, float] | None = None,
) -> Any:
    sizes = sorted(batch_latency_ms)
    doc = {
        "format": "layerbatch.profile/1",
        "model": model,
        "device": "paper-002",
        "input": {"shape": [3, 8, 8], "dtype": "float32"},
        "batch_sizes": sizes,
        "stages": [
            {
                "name": f"{model}.{k}",
                "latency_ms": [batch_latency_ms[b] / stages for b in sizes],
                "out_bytes": 0,
                "peak_bytes": peak_per_sample,
            }
            for k in range(stages)
        ],
        "max_batch": max(sizes),
        "stacking": {m: {"slowdown": f} for m, f in (stacking or {}).items()},
    }
    return parse_profile(doc, f"{model}.json")


def deployment(*profiles: Any) -> Deployment:
    # one layer group per stage: every stage boundary is an exit check
    return Deployment(profiles, [App(p.model, (p.model,)) for p in profiles], groups=STAGES)


def workload(arrivals: list[tuple[float, str]], deadline_ms: float) -> Workload:
    return Workload(tuple(t for t, _ in arrivals), tuple(a for _, a in arrivals), deadline_ms, 1.0)


def mean_jct(out: Any) -> float:
    assert not out.dropped
    return sum(out.latency_ms.values()) / len(out.latency_ms)


# Table 1: A(4) 60, A(8) 75, A(16) 85, A(32) 150 ms; B(128) 8, B(256) 10 ms
A = profile("A", {4: 60.0, 8: 75.0, 16: 85.0, 32: 150.0})
B = profile("B", {128: 8.0, 256: 10.0})


def test_batching_illustration() -> None:
    """8 queries of A at 0 ms, 8 more at 1 ms: FIFO averages 112 ms; batching the second eight
    into the running batch averages about 86 ms (paper: 86)."""
    d = deployment(A)
    w = workload([(0.0, "A")] * 8 + [(1.0, "A")] * 8, 1000.0)
    fifo = mean_jct(simulate(d, make_policy("dynamic"), w))
    assert fifo == pytest.approx((8 * 75 + 8 * 149) / 16)  # 112
    out = simulate(d, make_policy("irina"), w, keep_log=True)
    irina = mean_jct(out)
    # the 8 late ones catch up one stage alone (3.75 ms), then all 16 run the other 19 stages
    catch_up = 75.0 / STAGES
    end = 75.0 / STAGES + catch_up + 85.0 * (STAGES - 1) / STAGES
    assert irina == pytest.approx((8 * end + 8 * (end - 1.0)) / 16)
    assert irina < 88.0
    assert any(kind == "run" and "x16" in what for _, kind, what in out.log or [])


def test_batching_is_the_strategy_chosen() -> None:
    d = deployment(A)
    plan = _plan_at(d, [("a", "A", 0.0)] * 8, [("n", "A", 1.0)] * 8, run_at=0.0, now=1.0)
    assert plan.notes == {"strategy_batch": 1.0}


def test_preemption_illustration() -> None:
    """8 queries of A at 0 ms, 256 of B at 1 ms (SLO 200 ms): FIFO averages about 84 ms;
    preempting A at its next stage boundary averages about 12.3 ms (paper: 84.69 and 12.30)."""
    d = deployment(A, B)
    w = workload([(0.0, "A")] * 8 + [(1.0, "B")] * 256, 200.0)
    fifo = mean_jct(simulate(d, make_policy("dynamic"), w))
    assert fifo == pytest.approx((8 * 75 + 256 * 84) / 264)
    irina = mean_jct(simulate(d, make_policy("irina"), w))
    boundary = 75.0 / STAGES  # A's first stage ends at 3.75 ms; B runs from there
    expected = (256 * (boundary + 10.0 - 1.0) + 8 * (boundary + 10.0 + 75.0 - boundary)) / 264
    assert irina == pytest.approx(expected)
    assert irina == pytest.approx(12.30, abs=3.0)


def test_preemption_is_the_strategy_chosen() -> None:
    d = deployment(A, B)
    plan = _plan_at(d, [("a", "A", 0.0)] * 8, [("n", "B", 1.0)] * 256, run_at=0.0, now=1.0,
                    deadline=200.0)  # fmt: skip
    assert plan.notes == {"strategy_preempt": 1.0}
    assert plan.actions[0].model == "A" and plan.actions[0].stages == (0, 1)
    assert plan.actions[1].model == "B"


# Table 2: C(10) 200 ms, peak 65% of memory; D(100) 10 ms, peak 35%. No interference (the paper
# leaves it out of its example): slowdown 1 both ways.
C = profile("C", {1: 20.0, 10: 200.0}, peak_per_sample=65, stacking={"D": 1.0})
D = profile("D", {1: 0.1, 100: 10.0}, peak_per_sample=0, stacking={"C": 1.0})
D_PEAK = profile("D", {1: 0.1, 100: 10.0}, peak_per_sample=1, stacking={"C": 1.0})


def test_stacking_illustration() -> None:
    """10 queries of C at 0 ms, 100 of D at 160 ms (SLO 250 ms): FIFO averages 63.6 ms;
    stacking D beside C averages 27.3 ms (paper: 27.3), better than preempting C (28.2)."""
    d = deployment(C, D_PEAK)
    w = workload([(0.0, "C")] * 10 + [(160.0, "D")] * 100, 250.0)
    fifo = mean_jct(simulate(d, make_policy("dynamic"), w))
    assert fifo == pytest.approx((10 * 200 + 100 * 50) / 110)
    out = simulate(d, Irina(memory_bytes=1000.0), w, keep_log=True)
    assert mean_jct(out) == pytest.approx((10 * 200 + 100 * 10) / 110)  # 27.27
    assert any(kind == "stack" for _, kind, _ in out.log or [])


def test_stacking_needs_memory_and_then_preemption_wins() -> None:
    # 65% x 10 + 1% x 100 = 750 units: over a 700-unit budget, so Irina preempts C instead
    d = deployment(C, D_PEAK)
    w = workload([(0.0, "C")] * 10 + [(160.0, "D")] * 100, 250.0)
    out = simulate(d, Irina(memory_bytes=700.0), w, keep_log=True)
    assert not any(kind == "stack" for _, kind, _ in out.log or [])
    assert mean_jct(out) == pytest.approx((10 * 210 + 100 * 10) / 110)  # 28.2


def test_stacking_slowdown_stretches_both_lanes() -> None:
    # D arrives mid-stage (155 ms): preempting would make it wait 5 ms for C's boundary
    slow_c = profile("C", {1: 20.0, 10: 200.0}, peak_per_sample=1, stacking={"D": 1.5})
    slow_d = profile("D", {1: 0.1, 100: 10.0}, peak_per_sample=1, stacking={"C": 1.2})
    d = deployment(slow_c, slow_d)
    w = workload([(0.0, "C")] * 10 + [(155.0, "D")] * 100, 250.0)
    out = simulate(d, Irina(), w, keep_log=True)
    assert any(kind == "stack" for _, kind, _ in out.log or [])
    # D runs 10 ms x 1.2 = 12 ms beside C; C runs 1.5x slower during those 12 ms, so it
    # loses 12 x (1 - 1/1.5) = 4 ms
    d_latency = [v for k, v in out.latency_ms.items() if int(k[1:]) >= 10]
    c_latency = [v for k, v in out.latency_ms.items() if int(k[1:]) < 10]
    assert d_latency == pytest.approx([12.0] * 100)
    assert c_latency == pytest.approx([204.0] * 10)


def test_a_costly_stack_loses_to_preemption_at_a_boundary() -> None:
    # at 160 ms C stands exactly at a stage boundary: preempting costs D nothing, while
    # stacking would slow D 2x and C 1.5x
    slow_c = profile("C", {1: 20.0, 10: 200.0}, peak_per_sample=1, stacking={"D": 1.5})
    slow_d = profile("D", {1: 0.1, 100: 10.0}, peak_per_sample=1, stacking={"C": 2.0})
    d = deployment(slow_c, slow_d)
    w = workload([(0.0, "C")] * 10 + [(160.0, "D")] * 100, 250.0)
    out = simulate(d, Irina(), w, keep_log=True)
    assert not any(kind == "stack" for _, kind, _ in out.log or [])
    assert mean_jct(out) == pytest.approx((10 * 210 + 100 * 10) / 110)


def test_stacking_chosen_in_the_policy() -> None:
    d = deployment(C, D)
    plan = _plan_at(d, [("c", "C", 0.0)] * 10, [("n", "D", 155.0)] * 100, run_at=0.0,
                    now=155.0, deadline=250.0, policy=Irina(memory_bytes=1000.0))  # fmt: skip
    assert plan.notes == {"strategy_stack": 1.0}
    assert plan.beside is not None and plan.beside.model == "D"
    assert all(a.model == "C" for a in plan.actions)


def test_tfs_waits_for_as_many_as_the_deadline_allows() -> None:
    d = deployment(A)
    state_requests = [Request(f"a{i}", "A", 0, 0.0, 200.0) for i in range(8)]
    from scheduler.state import SchedulerState

    plan = make_policy("tfs").plan(SchedulerState(d, state_requests), 0.0)
    (action,) = plan.actions
    assert action.stages == (0, STAGES) and action.batch_size == 8
    assert action.not_before_ms == pytest.approx(200.0 - 150.0, abs=1e-3)  # a full batch: A(32)


def _plan_at(
    d: Deployment,
    running: list[tuple[str, str, float]],
    queued: list[tuple[str, str, float]],
    run_at: float,
    now: float,
    deadline: float = math.inf,
    policy: Any = None,
) -> Any:
    """Plan at `now` while the `running` requests' first action (one stage group) has run since
    `run_at`, as the engine shows it to the policy."""
    from scheduler.engine import Engine

    e = Engine(d, policy or make_policy("irina"))
    for i, (rid, app, t) in enumerate(running):
        e.add(Request(f"{rid}{i}", app, 0, t, t + deadline))
    step, _, _ = e.next_step(run_at)
    assert step is not None
    while step.end_ms < now:  # the running requests' groups that ended before `now`
        e.finish(len(step.stage_end_ms))
        step, _, _ = e.next_step(step.end_ms)
        assert step is not None
    for i, (rid, app, t) in enumerate(queued):
        e.add(Request(f"{rid}{i}", app, 0, t, t + deadline))
    e.replan(now)
    assert e.plan is not None
    return e.plan

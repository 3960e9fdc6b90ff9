"""Discrete-event simulator: the same scheduler, a profiled executor (DESIGN.md).

Events sit in a heap keyed (time_ms, priority, seq): at equal times a finishing step is handled
before an arrival, and an arrival before a wake-up. The device runs one step (a layer group of the
first action of the newest plan) at a time, each stage for exactly its profiled latency; the engine
re-plans at every arrival and after every step. When a plan made on an arrival no longer starts
with the running step, the step stops at its next stage boundary, as the server's executor does
at its exit check (`scheduler.engine`). Nothing here reads a clock except the optional `timer`
used to measure planning time, which never changes what is simulated.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.deployment import Deployment
from scheduler.engine import Dropped, Engine
from scheduler.types import Request, Scheduler
from sim.workload import Workload

STEP_DONE, ARRIVAL, WAKE = 0, 1, 2


@dataclass
class Outcome:
    """What happened to the requests of one run; `sim.metrics.summarise` turns it into numbers."""

    policy: str
    workload: Workload
    latency_ms: dict[str, float] = field(default_factory=dict)  # finished requests
    on_time: set[str] = field(default_factory=set)
    dropped: dict[str, str] = field(default_factory=dict)  # id -> reason
    batches: dict[tuple[str, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    busy_ms: float = 0.0
    end_ms: float = 0.0
    plan_us: list[float] = field(default_factory=list)
    log: list[tuple[float, str, str]] | None = None


def simulate(
    deployment: Deployment,
    policy: Scheduler,
    workload: Workload,
    timer: Callable[[], float] | None = None,
    keep_log: bool = False,
) -> Outcome:
    """Run `workload` through `policy` on one simulated device; see the module docstring."""
    engine = Engine(deployment, policy, timer)
    out = Outcome(policy.name, workload, log=[] if keep_log else None)
    deadline: dict[str, float] = {}
    arrival: dict[str, float] = {}
    heap: list[tuple[float, int, int, object]] = []
    seq = 0
    for i, (t, app) in enumerate(zip(workload.arrival_ms, workload.apps, strict=True)):
        rid = f"q{i}"
        heap.append((t, ARRIVAL, seq, Request(rid, app, 0, t, t + workload.deadline_ms)))
        seq += 1
    heapq.heapify(heap)
    wake_at: float | None = None
    token = 0  # identifies the live STEP_DONE event; a cancelled step's old one goes stale

    def note(t: float, kind: str, detail: str) -> None:
        if out.log is not None:
            out.log.append((round(t, 6), kind, detail))

    def record_drops(drops: list[Dropped]) -> None:
        for d in drops:
            out.dropped[d.request.id] = d.reason
            note(d.at_ms, "drop", d.request.id)

    def push(t: float, kind: int, payload: object) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, kind, seq, payload))
        seq += 1

    def try_start(now: float) -> None:
        nonlocal wake_at, token
        step, wake, drops = engine.next_step(now)
        record_drops(drops)
        if step is not None:
            a = step.action
            note(now, "run", f"{a.model}[{a.stages[0]}:{a.stages[1]}] x{a.batch_size}")
            token += 1
            push(step.end_ms, STEP_DONE, (token, len(step.stage_end_ms)))
        elif wake is not None and wake != wake_at:
            wake_at = wake
            push(wake, WAKE, None)

    def preempt(now: float) -> None:
        """The newest plan no longer starts with the running step: it stops at the next stage
        boundary (the stage running now finishes)."""
        nonlocal token
        step = engine.running
        assert step is not None
        done = step.stages_done_by(now)
        end = step.stage_end_ms[done - 1] if done else now
        if end < step.end_ms:
            token += 1
            push(end, STEP_DONE, (token, done))
            note(now, "cut", f"{step.action.model} after {done} of {len(step.stage_end_ms)}")

    while heap:
        now, kind, _, payload = heapq.heappop(heap)
        if kind == STEP_DONE:
            assert isinstance(payload, tuple)
            live, done = payload
            if live != token:
                continue  # the step was cancelled and ends earlier
            out.end_ms = now
            step = engine.running
            assert step is not None
            a = step.action
            out.busy_ms += now - step.start_ms
            for k in range(a.stages[0], a.stages[0] + done):
                out.batches[(a.model, k)].append(a.batch_size)
            for r in engine.finish(done):
                out.latency_ms[r.id] = now - arrival[r.id]
                if now <= deadline[r.id]:
                    out.on_time.add(r.id)
                note(now, "done", r.id)
            try_start(now)
        elif kind == ARRIVAL:
            out.end_ms = now
            assert isinstance(payload, Request)
            arrival[payload.id] = payload.arrival_ms
            deadline[payload.id] = payload.deadline_ms
            note(now, "arrive", payload.id)
            record_drops(engine.admit(payload, now))
            if engine.running is None:
                try_start(now)
            elif engine.wants_preemption():
                preempt(now)
        elif engine.running is None:
            out.end_ms = now
            wake_at = None
            try_start(now)
    out.plan_us = engine.plan_us
    return out

"""Discrete-event simulator: the same scheduler, a profiled executor (DESIGN.md).

Events sit in a heap keyed (time_ms, priority, seq): at equal times a finishing step is handled
before an arrival, and an arrival before a wake-up. The device runs one step (a layer group of the
first action of the newest plan) at a time, for exactly the profiled latency; the engine re-plans
at every arrival and after every step. Nothing here reads a clock except the optional `timer`
used to measure planning time, which never changes what is simulated.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.deployment import Deployment
from scheduler.engine import Dropped, Engine, Step
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
    busy = False
    wake_at: float | None = None

    def note(t: float, kind: str, detail: str) -> None:
        if out.log is not None:
            out.log.append((round(t, 6), kind, detail))

    def record_drops(drops: list[Dropped]) -> None:
        for d in drops:
            out.dropped[d.request.id] = d.reason
            note(d.at_ms, "drop", d.request.id)

    def try_start(now: float) -> None:
        nonlocal busy, seq, wake_at
        step, wake, drops = engine.next_step(now)
        record_drops(drops)
        if step is not None:
            busy = True
            out.busy_ms += step.end_ms - step.start_ms
            a = step.action
            for k in range(a.stages[0], a.stages[1]):
                out.batches[(a.model, k)].append(a.batch_size)
            note(now, "run", f"{a.model}[{a.stages[0]}:{a.stages[1]}] x{a.batch_size}")
            heapq.heappush(heap, (step.end_ms, STEP_DONE, seq, step))
            seq += 1
        elif wake is not None and wake != wake_at:
            wake_at = wake
            heapq.heappush(heap, (wake, WAKE, seq, None))
            seq += 1

    while heap:
        now, kind, _, payload = heapq.heappop(heap)
        out.end_ms = now
        if kind == STEP_DONE:
            assert isinstance(payload, Step)
            busy = False
            for r in payload.finished:
                out.latency_ms[r.id] = now - arrival[r.id]
                if now <= deadline[r.id]:
                    out.on_time.add(r.id)
                note(now, "done", r.id)
            try_start(now)
        elif kind == ARRIVAL:
            assert isinstance(payload, Request)
            arrival[payload.id] = payload.arrival_ms
            deadline[payload.id] = payload.deadline_ms
            note(now, "arrive", payload.id)
            record_drops(engine.admit(payload, now))
            if not busy:
                try_start(now)
        elif not busy:
            wake_at = None
            try_start(now)
    out.plan_us = engine.plan_us
    return out

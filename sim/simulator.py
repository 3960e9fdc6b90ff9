"""Discrete-event simulator: the same scheduler, a profiled executor (DESIGN.md).

Events sit in a heap keyed (time_ms, priority, seq): at equal times a finishing step is handled
before an arrival, and an arrival before a wake-up; arrivals at the same time are admitted
together and planned for once (a task of several queries, as the server does for arrivals in one
loop iteration). The device runs one step (a layer group of the
first action of the newest plan) at a time, each stage for exactly its profiled latency; the engine
re-plans at every arrival and after every step. When a plan made on an arrival no longer starts
with the running step, the step stops at its next stage boundary, as the server's executor does
at its exit check (`scheduler.engine`). A plan may put an action on a second lane beside the
running step (stacking); while both lanes run, each is slowed by its profiled stacking slowdown
(`sim.lanes`). With `step_gap_ms` the device starts no step sooner than that after the last one
ended: a server's hand-off between steps (its /v1/status `step_gap_ms`), which a request pays at
every step it waits through. Nothing here reads a clock except the optional `timer` used to
measure planning time, which never changes what is simulated.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.deployment import Deployment
from scheduler.engine import Dropped, Engine
from scheduler.types import Request, Scheduler, Step
from sim.lanes import Lane, slowdown
from sim.workload import Workload

STEP_DONE, BESIDE_DONE, ARRIVAL, WAKE = 0, 1, 2, 3


@dataclass
class Outcome:
    """What happened to the requests of one run; `sim.metrics.summarise` turns it into numbers."""

    policy: str
    workload: Workload
    latency_ms: dict[str, float] = field(default_factory=dict)  # finished requests
    queue_ms: dict[str, float] = field(default_factory=dict)  # arrival -> its first step starts
    in_steps_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
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
    step_gap_ms: float = 0.0,
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
    free_at = float("-inf")  # the device starts no step before this (step_gap_ms after the last)
    token = 0  # identifies the live STEP_DONE event; a cancelled step's old one goes stale
    side_token = 0  # the same for BESIDE_DONE
    main: Lane | None = None
    side: Lane | None = None
    cut: int | None = None  # stages the main step stops after, when it was preempted

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

    def retime(now: float) -> None:
        """The set of running models changed: new stage end times, new done events."""
        nonlocal token, side_token
        if main is not None:
            before = main.end_ms
            main.retime(now, slowdown(deployment, main.model, side.model if side else None))
            if main.end_ms != before and cut is None:
                token += 1
                push(main.end_ms, STEP_DONE, (token, len(main.ends_ms)))
            elif cut is not None:
                token += 1
                push(main.ends_ms[cut - 1] if cut else now, STEP_DONE, (token, cut))
        if side is not None:
            before = side.end_ms
            side.retime(now, slowdown(deployment, side.model, main.model if main else None))
            if side.end_ms != before:
                side_token += 1
                push(side.end_ms, BESIDE_DONE, (side_token, len(side.ends_ms)))

    def try_start(now: float) -> None:
        nonlocal wake_at, token, main, cut
        if now < free_at:
            return  # a wake-up at free_at starts it
        step, wake, drops = engine.next_step(now)
        record_drops(drops)
        if step is not None:
            a = step.action
            note(now, "run", f"{a.model}[{a.stages[0]}:{a.stages[1]}] x{a.batch_size}")
            main, cut = Lane.start(step), None
            started(step)
            token += 1
            push(step.end_ms, STEP_DONE, (token, len(step.stage_end_ms)))
            retime(now)
        elif wake is not None and wake != wake_at:
            wake_at = wake
            push(wake, WAKE, None)
        try_beside(now)

    def try_beside(now: float) -> None:
        nonlocal side, side_token
        step = engine.next_beside(now)
        if step is None:
            return
        a = step.action
        note(now, "stack", f"{a.model}[{a.stages[0]}:{a.stages[1]}] x{a.batch_size}")
        side = Lane.start(step)
        started(step)
        side_token += 1
        push(step.end_ms, BESIDE_DONE, (side_token, len(step.stage_end_ms)))
        retime(now)

    def preempt(now: float) -> None:
        """The newest plan no longer starts with the running step: it stops at the next stage
        boundary (the stage running now finishes)."""
        nonlocal token, cut
        assert main is not None
        done = main.stages_done_by(now)
        end = main.ends_ms[done - 1] if done else now
        if end < main.end_ms:
            cut = done
            token += 1
            push(end, STEP_DONE, (token, done))
            note(now, "cut", f"{main.model} after {done} of {len(main.ends_ms)}")

    def started(step: Step) -> None:
        for rid in step.action.request_ids:
            out.queue_ms.setdefault(rid, step.start_ms - arrival[rid])

    def ran(lane: Lane, now: float) -> None:
        for rid in lane.step.action.request_ids:
            out.in_steps_ms[rid] += now - lane.step.start_ms

    def finished(now: float, requests: list[Request]) -> None:
        for r in requests:
            out.latency_ms[r.id] = now - arrival[r.id]
            if now <= deadline[r.id]:
                out.on_time.add(r.id)
            note(now, "done", r.id)

    while heap:
        now, kind, _, payload = heapq.heappop(heap)
        if kind == STEP_DONE:
            assert isinstance(payload, tuple)
            live, done = payload
            if live != token:
                continue  # the step was cancelled or re-timed and ends at another time
            out.end_ms = now
            assert main is not None
            a = main.step.action
            out.busy_ms += now - main.step.start_ms
            ran(main, now)
            for k in range(a.stages[0], a.stages[0] + done):
                out.batches[(a.model, k)].append(a.batch_size)
            main = None
            finished(now, engine.finish(done))
            retime(now)
            if step_gap_ms > 0:
                free_at = now + step_gap_ms
                push(free_at, WAKE, None)
            try_start(now)
        elif kind == BESIDE_DONE:
            assert isinstance(payload, tuple)
            live, done = payload
            if live != side_token:
                continue
            out.end_ms = now
            assert side is not None
            a = side.step.action
            ran(side, now)
            for k in range(a.stages[0], a.stages[0] + done):
                out.batches[(a.model, k)].append(a.batch_size)
            side = None
            finished(now, engine.finish_beside(done))
            retime(now)
            if engine.running is None:
                try_start(now)
            else:
                record_drops(engine.replan(now))
                if engine.wants_preemption():
                    preempt(now)
                try_beside(now)
        elif kind == ARRIVAL:
            out.end_ms = now
            assert isinstance(payload, Request)
            batch = [payload]  # arrivals at the same time are admitted together, one plan
            while heap and heap[0][0] == now and heap[0][1] == ARRIVAL:
                nxt = heapq.heappop(heap)[3]
                assert isinstance(nxt, Request)
                batch.append(nxt)
            for r in batch:
                arrival[r.id] = r.arrival_ms
                deadline[r.id] = r.deadline_ms
                note(now, "arrive", r.id)
                engine.add(r)
            record_drops(engine.replan(now))
            if engine.running is None:
                try_start(now)
            else:
                if engine.wants_preemption():
                    preempt(now)
                try_beside(now)
        elif engine.running is None:
            out.end_ms = now
            wake_at = None
            try_start(now)
    out.plan_us = engine.plan_us
    return out

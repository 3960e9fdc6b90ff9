"""Discrete-event simulator: the same scheduler, a profiled executor (DESIGN.md).

Events sit in a heap keyed (time_ms, priority, seq): at equal times a finishing step is handled
before an arrival, an arrival before a decode's end, and that before a wake-up; arrivals at the
same time are admitted together and planned for once (a task of several queries, as the server does
for arrivals in one loop iteration). The device runs one step (a layer group of the first action of
the newest plan) at a time, each stage for exactly its profiled latency; the engine re-plans at
every arrival and after every step. When a plan made on an arrival no longer starts with the
running step, the step stops at its next stage boundary, as the server's executor does at its exit
check (`scheduler.engine`). A plan may put an action on a second lane beside the running step
(stacking); while both lanes run, each is slowed by its profiled stacking slowdown (`sim.lanes`).
With `step_gap_ms` the device starts no step sooner than that after the last one ended: a server's
hand-off between steps (its /v1/status `step_gap_ms`), which a request pays at every step it waits
through. With `replicas` > 1 there are that many such devices, each with its own engine over the
same deployment and policy, as `layerbatch serve --replicas` runs them: an arriving request joins
one (`scheduler.dispatch`, the least work left, its work counted until it finishes or is dropped)
and stays there. With `admission_share`, an arriving request is first offered to its replica's
queue as the server offers it (`scheduler.admission`) and dropped at once when it finds no room
(within its deadline, and within `admission_share` of it while the queue is overloaded); off by
default (bench/results/peers-log.md, session 76: here it only cost). With `decode_ms`, each
admitted request is decoded on its device before it joins the queue, as on a server that decodes on
its executor thread (`decode_threads` 0), in the thread's order: a request admitted while a step
runs, or while the device decodes before its next step, is decoded once that step ends, one
admitted to an idle device at once; the next step waits for the decodes started before it (and not
for `step_gap_ms` too: they overlap it). A request a plan drops later was still decoded. The plans
count the decode as the server's do, per sample in each model's first stage (`with_entry_cost`),
while the device runs that stage in its profiled time. With `overrun`, the device runs every
stage `overrun` times its profiled latency while the plans count the profile: a server's steps
run past their plan (measured on one: 1.05-1.06x with the hand-offs, session 84 of
bench/results/peers-log.md), and a plan that ends its batches right at their deadlines is then
late. Nothing here reads a clock except the
optional `timer` used to measure planning time, which never changes what is simulated.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.admission import Admission
from scheduler.deployment import Deployment
from scheduler.dispatch import choose_replica
from scheduler.engine import Dropped, Engine
from scheduler.policies.common import QUEUE_FULL_AHEAD
from scheduler.profile import scaled, with_entry_cost
from scheduler.types import Request, Scheduler, Step
from sim.lanes import Lane, slowdown
from sim.workload import Workload

STEP_DONE, BESIDE_DONE, ARRIVAL, DECODED, WAKE = 0, 1, 2, 3, 4


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
    busy_ms: float = 0.0  # summed over the replicas
    end_ms: float = 0.0
    plan_us: list[float] = field(default_factory=list)
    log: list[tuple[float, str, str]] | None = None
    replicas: int = 1


def simulate(
    deployment: Deployment,
    policy: Scheduler,
    workload: Workload,
    timer: Callable[[], float] | None = None,
    keep_log: bool = False,
    step_gap_ms: float = 0.0,
    replicas: int = 1,
    admission_share: float | None = None,
    decode_ms: float = 0.0,
    overrun: float = 1.0,
) -> Outcome:
    """Run `workload` through `policy` on `replicas` simulated devices; see the module
    docstring. With `admission_share`, a request is turned away on arrival as the server turns
    it away (`scheduler.admission.Admission`, one per replica; None: every request joins). With
    `decode_ms`, each admitted request is decoded on its device, taking that long, before it
    joins the queue (module docstring); `deployment` holds the profiles the plans count, and
    the device runs them `overrun` times slower."""
    if replicas < 1:
        raise ValueError(f"replicas: expected at least 1, got {replicas}")
    if decode_ms < 0:
        raise ValueError(f"decode_ms: expected a time of at least 0 ms, got {decode_ms}")
    if not 0 < overrun < math.inf:
        raise ValueError(f"overrun: expected a positive factor, got {overrun}")
    plans = deployment
    if decode_ms > 0:
        plans = deployment.with_profiles(
            with_entry_cost(p, decode_ms) for p in deployment.profiles.values()
        )
    device = deployment
    if overrun != 1.0:
        device = deployment.with_profiles(scaled(p, overrun) for p in deployment.profiles.values())
    run = _Run(plans, device, decode_ms, workload, keep_log, step_gap_ms, policy.name,
               replicas, admission_share)  # fmt: skip
    devices = [_Device(i, Engine(plans, policy, timer), run) for i in range(replicas)]
    for i, (t, app) in enumerate(zip(workload.arrival_ms, workload.apps, strict=True)):
        rid = f"q{i}"
        run.heap.append((t, ARRIVAL, run.seq, Request(rid, app, 0, t, t + workload.deadline_ms)))
        run.seq += 1
    heapq.heapify(run.heap)
    heap = run.heap
    while heap:
        now, kind, _, payload = heapq.heappop(heap)
        if kind == ARRIVAL:
            run.out.end_ms = now
            assert isinstance(payload, Request)
            batch = [payload]  # arrivals at the same time are admitted together, one plan each
            while heap and heap[0][0] == now and heap[0][1] == ARRIVAL:
                nxt = heapq.heappop(heap)[3]
                assert isinstance(nxt, Request)
                batch.append(nxt)
            joined: dict[int, list[Request]] = {}
            for r in batch:
                i = choose_replica(run.work_ms) if replicas > 1 else 0
                run.hold(r, i)
                joined.setdefault(i, []).append(r)
            for i, rs in sorted(joined.items()):
                devices[i].arrive(now, rs)
        else:
            assert isinstance(payload, tuple)
            i, event = payload
            devices[i].handle(now, kind, event)
    run.out.plan_us = [us for d in devices for us in d.engine.plan_us]
    return run.out


class _Run:
    """What the devices of one run share: the event heap, the outcome, the requests' times,
    the work each replica holds (`scheduler.dispatch`), what the plans count (`deployment`) and
    what the devices run (`device`, and `decode_ms` a request)."""

    def __init__(
        self,
        deployment: Deployment,
        device: Deployment,
        decode_ms: float,
        workload: Workload,
        keep_log: bool,
        step_gap_ms: float,
        policy: str,
        replicas: int,
        admission_share: float | None = None,
    ) -> None:
        self.deployment = deployment  # what the plans count
        self.device = device  # what the devices run
        self.decode_ms = decode_ms  # each admitted request's decode on its device
        self.policy = policy
        self.admission_share = admission_share
        self.step_gap_ms = step_gap_ms
        self.out = Outcome(policy, workload, log=[] if keep_log else None, replicas=replicas)
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.deadline: dict[str, float] = {}
        self.arrival: dict[str, float] = {}
        self.work_ms = [0.0] * replicas
        self.held: dict[str, tuple[int, float]] = {}  # request -> (replica, its work)

    def push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.heap, (t, kind, self.seq, payload))
        self.seq += 1

    def note(self, t: float, kind: str, detail: str) -> None:
        if self.out.log is not None:
            self.out.log.append((round(t, 6), kind, detail))

    def hold(self, r: Request, replica: int) -> None:
        self.arrival[r.id] = r.arrival_ms
        self.deadline[r.id] = r.deadline_ms
        work = self.deployment.solo_ms(r.app, r.position)
        self.held[r.id] = (replica, work)
        self.work_ms[replica] += work

    def release(self, rid: str) -> None:
        replica, work = self.held.pop(rid)
        self.work_ms[replica] -= work


class _Device:
    """One device (replica): its engine, the step it runs (`main`) and the action stacked beside
    it (`side`)."""

    def __init__(self, index: int, engine: Engine, run: _Run) -> None:
        self.index = index
        self.engine = engine
        self.run = run
        self.out = run.out
        self.main: Lane | None = None
        self.side: Lane | None = None
        self.cut: int | None = None  # stages the main step stops after, when it was preempted
        self.token = 0  # identifies the live STEP_DONE event; a cancelled step's old one goes stale
        self.side_token = 0  # the same for BESIDE_DONE
        self.wake_at: float | None = None
        self.free_at = float("-inf")  # the device starts no step before this (step_gap_ms after)
        self.undecoded: list[Request] = []  # admitted, waiting for the device to decode them
        self.decoding = 0  # decodes started and not yet done
        self.decoded_at = float("-inf")  # when its last decode ended (or ends)
        share = run.admission_share
        self.admission = None if share is None else Admission(share)  # its queue's door

    def push(self, t: float, kind: int, event: object) -> None:
        self.run.push(t, kind, (self.index, event))

    def record_drops(self, drops: list[Dropped]) -> None:
        if drops and self.admission is not None:
            self.admission.dropped()
        for d in drops:
            self.out.dropped[d.request.id] = d.reason
            self.run.release(d.request.id)
            self.run.note(d.at_ms, "drop", d.request.id)

    def retime(self, now: float) -> None:
        """The set of running models changed: new stage end times, new done events."""
        d, main, side = self.run.deployment, self.main, self.side
        if main is not None:
            before = main.end_ms
            main.retime(now, slowdown(d, main.model, side.model if side else None))
            if main.end_ms != before and self.cut is None:
                self.token += 1
                self.push(main.end_ms, STEP_DONE, (self.token, len(main.ends_ms)))
            elif self.cut is not None:
                self.token += 1
                end = main.ends_ms[self.cut - 1] if self.cut else now
                self.push(end, STEP_DONE, (self.token, self.cut))
        if side is not None:
            before = side.end_ms
            side.retime(now, slowdown(d, side.model, main.model if main else None))
            if side.end_ms != before:
                self.side_token += 1
                self.push(side.end_ms, BESIDE_DONE, (self.side_token, len(side.ends_ms)))

    def try_start(self, now: float) -> None:
        if now < self.free_at:
            return  # a wake-up at free_at starts it
        step, wake, drops = self.engine.next_step(now)
        self.record_drops(drops)
        if step is not None:
            a = step.action
            self.run.note(now, "run", f"{a.model}[{a.stages[0]}:{a.stages[1]}] x{a.batch_size}")
            self.main, self.cut = self.lane(step), None
            self.started(step)
            self.token += 1
            self.push(self.main.end_ms, STEP_DONE, (self.token, len(step.stage_end_ms)))
            self.retime(now)
        elif wake is not None and wake != self.wake_at:
            self.wake_at = wake
            self.push(wake, WAKE, None)
        if step is None:
            self.decode(now)  # nothing to run: the waiting decodes go first
        self.try_beside(now)

    def lane(self, step: Step) -> Lane:
        """`step` on this device: its stages at the device's profiled latencies."""
        a, device = step.action, self.run.device
        return Lane.start(
            step, [device.latency_ms(a.model, k, a.batch_size) for k in range(*a.stages)]
        )

    def decode(self, now: float) -> None:
        """Decode the admitted requests waiting for it, one after another from `now` (no step
        runs): each joins the queue when its decode ends (a DECODED event), and the next step
        waits for them all."""
        if not self.undecoded:
            return
        t, each = max(now, self.decoded_at), self.run.decode_ms
        for r in self.undecoded:
            t += each
            self.push(t, DECODED, r)
        self.decoding += len(self.undecoded)
        self.out.busy_ms += len(self.undecoded) * each
        self.undecoded.clear()
        self.decoded_at = t
        self.free_at = max(self.free_at, t)

    def joined(self, now: float) -> None:
        """Requests joined the queue: re-plan, then start, preempt or stack as the plan says."""
        self.record_drops(self.engine.replan(now))
        if self.engine.running is None:
            self.try_start(now)
        else:
            if self.engine.wants_preemption():
                self.preempt(now)
            self.try_beside(now)

    def try_beside(self, now: float) -> None:
        step = self.engine.next_beside(now)
        if step is None:
            return
        a = step.action
        self.run.note(now, "stack", f"{a.model}[{a.stages[0]}:{a.stages[1]}] x{a.batch_size}")
        self.side = self.lane(step)
        self.started(step)
        self.side_token += 1
        self.push(self.side.end_ms, BESIDE_DONE, (self.side_token, len(step.stage_end_ms)))
        self.retime(now)

    def preempt(self, now: float) -> None:
        """The newest plan no longer starts with the running step: it stops at the next stage
        boundary (the stage running now finishes)."""
        main = self.main
        assert main is not None
        done = main.stages_done_by(now)
        end = main.ends_ms[done - 1] if done else now
        if end < main.end_ms:
            self.cut = done
            self.token += 1
            self.push(end, STEP_DONE, (self.token, done))
            self.run.note(now, "cut", f"{main.model} after {done} of {len(main.ends_ms)}")

    def started(self, step: Step) -> None:
        for rid in step.action.request_ids:
            self.out.queue_ms.setdefault(rid, step.start_ms - self.run.arrival[rid])

    def ran(self, lane: Lane, now: float) -> None:
        a = lane.step.action
        for rid in a.request_ids:
            self.out.in_steps_ms[rid] += now - lane.step.start_ms

    def finished(self, now: float, requests: list[Request]) -> None:
        for r in requests:
            self.out.latency_ms[r.id] = now - self.run.arrival[r.id]
            if now <= self.run.deadline[r.id]:
                self.out.on_time.add(r.id)
            self.run.release(r.id)
            self.run.note(now, "done", r.id)

    def count(self, lane: Lane, done: int) -> None:
        a = lane.step.action
        for k in range(a.stages[0], a.stages[0] + done):
            self.out.batches[(a.model, k)].append(a.batch_size)

    def arrive(self, now: float, requests: list[Request]) -> None:
        run = self.run
        for r in requests:
            run.note(now, "arrive", r.id)
            door, ahead = self.admission, len(self.undecoded) + self.decoding
            if door is not None and door.turns_away(self.engine.state, run.policy, r, now, ahead):
                self.record_drops([Dropped(r, QUEUE_FULL_AHEAD, now)])
            elif run.decode_ms > 0:
                self.undecoded.append(r)  # decoded when no step runs, then it joins the queue
            else:
                self.engine.add(r)
        if run.decode_ms == 0:
            self.joined(now)
        elif self.main is None and now >= self.free_at and not self.decoding:
            self.decode(now)  # an idle device decodes at once

    def handle(self, now: float, kind: int, event: object) -> None:
        """A STEP_DONE, BESIDE_DONE, DECODED or WAKE event of this device."""
        if kind == STEP_DONE:
            assert isinstance(event, tuple)
            live, done = event
            if live != self.token:
                return  # the step was cancelled or re-timed and ends at another time
            self.out.end_ms = now
            main = self.main
            assert main is not None
            self.out.busy_ms += now - main.step.start_ms
            self.ran(main, now)
            self.count(main, done)
            self.main = None
            self.finished(now, self.engine.finish(done))
            self.retime(now)
            if self.run.step_gap_ms > 0:
                self.free_at = now + self.run.step_gap_ms
                self.push(self.free_at, WAKE, None)
            self.decode(now)
            self.try_start(now)
        elif kind == BESIDE_DONE:
            assert isinstance(event, tuple)
            live, done = event
            if live != self.side_token:
                return
            self.out.end_ms = now
            side = self.side
            assert side is not None
            self.ran(side, now)
            self.count(side, done)
            self.side = None
            self.finished(now, self.engine.finish_beside(done))
            self.retime(now)
            if self.engine.running is None:
                self.try_start(now)
            else:
                self.record_drops(self.engine.replan(now))
                if self.engine.wants_preemption():
                    self.preempt(now)
                self.try_beside(now)
        elif kind == DECODED:
            assert isinstance(event, Request)
            self.decoding -= 1
            self.run.note(now, "decoded", event.id)
            self.engine.add(event)
            self.joined(now)
        elif self.engine.running is None:
            self.out.end_ms = now
            self.wake_at = None
            self.try_start(now)

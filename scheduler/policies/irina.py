"""`irina`: choose preemption, batching or stacking by predicted average completion time
(paper 002, Irina, section 3.2).

Waiting requests form tasks: those of one app at one position (oldest arrival first). The device
may be running a step R (its requests stand where R started, `state.running`). For every
candidate below Irina predicts each request's completion time c_i and the average
    JCT = sum_i (c_i - arrival_i) / n      (every request one sample: Irina's weighted JCT)
over the requests it schedules, and keeps the candidate with the lowest JCT among those that meet
every deadline (if none does, the lowest JCT):

  fifo       R runs on, then the tasks in arrival order, each to the end of its app
  preempt X  R stops at its next stage boundary b (the exit check), task X runs to its end, R
             resumes from b, then the rest in order; with no R: X runs first
  batch X    X has R's model and stands at or before b: R stops at b, X runs alone up to b,
             then R and X run together to the end (within B); with no R, two tasks of one app
             at different positions merge the same way
  stack X    X runs now on a second lane beside R (`Plan.beside`) when R's model differs, X ends
             within one model, the second lane is free and the activation peaks of R's rest and
             X fit `memory_bytes`; while both run, each runs slower by its profile's
             `stacking_slowdown` for the other model (a pair not profiled is not stacked)

X ranges over the `candidates` newest tasks. Unlike Irina, a preempted request keeps its
activations and resumes where it stopped (layer-wise execution). Only requests whose deadline has
passed are dropped. Objective reported: the chosen candidate's average JCT (ms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.deployment import Deployment
from scheduler.policies.common import arrival_order, split_expired
from scheduler.state import SchedulerState
from scheduler.timeline import finish_plan
from scheduler.types import Action, Plan, Request, Step

DEFAULT_CANDIDATES = 8


@dataclass(frozen=True)
class Task:
    app: str
    position: int
    requests: tuple[Request, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.requests)


@dataclass
class Candidate:
    strategy: str
    actions: list[Action]
    completion_ms: dict[str, float]
    beside: Action | None = None
    jct_ms: float = math.inf
    on_time: bool = False


@dataclass
class Irina:
    name: str = "irina"
    memory_bytes: float | None = None  # activation budget for stacking (None: no limit)
    candidates: int = DEFAULT_CANDIDATES
    stacking: bool = True  # False for a runner with one lane

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        live, drops = split_expired(state, now_ms)
        d = state.deployment
        run = state.running
        running_ids = set(run.action.request_ids) if run is not None else set()
        r_task = None
        if run is not None:
            mine = tuple(r for r in live if r.id in running_ids)
            if mine:
                r_task = Task(mine[0].app, mine[0].position, mine)
        tasks = _tasks([r for r in live if r.id not in running_ids])
        options = self._candidates(d, state, now_ms, run, r_task, tasks)
        deadline = {r.id: r.deadline_ms for r in live}
        arrival = {r.id: r.arrival_ms for r in live}
        for c in options:
            ids = list(c.completion_ms)
            c.jct_ms = sum(c.completion_ms[i] - arrival[i] for i in ids) / max(len(ids), 1)
            c.on_time = all(c.completion_ms[i] <= deadline[i] for i in ids)
        pool = [c for c in options if c.on_time] or options
        best = min(pool, key=lambda c: c.jct_ms)  # first of equals: fifo before the others
        return finish_plan(
            state, now_ms, best.actions, drops, objective=best.jct_ms, policy=self.name,
            notes={"strategy_" + best.strategy: 1.0}, beside=best.beside,
        )  # fmt: skip

    def _candidates(
        self,
        d: Deployment,
        state: SchedulerState,
        now: float,
        run: Step | None,
        r_task: Task | None,
        tasks: list[Task],
    ) -> list[Candidate]:
        newest = sorted(tasks, key=lambda t: max(arrival_order(r) for r in t.requests))
        newest = newest[-self.candidates :]
        lane_free = self.stacking and state.beside is None
        if r_task is None or run is None:
            out = [_sequence(d, "fifo", now, [(t, t.position) for t in tasks])]
            for x in newest:
                rest = [(t, t.position) for t in tasks if t is not x]
                out.append(_sequence(d, "preempt", now, [(x, x.position), *rest]))
                for y in tasks:
                    if y is not x and _mergeable(d, x, y, y.position):
                        merged = _merge(x, y)
                        seq = [(x, x.position), (merged, y.position)]
                        rest = [(t, t.position) for t in tasks if t is not x and t is not y]
                        out.append(_sequence(d, "batch", now, seq + rest, upto=y.position))
            return out
        k0 = r_task.position
        done = run.stages_done_by(now)
        kb = k0 + done
        t_b = max(now, run.stage_end_ms[done - 1] if done else run.start_ms)
        finished_r = kb >= d.app_length(r_task.app)
        head: list[Action] = (
            [Action(run.action.model, (run.action.stages[0], run.action.stages[0] + done),
                    r_task.ids)] if done else []
        )  # fmt: skip
        fifo = _sequence(d, "fifo", run.start_ms, [(r_task, k0), *[(t, t.position) for t in tasks]])
        out = [fifo]
        for x in newest:
            rest = [(t, t.position) for t in tasks if t is not x]
            resume = [] if finished_r else [(r_task, kb)]
            pre = _sequence(d, "preempt", t_b, [(x, x.position), *resume, *rest], head=head)
            if finished_r:  # R's requests finish at the boundary
                pre.completion_ms.update({i: t_b for i in r_task.ids})
            out.append(pre)
            if not finished_r and _mergeable(d, x, r_task, kb):
                seq = [(x, x.position), (_merge(x, r_task), kb), *rest]
                out.append(_sequence(d, "batch", t_b, seq, head=head, upto=kb))
            if lane_free:
                stacked = _stack(d, now, run, r_task, x, fifo, tasks, self.memory_bytes)
                if stacked is not None:
                    out.append(stacked)
        return out


def _tasks(requests: Sequence[Request]) -> list[Task]:
    """Requests grouped by (app, position), groups in order of their oldest request."""
    groups: dict[tuple[str, int], list[Request]] = {}
    for r in sorted(requests, key=arrival_order):
        groups.setdefault((r.app, r.position), []).append(r)
    return [Task(app, pos, tuple(rs)) for (app, pos), rs in groups.items()]


def _mergeable(d: Deployment, x: Task, y: Task, at: int) -> bool:
    """X (behind) can catch up with Y at position `at` and run with it: same app, X not past
    `at`, `at` inside the same model as X, and the merged batch within B."""
    if x.app != y.app or x.position > at or at >= d.app_length(x.app):
        return False
    model_x, _ = d.locate(x.app, x.position)
    model_at, _ = d.locate(x.app, at)
    return model_x == model_at and len(x.requests) + len(y.requests) <= d.batch_limit(model_x)


def _merge(x: Task, y: Task) -> Task:
    return Task(y.app, y.position, tuple(sorted(x.requests + y.requests, key=arrival_order)))


def _actions(d: Deployment, task: Task, start: int, stop: int | None = None) -> list[Action]:
    """Actions that take `task`'s requests from `start` to `stop` (default: the app's end),
    one per model of the chain, each batch within B (split into consecutive batches)."""
    end = d.app_length(task.app) if stop is None else stop
    out: list[Action] = []
    pos = start
    while pos < end:
        model, k = d.locate(task.app, pos)
        link = d.link_of(task.app, model)
        assert link is not None
        upto = min(end, link.end)
        ids = task.ids
        size = d.batch_limit(model)
        for i in range(0, len(ids), size):
            out.append(Action(model, (k, k + upto - pos), ids[i : i + size]))
        pos = upto
    return out


def _sequence(
    d: Deployment,
    strategy: str,
    t0: float,
    order: Sequence[tuple[Task, int]],
    head: Sequence[Action] = (),
    upto: int | None = None,
) -> Candidate:
    """Tasks run back to back from `t0` (each from the given position to its app's end; the
    first to `upto` when given: a catch-up before a merge); `head` is what the running step does
    before `t0` (already accounted in t0, listed so the plan starts with it)."""
    actions = list(head)
    completion: dict[str, float] = {}
    t = t0
    for i, (task, pos) in enumerate(order):
        stop = upto if (i == 0 and upto is not None) else None
        for a in _actions(d, task, pos, stop):
            t += d.run_ms(a.model, a.stages[0], a.stages[1], a.batch_size)
            actions.append(a)
        if stop is None:
            completion.update({r: t for r in task.ids})
    return Candidate(strategy, actions, completion)


def _stack(
    d: Deployment,
    now: float,
    run: Step,
    r_task: Task,
    x: Task,
    fifo: Candidate,
    tasks: Sequence[Task],
    memory_bytes: float | None,
) -> Candidate | None:
    """X beside the main lane (module docstring), or None when stacking does not apply."""
    model_r = run.action.model
    beside = _actions(d, x, x.position)
    if len(beside) != 1 or beside[0].model == model_r:
        return None
    side = beside[0]
    p_r, p_x = d.profiles[model_r], d.profiles[side.model]
    s_r = p_r.stacking_slowdown.get(side.model)
    s_x = p_x.stacking_slowdown.get(model_r)
    if s_r is None or s_x is None:
        return None
    s_r, s_x = max(1.0, s_r), max(1.0, s_x)  # a measured speed-up beside another is noise
    if memory_bytes is not None:
        k_r = run.action.stages[0]
        peak_r = max(s.peak_bytes for s in p_r.stages[k_r:]) * len(r_task.requests)
        peak_x = max(s.peak_bytes for s in p_x.stages[side.stages[0] : side.stages[1]])
        if peak_r + peak_x * side.batch_size > memory_bytes:
            return None
    main = _sequence(
        d, "stack", run.start_ms,
        [(r_task, r_task.position), *[(t, t.position) for t in tasks if t is not x]],
    )  # fmt: skip
    solo_x = d.run_ms(side.model, side.stages[0], side.stages[1], side.batch_size)
    main_end = max(main.completion_ms.values(), default=now)
    busy = max(0.0, main_end - now)  # solo work left on the main lane
    wall_x = solo_x * s_x
    if busy * s_r < wall_x:  # the main lane empties first; X finishes alone
        overlap = busy * s_r
        wall_x = overlap + (solo_x - overlap / s_x)
    overlap = min(wall_x, busy * s_r)

    def stretched(t: float) -> float:
        dt = t - now
        if dt <= 0:
            return t
        if dt * s_r <= overlap:
            return now + dt * s_r
        return t + overlap * (1.0 - 1.0 / s_r)

    completion = {i: stretched(c) for i, c in main.completion_ms.items()}
    completion.update({i: now + wall_x for i in x.ids})
    return Candidate("stack", main.actions, completion, beside=side)

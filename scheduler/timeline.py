"""Running a list of actions back to back: the one place that turns actions into times.

`finish_plan` is how every policy builds its `Plan`: it replays the actions from `now_ms` with the
profile latencies, checks the plan's guarantees (each action's requests stand at its first stage,
batches within B, every request not dropped finishes) and records each request's completion time.
A violation is a bug in the policy and raises `PlanError`.

A plan made while a step runs (on an arrival) sees the step's requests where they stood when it
started. When its first action carries on that step (`continues_running`), the replay counts the
step as running since it started: its part of the action ends when the step does by the profile
(`Step.end_ms`, or now if that has passed), not a whole step's time after now. Counted from now,
every plan made during a step was late by the time the step had already run, and dp-tardy dropped
as predicted late requests that a burst left just enough time for (in the simulator under the
Azure trace at 1000 ms this raised dp-tardy's capacity 5-15%: bench/results/peers-log.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from scheduler.deployment import Deployment
from scheduler.state import SchedulerState
from scheduler.types import Action, Drop, Plan, Request, Step


class PlanError(RuntimeError):
    """A policy produced a plan that breaks the `Plan` guarantees (a bug, not bad input)."""


def replay(
    deployment: Deployment,
    requests: Iterable[Request],
    now_ms: float,
    actions: Sequence[Action],
    running: Step | None = None,
) -> tuple[dict[str, float], float]:
    """Run `actions` back to back from `now_ms`; a first action that carries on the `running`
    step is counted from the step's start (module docstring).

    Returns (completion time of every request that finishes, time the last action ends).
    Raises `PlanError` on an action that cannot run as written.
    """
    # every request's current (model, stage); a model's successor in each app's chain
    where: dict[str, tuple[str, int]] = {}
    app_of: dict[str, str] = {}
    for r in requests:
        where[r.id] = deployment.locate(r.app, r.position)
        app_of[r.id] = r.app
    successor: dict[tuple[str, str], str | None] = {}
    for a in deployment.apps:
        chain = deployment.chain(a)
        for i, link in enumerate(chain):
            successor[(a, link.model)] = chain[i + 1].model if i + 1 < len(chain) else None
    completion: dict[str, float] = {}
    t = now_ms
    for n, act in enumerate(actions):
        if act.model not in deployment.profiles:
            raise PlanError(f"action {n}: unknown model {act.model}")
        k0, k1 = act.stages
        n_stages = deployment.profiles[act.model].num_stages
        if not 0 <= k0 < k1 <= n_stages:
            raise PlanError(f"action {n}: stages {act.stages} outside model {act.model}")
        if not act.request_ids or len(set(act.request_ids)) != len(act.request_ids):
            raise PlanError(f"action {n}: empty or repeated request ids")
        duration = deployment.run_ms(act.model, k0, k1, len(act.request_ids))
        if math.isinf(duration):
            raise PlanError(f"action {n}: batch {len(act.request_ids)} exceeds B for {act.model}")
        if n == 0 and running is not None and continues_running(act, running):
            k_run = running.action.stages[1]
            t = max(t, running.end_ms) + deployment.run_ms(
                act.model, k_run, k1, len(act.request_ids)
            )
        else:
            start = t if act.not_before_ms is None else max(t, act.not_before_ms)
            t = start + duration
        here = (act.model, k0)
        for rid in act.request_ids:
            if where.get(rid) != here:
                raise PlanError(f"action {n}: request {rid} does not stand at {act.model}[{k0}]")
            if k1 < n_stages:
                where[rid] = (act.model, k1)
                continue
            nxt = successor[(app_of[rid], act.model)]
            if nxt is None:
                del where[rid]
                completion[rid] = t
            else:
                where[rid] = (nxt, 0)
    return completion, t


def continues_running(action: Action, running: Step) -> bool:
    """Whether `action` is the running step carried on: the same model and first stage, at least
    its stages, and only requests that run in it (some may have left since it started)."""
    run = running.action
    return (
        action.model == run.model
        and action.stages[0] == run.stages[0]
        and action.stages[1] >= run.stages[1]
        and set(action.request_ids) <= set(run.request_ids)
    )


def finish_plan(
    state: SchedulerState,
    now_ms: float,
    actions: Sequence[Action],
    dropped: Sequence[Drop] = (),
    objective: float | None = None,
    policy: str = "",
    notes: Mapping[str, float] | None = None,
    beside: Action | None = None,
    completion: Mapping[str, float] | None = None,
) -> Plan:
    """Check `actions` against the plan guarantees and build the `Plan`.

    `beside` runs from `now_ms` on a second lane (its requests' completion is its solo replay).
    `objective` defaults to the total completion time, sum of (completion - now) in ms.
    `completion`: what `replay` returned for these `actions` and the requests not dropped, the
    running step included, if the policy has it already (that replay checked the actions).
    """
    gone = {d.request_id for d in dropped}
    aside = set(beside.request_ids) if beside is not None else set()
    live = [r for r in state if r.id not in gone and r.id not in aside]
    if completion is None:
        done, _ = replay(state.deployment, live, now_ms, actions, state.running)
    else:
        done = dict(completion)
    if beside is not None:
        lane = [r for r in state if r.id in aside]
        done.update(replay(state.deployment, lane, now_ms, [beside])[0])
    missing = [r.id for r in live if r.id not in done]
    if missing:
        raise PlanError(f"{policy}: plan leaves requests unfinished: {missing[:5]}")
    if objective is None:
        objective = total_completion_ms(done, now_ms)
    return Plan(
        actions=tuple(actions),
        completion_ms=done,
        dropped=tuple(dropped),
        objective=objective,
        policy=policy,
        notes=dict(notes or {}),
        beside=beside,
    )


def total_completion_ms(completion: Mapping[str, float], now_ms: float) -> float:
    return sum(c - now_ms for c in completion.values())

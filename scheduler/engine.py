"""The runtime step that the simulator and the server share (DESIGN.md, "The runtime step").

    loop:  plan = policy.plan(state, now)     # re-planned on every arrival and after every step
           drop(plan.dropped)                 # answered at once
           step = first action of plan, cut at its model's next layer-group boundary
           run step; state advances; repeat

The engine owns the `SchedulerState`. When a step starts, the state is advanced to where the step
will leave it and `busy_until_ms` is set, so a plan made while the device is busy (on an arrival)
is a plan for the moment the device becomes free. Time is passed in; the engine reads no clock.
An optional `timer` (a callable returning seconds) lets the caller measure planning time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.deployment import Deployment
from scheduler.state import SchedulerState
from scheduler.types import Action, Plan, Request, Scheduler


@dataclass(frozen=True)
class Step:
    """One executed layer group: `action` runs from `start_ms` to `end_ms`; `finished` are the
    requests it completes (with their final positions)."""

    action: Action
    start_ms: float
    end_ms: float
    finished: tuple[Request, ...]


@dataclass(frozen=True)
class Dropped:
    request: Request
    reason: str
    at_ms: float


class Engine:
    """Admits requests, plans, hands out steps; see the module docstring."""

    def __init__(
        self,
        deployment: Deployment,
        policy: Scheduler,
        timer: Callable[[], float] | None = None,
    ) -> None:
        self.deployment = deployment
        self.policy = policy
        self.state = SchedulerState(deployment)
        self.timer = timer
        self.plan_us: list[float] = []
        self.busy_until_ms = -float("inf")
        self._plan: Plan | None = None
        self._plan_at_ms = 0.0

    def admit(self, request: Request, now_ms: float) -> list[Dropped]:
        """Add an arrival and re-plan; returns the requests the new plan drops."""
        self.state.add(request)
        self._plan = None
        return self.replan(now_ms)

    def replan(self, now_ms: float) -> list[Dropped]:
        """Plan for the moment the device is free (now, or the end of the running step)."""
        at = max(now_ms, self.busy_until_ms)
        if self._plan is not None and self._plan_at_ms == at:
            return []
        t0 = self.timer() if self.timer else 0.0
        plan = self.policy.plan(self.state, at)
        if self.timer:
            self.plan_us.append((self.timer() - t0) * 1e6)
        gone = self.state.remove(plan.dropped_ids)
        reasons = {d.request_id: d.reason for d in plan.dropped}
        self._plan, self._plan_at_ms = plan, at
        return [Dropped(r, reasons[r.id], now_ms) for r in gone]

    @property
    def plan(self) -> Plan | None:
        """The newest plan (None before the first one or after the state changed)."""
        return self._plan

    def next_step(self, now_ms: float) -> tuple[Step | None, float | None, list[Dropped]]:
        """Start the next step if the device is free at `now_ms`.

        Returns (step or None, time to wake up if the plan waits, drops made by re-planning).
        """
        drops = self.replan(now_ms)
        plan = self._plan
        if plan is None or not plan.actions:
            return None, None, drops
        first = plan.actions[0]
        if first.not_before_ms is not None and first.not_before_ms > now_ms:
            return None, first.not_before_ms, drops
        k0, k1 = first.stages
        k1 = min(k1, self.deployment.group_end(first.model, k0))
        action = Action(first.model, (k0, k1), first.request_ids)
        duration = self.deployment.run_ms(first.model, k0, k1, action.batch_size)
        finished = self.state.advance(action, k1 - k0)
        self._plan = None
        self.busy_until_ms = now_ms + duration
        return Step(action, now_ms, now_ms + duration, tuple(finished)), None, drops

"""The runtime step that the simulator and the server share (DESIGN.md, "The runtime step").

    loop:  plan = policy.plan(state, now)     # on every arrival, and when the device is free
           drop(plan.dropped)                 # answered at once
           step = first action of plan, cut at its model's next layer-group boundary
           run step (it may be cancelled at a stage boundary); state advances by what ran

`state` holds the positions requests had before the running step, so a plan made while the device
is busy (on an arrival) sees the running step's requests where they started. If that plan's first
action no longer continues the running step (`wants_preemption`), the runner cancels the step at its
next stage boundary (the executor's exit check) and the new plan runs from where the step stopped:
the running step continues only while the newest plan starts with it, on the same model and stage,
with all of its requests (a plan that would add requests to it is not a reason to stop it: they
cannot join mid-way, and catch up later). A runner that wants the device never to wait for a plan
starts the next piece of the newest plan with `continue_step` and re-plans right after, while it
runs. A plan may also stop the running step early by starting with it but ending it at an
earlier stage (Irina's preemption at the next boundary), and may name an action to run `beside`
it on a second lane (stacking): `next_beside` starts it, its requests leave the state until
`finish_beside` puts them back where it left them. Time is passed in; the engine reads no clock. An optional `timer` (a callable returning
seconds) lets the caller measure planning time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduler.deployment import Deployment
from scheduler.state import SchedulerState
from scheduler.types import Action, Plan, Request, Scheduler, Step


@dataclass(frozen=True)
class Dropped:
    """A request a plan dropped at `at_ms`; `predicted_ms` as the plan's `Drop` says."""

    request: Request
    reason: str
    at_ms: float
    predicted_ms: float | None = None


class Engine:
    """Admits requests, plans, hands out steps and takes back what they did; see the module
    docstring."""

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
        self.running: Step | None = None
        self.beside: Step | None = None
        self._beside_held: list[Request] = []
        self._rest: list[Action] = []  # the newest plan after the running step
        self._plan: Plan | None = None
        self._plan_key: tuple[int, float] | None = None
        self._plan_running: Step | None = None  # the step running when the newest plan was made
        self._version = itertools.count()
        self._state_version = next(self._version)

    def _changed(self) -> None:
        self._state_version = next(self._version)

    def admit(self, request: Request, now_ms: float) -> list[Dropped]:
        """Add an arrival and re-plan; returns the requests the new plan drops."""
        self.add(request)
        return self.replan(now_ms)

    def add(self, request: Request) -> None:
        """Add an arrival without planning yet (a caller that batches several arrivals into one
        plan calls `replan` after them)."""
        self.state.add(request)
        self._changed()

    def rebase(self, deployment: Deployment) -> None:
        """Plan with another deployment of the same apps and stages (e.g. profiles rescaled to
        what this machine measures); the requests keep their positions, the memo starts over."""
        self.state = SchedulerState(deployment, self.state.requests())
        self.state.running, self.state.beside = self.running, self.beside
        self.deployment = deployment
        self._changed()

    def set_policy(self, policy: Scheduler) -> None:
        """Switch policies; the next plan is the new policy's."""
        self.policy = policy
        self._changed()

    def remove(self, request_ids: Iterable[str]) -> list[Request]:
        """Take requests out (a client went away); a running step still finishes without them."""
        gone = self.state.remove(request_ids)
        if gone:
            self._changed()
        return gone

    def replan(self, now_ms: float) -> list[Dropped]:
        """Plan at `now_ms` unless the newest plan is for this state and time. Requests in the
        running step are never dropped mid-step (they are reconsidered when it ends)."""
        key = (self._state_version, now_ms)
        if self._plan is not None and self._plan_key == key:
            return []
        t0 = self.timer() if self.timer else 0.0
        plan = self.policy.plan(self.state, now_ms)
        if self.timer:
            self.plan_us.append((self.timer() - t0) * 1e6)
        running = set(self.running.action.request_ids) if self.running else set()
        drops = {d.request_id: d for d in plan.dropped if d.request_id not in running}
        gone = self.state.remove(drops)
        if gone:
            self._changed()
        self._plan, self._plan_key = plan, (self._state_version, now_ms)
        self._plan_running = self.running
        if self.running is not None:
            # made on the state before the running step: its first action is (or replaces) it
            first = plan.actions[0] if plan.actions else None
            run = self.running.action
            continues = (
                first is not None and first.model == run.model and first.stages[0] == run.stages[0]
            )
            rest = list(plan.actions[1:])
            if continues and first is not None and first.stages[1] > run.stages[1]:
                rest.insert(
                    0, Action(run.model, (run.stages[1], first.stages[1]), first.request_ids)
                )
            self._rest = rest
        else:
            self._rest = []  # next_step takes the plan's actions
        return [Dropped(r, drops[r.id].reason, now_ms, drops[r.id].predicted_ms) for r in gone]

    def plan_is_current(self) -> bool:
        """Whether the newest plan was made for the state as it is, with the step running now:
        only the clock has moved since. (A runner that re-plans once a continued step has
        started may skip that re-plan when an arrival was already planned after the start.)"""
        return (
            self._plan is not None
            and self._plan_key is not None
            and self._plan_key[0] == self._state_version
            and self._plan_running is self.running
        )

    @property
    def plan(self) -> Plan | None:
        """The newest plan (None before the first one)."""
        return self._plan

    def wants_preemption(self) -> bool:
        """Whether the newest plan no longer starts with the running step (see module docstring)."""
        if self.running is None or self._plan is None or not self._plan.actions:
            return False
        first, run = self._plan.actions[0], self.running.action
        live = {r for r in run.request_ids if r in self.state}
        return not (
            first.model == run.model
            and first.stages[0] == run.stages[0]
            and first.stages[1] >= run.stages[1]
            and live <= set(first.request_ids)
        )

    def next_step(self, now_ms: float) -> tuple[Step | None, float | None, list[Dropped]]:
        """Start the next step; call only when no step is running.

        Returns (step or None, time to wake up if the plan waits, drops made by re-planning).
        """
        if self.running is not None:
            raise RuntimeError("a step is already running")
        drops = self.replan(now_ms)
        plan = self._plan
        if plan is None or not plan.actions:
            return None, None, drops
        first = plan.actions[0]
        if first.not_before_ms is not None and first.not_before_ms > now_ms:
            return None, first.not_before_ms, drops
        self._rest = list(plan.actions[1:])
        return self._start(first, now_ms), None, drops

    def continue_step(self, now_ms: float) -> Step | None:
        """Start the next piece of the newest plan without planning first, so that the device
        need not wait for the plan: the rest of the running action's group sequence, or the
        plan's next action. The caller re-plans right after (concurrently with execution) and
        cancels this step if the new plan does not start with it. None when the plan's next
        piece no longer fits the state (then call `next_step`)."""
        if self.running is not None:
            raise RuntimeError("a step is already running")
        if not self._rest:
            return None
        nxt = self._rest[0]
        if nxt.not_before_ms is not None and nxt.not_before_ms > now_ms:
            return None
        for rid in nxt.request_ids:
            if rid not in self.state:
                return None
            r = self.state.get(rid)
            if self.deployment.locate(r.app, r.position) != (nxt.model, nxt.stages[0]):
                return None
        self._rest.pop(0)
        return self._start(nxt, now_ms)

    def _start(self, action: Action, now_ms: float) -> Step:
        """Run `action` up to its model's next layer-group boundary; the rest is kept in order."""
        k0, k1 = action.stages
        cut = min(k1, self.deployment.group_end(action.model, k0))
        if cut < k1:
            self._rest.insert(0, Action(action.model, (cut, k1), action.request_ids))
        step_action = Action(action.model, (k0, cut), action.request_ids)
        ends, t = [], now_ms
        for k in range(k0, cut):
            t += self.deployment.latency_ms(action.model, k, step_action.batch_size)
            ends.append(t)
        self.running = self.state.running = Step(step_action, now_ms, tuple(ends))
        return self.running

    def next_beside(self, now_ms: float) -> Step | None:
        """Start the newest plan's `beside` action on the second lane, if that lane is free and
        its requests stand at its first stage and are not in the running step; else None."""
        plan = self._plan
        if self.beside is not None or plan is None or plan.beside is None:
            return None
        a = plan.beside
        busy = set(self.running.action.request_ids) if self.running else set()
        for rid in a.request_ids:
            if rid not in self.state or rid in busy:
                return None
            r = self.state.get(rid)
            if self.deployment.locate(r.app, r.position) != (a.model, a.stages[0]):
                return None
        self._beside_held = self.state.remove(a.request_ids)
        self._changed()
        ends, t = [], now_ms
        for k in range(*a.stages):
            t += self.deployment.latency_ms(a.model, k, a.batch_size)
            ends.append(t)
        self.beside = self.state.beside = Step(a, now_ms, tuple(ends))
        return self.beside

    def finish_beside(self, stages_done: int) -> list[Request]:
        """The beside step ran `stages_done` stages: its requests return to the state advanced;
        returns (without re-adding) those that finished their app."""
        step = self.beside
        if step is None:
            raise RuntimeError("no step is running beside")
        self.beside = self.state.beside = None
        held, self._beside_held = self._beside_held, []
        for r in held:
            self.state.add(r)
        self._changed()
        a = step.action
        return self.state.advance(Action(a.model, (a.stages[0], a.stages[0] + stages_done),
                                         a.request_ids), stages_done)  # fmt: skip

    def finish(self, stages_done: int) -> list[Request]:
        """The running step ran `stages_done` stages: advance its requests that are still here;
        return (and remove) those that finished their app."""
        step = self.running
        if step is None:
            raise RuntimeError("no step is running")
        self.running = self.state.running = None
        self._changed()
        if stages_done < len(step.stage_end_ms):
            self._rest = []  # cancelled: the plan no longer describes what comes next
        if stages_done <= 0:
            return []
        a = step.action
        present = tuple(r for r in a.request_ids if r in self.state)
        if not present:
            return []
        moved = Action(a.model, (a.stages[0], a.stages[0] + stages_done), present)
        return self.state.advance(moved, stages_done)

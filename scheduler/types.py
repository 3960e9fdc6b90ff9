"""The types that pass between the runtime, the scheduler and the executor (DESIGN.md, core types).

A request is a position in a chain of stages. An `Action` runs stages [k0, k1) of one model for a
set of requests that all stand at stage k0 of that model. A `Plan` is an ordered list of actions
that, run back to back from `now_ms`, finishes every request it does not drop (a first action that
carries on the running step is counted from the step's start: `scheduler.timeline`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler.state import SchedulerState


@dataclass(frozen=True)
class App:
    """A named chain of models; a request of this app runs every stage of every model in order."""

    name: str
    models: tuple[str, ...]


@dataclass(frozen=True)
class Request:
    """One inference request.

    `position` is the next stage to run, counted over the app's whole chain (0 = nothing run yet;
    a client that ran the first k stages itself sends position k). Times are absolute, in ms, on
    the clock that the runtime passes to the scheduler as `now_ms`.
    """

    id: str
    app: str
    position: int
    arrival_ms: float
    deadline_ms: float = math.inf
    source: str = ""


@dataclass(frozen=True)
class Action:
    """Run stages [stages[0], stages[1]) of `model` for `request_ids`, all standing at stages[0].

    `not_before_ms` (optional) is the earliest time the action may start: a policy that chooses
    to wait for more requests (e.g. `nexus`) says so here; the device idles until then.
    """

    model: str
    stages: tuple[int, int]
    request_ids: tuple[str, ...]
    not_before_ms: float | None = None

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)


@dataclass(frozen=True)
class Step:
    """One layer group being executed: `action` from `start_ms`; `stage_end_ms[i]` is when its
    i-th stage ends by the profile (the last one is `end_ms`)."""

    action: Action
    start_ms: float
    stage_end_ms: tuple[float, ...]

    @property
    def end_ms(self) -> float:
        return self.stage_end_ms[-1]

    def planned_ms(self, stages: int) -> float:
        """The profile's time for its first `stages` stages (0 for none)."""
        return self.stage_end_ms[stages - 1] - self.start_ms if stages else 0.0

    def stages_done_by(self, t_ms: float) -> int:
        """Stages complete if the step is cancelled at `t_ms`: every stage that started before
        `t_ms` finishes; one that would start at `t_ms` does not (the exit check comes first)."""
        starts = (self.start_ms, *self.stage_end_ms[:-1])
        return sum(1 for s in starts if s < t_ms)


@dataclass(frozen=True)
class Drop:
    """A request the plan will not run, with the reason the client is told. `predicted_ms`
    (absolute, as `completion_ms`), where the policy predicted it late: when it would finish
    alone, or in the plan that found it late; None for one whose deadline had passed."""

    request_id: str
    reason: str
    predicted_ms: float | None = None


@dataclass(frozen=True)
class Plan:
    """A complete schedule from `now_ms`.

    Guarantees (checked by `scheduler.timeline.finish_plan`, which every policy uses):
    every active request is either dropped or finishes in the actions; each action's requests
    stand at its first stage when it starts; `completion_ms[r]` is the end of the action that
    finishes r when the actions run back to back with the profile latencies from `now_ms`, a
    first action that carries on the running step (`SchedulerState.running`) from the step's
    start.
    `objective` is what the policy minimises (see the policy's docstring).
    """

    actions: tuple[Action, ...]
    completion_ms: Mapping[str, float]
    dropped: tuple[Drop, ...] = ()
    objective: float = 0.0
    policy: str = ""
    notes: Mapping[str, float] = field(default_factory=dict)
    # an action to start now on a second lane, beside the running one (stacking, paper 002
    # section 2.2); its requests are not in `actions`, and `completion_ms` holds their end
    beside: Action | None = None

    @property
    def dropped_ids(self) -> tuple[str, ...]:
        return tuple(d.request_id for d in self.dropped)


class Scheduler(Protocol):
    """A policy. `plan` is pure: it reads no clock, no globals and no randomness it was not given.

    It may read and refresh the memo tables kept in `state.memo` (owned by the runtime), which
    never changes what it returns, only how fast.
    """

    name: str

    def plan(self, state: SchedulerState, now_ms: float) -> Plan: ...

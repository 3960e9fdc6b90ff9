"""`nobatch`: FIFO, one request at a time through its whole app (paper 003, section 6.1 (i))."""

from __future__ import annotations

from scheduler.policies.common import split_expired
from scheduler.state import SchedulerState
from scheduler.timeline import finish_plan
from scheduler.types import Action, Plan


class NoBatch:
    """Objective reported: total completion time (ms) of the plan."""

    name = "nobatch"

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        d = state.deployment
        live, drops = split_expired(state, now_ms)
        actions = []
        for r in live:
            for link in d.chain(r.app):
                if r.position < link.end:
                    k0 = max(0, r.position - link.offset)
                    actions.append(Action(link.model, (k0, link.num_stages), (r.id,)))
        return finish_plan(state, now_ms, actions, drops, policy=self.name)

"""`edf`: the paper's modified earliest-deadline-first with batching (paper 003, section 4.2).

Sort the requests by deadline. Start a batch with the first unscheduled request; walk down the
list and add each request of the same app whose addition keeps every request in the batch on
time (the batch runs as one segment: its least advanced member first, the others joining at their
stages), up to B. Run that batch, then build the next one from the remaining requests, starting
when the previous batch ends. A request that cannot be on time even alone still runs when it
reaches the head of the list (it is dropped once its deadline passes).
"""

from __future__ import annotations

import dataclasses

from scheduler.policies.common import split_expired
from scheduler.segments import walk
from scheduler.state import SchedulerState
from scheduler.timeline import finish_plan
from scheduler.types import Action, Plan, Request


class EDF:
    """Objective reported: number of requests the plan finishes after their deadline, plus drops."""

    name = "edf"

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        d = state.deployment
        live, drops = split_expired(state, now_ms)
        queue = sorted(live, key=lambda r: (r.deadline_ms, r.arrival_ms, r.id))
        bound = {a: min(d.batch_limit(link.model) for link in d.chain(a)) for a in d.apps}
        t = now_ms
        actions: list[Action] = []
        while queue:
            head = queue[0]
            batch = [head]
            # a head that is late even alone admits nobody: every member must stay on time
            for r in queue[1:] if _on_time(state, batch, t) else ():
                if r.app != head.app or len(batch) == bound[head.app]:
                    continue
                trial = batch + [r]
                if _on_time(state, trial, t):
                    batch = trial
            w = walk(d, head.app, _members(batch), build=True)
            actions.extend(w.actions)
            t += w.duration_ms
            taken = {r.id for r in batch}
            queue = [r for r in queue if r.id not in taken]
        plan = finish_plan(state, now_ms, actions, drops, policy=self.name)
        late = sum(1 for r in live if plan.completion_ms[r.id] > r.deadline_ms)
        return dataclasses.replace(plan, objective=float(late + len(drops)))


def _members(batch: list[Request]) -> list[tuple[int, str]]:
    return sorted((r.position, r.id) for r in batch)


def _on_time(state: SchedulerState, batch: list[Request], start_ms: float) -> bool:
    """Would every request of `batch`, run as one segment from `start_ms`, meet its deadline?"""
    end = start_ms + walk(state.deployment, batch[0].app, _members(batch)).duration_ms
    return all(end <= r.deadline_ms for r in batch)

"""`batch`: the paper's *Batch* baseline (paper 003, section 6.1 (ii)).

Per app, the requests in furthest-first order (which is arrival order for requests that arrived
at stage 0) are cut into consecutive segments of B; each segment runs from its least advanced
member to the end, picking the others up at their stages (and riders at shared models). Apps
run in the order of their oldest request.
"""

from __future__ import annotations

from scheduler.dp import Solution
from scheduler.policies.common import split_expired
from scheduler.search import AppSearch
from scheduler.state import SchedulerState
from scheduler.timeline import finish_plan
from scheduler.types import Action, Plan


class Batch:
    """Objective reported: total completion time (ms) of the plan."""

    name = "batch"

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        live, drops = split_expired(state, now_ms)
        search = AppSearch(state.deployment, live, "request", {}, now_ms)
        oldest: dict[str, tuple[float, str]] = {}
        for r in live:
            oldest.setdefault(r.app, (r.arrival_ms, r.id))
        at = search.start()
        actions: list[Action] = []
        for app in sorted(search.apps, key=lambda a: oldest[a]):
            if at.left[app] == 0:
                continue
            prob = search.problem(app, at)
            n = len(prob.units)
            cuts = tuple((j, min(j + prob.bound, n) - 1) for j in range(0, n, prob.bound))
            at, acts = search.run(prob, Solution(cuts, 0.0, 0.0), at, build=True)
            actions.extend(acts)
        return finish_plan(state, now_ms, actions, drops, policy=self.name)

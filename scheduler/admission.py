"""Admission past capacity: whether a new request has room at the back of the queue.

A server past its capacity cannot serve every request on time, and the question is which ones
it turns away. A plan that drops the requests it would finish late (dp-tardy, paper 003 section
4.2) decides only once a request has been decoded and has waited; past capacity the queue then
grows to the edge of the deadline and the plans drop requests from the middle of it, each after
its decode and its share of planning. Admission turns the newest away at the door instead,
while the work already queued leaves it no room:

    tail(a, p) = min over 1 <= b <= B of run(a, p .. end, b) / b     (Deployment.tail_ms)
    work       = sum over queued requests r of tail(app_r, position_r)
    admit r    iff  work + (ahead + 1) * tail(app_r, position_r) <= share * (deadline_r - now)

with `ahead` the arrivals still being decoded (not yet queued) and `tail` what one request
costs a saturated server, which runs the batch size cheapest per sample. The queued requests
are counted from where they stand (a running step's from where it started). No plan is read, so
the rule cannot go stale while a long step runs.
`share` < 1 holds the queue short of the deadline: plans' predictions for the back of a long
queue drift as it waits (the server's measurements: server/runtime.py, "Admission").
"""

from __future__ import annotations

from scheduler.state import SchedulerState


def room_for(
    state: SchedulerState,
    app: str,
    position: int,
    deadline_ms: float,
    now_ms: float,
    ahead: int = 0,
    share: float = 1.0,
) -> bool:
    """Whether a request of `app` entering at `position` at `now_ms` is admitted (the module
    docstring's rule). O(queued requests)."""
    d = state.deployment
    work_ms = sum(d.tail_ms(r.app, r.position) for r in state)
    work_ms += (ahead + 1) * d.tail_ms(app, position)
    return work_ms <= share * (deadline_ms - now_ms)

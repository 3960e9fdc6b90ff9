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
`turns_away` is the gate both drivers call on an arrival: the server with ADMISSION_SHARE, the
simulator with its `admission_share` (off by default: there no prediction drifts).
"""

from __future__ import annotations

from scheduler.policies import DROPS_LATE
from scheduler.state import SchedulerState
from scheduler.types import Request

# the server's share (server/runtime.py, "Admission"; bench/results/peers-log.md, session 75)
ADMISSION_SHARE = 2 / 3


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


def turns_away(
    state: SchedulerState,
    policy: str,
    request: Request,
    now_ms: float,
    share: float | None,
    ahead: int = 0,
) -> bool:
    """Whether `request`, arriving at `now_ms`, is turned away before it joins `state`: only
    under a policy that drops the requests it would finish late (`DROPS_LATE`) and with a
    `share` (None: admission off), when `room_for` finds it no room. A request of an unknown app
    or past its app's end is never turned away here (it is left to the checks that name it)."""
    if share is None or policy not in DROPS_LATE:
        return False
    d = state.deployment
    if request.app not in d.apps or request.position >= d.app_length(request.app):
        return False
    return not room_for(
        state, request.app, request.position, request.deadline_ms, now_ms, ahead, share
    )

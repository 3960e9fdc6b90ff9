"""Admission past capacity: whether a new request has room at the back of the queue.

A server past its capacity cannot serve every request on time, and the question is which ones
it turns away. A plan that drops the requests it would finish late (dp-tardy, paper 003 section
4.2) decides only once a request has been decoded and has waited; past capacity the queue then
grows to the edge of the deadline and the plans drop requests from the middle of it, each after
its decode and its share of planning. Admission turns the newest away at the door instead,
while the work already queued leaves it no room:

    tail(a, p) = min over 1 <= b <= B of run(a, p .. end, b) / b     (Deployment.tail_ms)
    work       = sum over queued requests r of tail(app_r, position_r)
    admit r    iff  work + (ahead + 1) * tail(app_r, position_r) <= s * (deadline_r - now)
    s          = share while the queue is overloaded, else 1

with `ahead` the arrivals still being decoded (not yet queued) and `tail` what one request
costs a saturated server, which runs the batch size cheapest per sample. The queued requests
are counted from where they stand (a running step's from where it started). No plan is read, so
the rule cannot go stale while a long step runs.

Overloaded: from the first request of the queue dropped (turned away here, dropped by a plan,
or at its deadline) until an arrival finds the queue empty. The margin `share` < 1 is for a
queue that later arrivals keep joining: measured on a server past its capacity (mobilenet_v2,
1000 ms, 340 req/s, 2 replicas), requests admitted behind 400-700 ms of counted work finished
after 1.46-1.48 times it, while the steps themselves drained the counted work at 0.85-1 of the
count: the rest is later arrivals' layers, which the plans keep running ahead of theirs. At the
back of a burst that stops, the last requests finished after 1.02-1.07 times it (googlenet
under the Azure trace), so a queue that passes the share for a moment and then drains loses
nothing by admitting to the deadline: a drop is the evidence that it does not drain in time
(bench/results/peers-log.md, session 77). The share stays fixed while overloaded. Three other
rules were tried in session 79: a share from the measured finish-to-count ratio of answered
requests lost up to 0.135 on time past capacity; holding it only while arrivals outnumber
on-time answers moved nothing beyond noise; a margin of 4 ms per queued request lost 0.068 on
googlenet at 300 ms. A burst differs from a steady overload only in that it stops, and nothing
measured before then says so.
`Admission` is the door both drivers keep per queue: the server with ADMISSION_SHARE, the
simulator with its `admission_share` (off by default).
"""

from __future__ import annotations

from scheduler.policies import DROPS_LATE
from scheduler.state import SchedulerState
from scheduler.types import Request

# the server's share while overloaded (server/runtime.py, "Admission"; bench/results/peers-log.md,
# sessions 75 and 77)
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


class Admission:
    """One queue's door: the module docstring's rule, with its overload state. Drivers call
    `turns_away` on each arrival and `dropped` for each request of the queue dropped."""

    def __init__(self, share: float = ADMISSION_SHARE) -> None:
        """`share`: the part of a deadline the queued work may fill while overloaded, in (0, 1]."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"admission share: expected a number in (0, 1], got {share!r}")
        self.share = share
        self.overloaded = False

    def share_now(self) -> float:
        """The part of a deadline the queued work may fill now."""
        return self.share if self.overloaded else 1.0

    def turns_away(
        self, state: SchedulerState, policy: str, request: Request, now_ms: float, ahead: int = 0
    ) -> bool:
        """Whether `request`, arriving at `now_ms`, is turned away before it joins `state`: only
        under a policy that drops the requests it would finish late (`DROPS_LATE`), when
        `room_for` finds it no room within `share_now()`. An arrival that finds the queue empty
        (nothing queued, none `ahead`) ends an overload. A request of an unknown app or past its
        app's end is never turned away here (it is left to the checks that name it)."""
        if policy not in DROPS_LATE:
            return False
        d = state.deployment
        if request.app not in d.apps or request.position >= d.app_length(request.app):
            return False
        if len(state) == 0 and ahead == 0:
            self.overloaded = False
        return not room_for(
            state, request.app, request.position, request.deadline_ms, now_ms, ahead,
            self.share_now(),
        )  # fmt: skip

    def dropped(self) -> None:
        """A request of this queue was dropped, here or later: the queue is overloaded."""
        self.overloaded = True

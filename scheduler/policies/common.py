"""Rules every policy shares: expired requests are dropped, and request order."""

from __future__ import annotations

from scheduler.state import SchedulerState
from scheduler.types import Drop, Request

EXPIRED = "deadline passed before it finished"
HOPELESS = "cannot finish by its deadline even if run alone now"
QUEUE_FULL_AHEAD = "the requests queued ahead of it already fill its deadline"
PREDICTED_LATE = "the schedule that serves the most requests on time finishes it too late"


def split_expired(state: SchedulerState, now_ms: float) -> tuple[list[Request], list[Drop]]:
    """Requests whose deadline has passed are dropped (all policies, as in paper 003 section 6.3);
    the others are returned in arrival order (ties by id)."""
    live, drops = [], []
    for r in state:
        if r.deadline_ms <= now_ms:
            drops.append(Drop(r.id, EXPIRED))
        else:
            live.append(r)
    live.sort(key=arrival_order)
    return live, drops


def arrival_order(r: Request) -> tuple[float, str]:
    return (r.arrival_ms, r.id)

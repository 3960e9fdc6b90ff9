"""What an ideal server at the batched ceiling would serve under a run's own arrivals (issue 9).

The batched ceiling (bench/peers.py) is a rate, so against Poisson arrivals it says directly how
far a capacity is from what the machine can do; under the Azure trace the rate is the trace's
mean and its bursts run far above it, so the ceiling alone says nothing there. The ideal server
answers for both. It takes exactly 1 / ceiling seconds of device time for every request, as if
each ran in a full batch with no wait to fill it, serves the requests in arrival order, and turns
away at once any it cannot finish by its deadline (so a hopeless request costs nothing):

    start_i = max(arrival_i, free);  served iff start_i + 1/ceiling <= arrival_i + deadline,
    and then free = start_i + 1/ceiling.

A real server batches only what has arrived, spends time on the requests it gives up on, and
shares the cores, so it serves less than this at the same ceiling; its crossing of 0.9 against
this one's says how much of the machine a server turns into requests on time. Where 1.3x the
best peer's crossing is at or above the ideal server's, the issue's target is out of reach on
this machine whatever the schedule, short of running batches faster than the ceiling's.

Read the other way, a server's own crossing names the ceiling an ideal server would need to
cross where it does (`equivalent_ceiling_rps`): the rate it turns the machine into requests on
time at under these arrivals. Under the trace that comes out well below the ceiling for every
server (resnet18 at 1000 ms: about 37 req/s of a ceiling of 53.5), while under Poisson arrivals
near capacity the servers come close to it: bursts cost them a share of the machine that a
steady load does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def ideal_on_time_ratio(arrivals_s: np.ndarray, deadline_s: float, service_s: float) -> float:
    """The share of `arrivals_s` (seconds, ascending) the ideal server (module docstring)
    finishes within `deadline_s` of arrival, each taking `service_s`; 1.0 for no arrivals."""
    if len(arrivals_s) == 0:
        return 1.0
    free_s, served = 0.0, 0
    for arrival in arrivals_s.tolist():
        end = max(arrival, free_s) + service_s
        if end <= arrival + deadline_s:
            free_s, served = end, served + 1
    return served / len(arrivals_s)


def ideal_crossing_rps(
    arrivals_at: Callable[[float], np.ndarray],
    deadline_ms: float,
    ceiling_rps: float,
    threshold: float = 0.9,
    tol: float = 0.005,
) -> float:
    """The rate (req/s) where the ideal server at `ceiling_rps` falls to `threshold` on time,
    with `arrivals_at(rate)` giving the run's arrivals at each rate, found by bisection to a
    relative `tol` (the ratio falls with the rate, up to the noise of Poisson draws); infinity
    when it stays on time at 1000x the ceiling (a deadline longer than all the arrivals need)."""
    if ceiling_rps <= 0:
        raise ValueError(f"the batched ceiling must be a positive rate, got {ceiling_rps!r}")

    def ok(rate: float) -> bool:
        ratio = ideal_on_time_ratio(arrivals_at(rate), deadline_ms / 1000.0, 1.0 / ceiling_rps)
        return ratio >= threshold

    return _edge(ok, ceiling_rps, tol)


def equivalent_ceiling_rps(
    arrivals_at: Callable[[float], np.ndarray],
    deadline_ms: float,
    crossing_rps: float,
    threshold: float = 0.9,
    tol: float = 0.005,
) -> float:
    """The ceiling (req/s) at which the ideal server crosses `threshold` at `crossing_rps`, as a
    measured server does (`ideal_crossing_rps` grows with the ceiling), to a relative `tol`."""
    if crossing_rps <= 0:
        raise ValueError(f"a crossing must be a positive rate, got {crossing_rps!r}")

    def short(ceiling: float) -> bool:
        crossing = ideal_crossing_rps(arrivals_at, deadline_ms, ceiling, threshold, tol / 2)
        return crossing < crossing_rps

    return _edge(short, crossing_rps, tol)


def _edge(below: Callable[[float], bool], start: float, tol: float) -> float:
    """The positive x where `below(x)` turns from true to false (assumed true near 0), to a
    relative `tol`: `start` doubled until `below` fails, then bisected; infinity when it still
    holds at 1000x `start`."""
    lo, hi = 0.0, start
    while below(hi):
        if hi > 1000 * start:
            return math.inf
        lo, hi = hi, hi * 2
    while hi - lo > tol * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if below(mid) else (lo, mid)
    return (lo + hi) / 2

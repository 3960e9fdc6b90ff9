"""Which replica of a server takes a new request (`layerbatch serve --replicas N`).

A server may run N replicas of its runtime on one machine, each with its own share of the cores
(torch threads of its own), its own queue and its own plans, the models' weights shared: requests
in different replicas never batch together, and a replica's plans are the paper's (sections
4.1-4.3) over its own requests. A new request joins the replica with the least work left (join
the shortest queue, weighted by work):

    W(i) = sum over the requests replica i holds of solo(app, entry position)
    chosen = argmin_i W(i), ties to the lowest i

with solo the time one request takes alone from its entry position to the end of its app at batch
1 (`Deployment.solo_ms`), counted from when the request is dispatched until it is answered. It
overstates what batching leaves of the work and ignores how far each request has got, but it
is kept up to date in O(1) per request, and with requests of one app it is join-the-shortest-queue.
Why replicas at all, and what they gained on a 2-core CPU: the README's "Replicas".
"""

from __future__ import annotations

from collections.abc import Sequence


def choose_replica(work_left_ms: Sequence[float]) -> int:
    """The replica a new request joins: the one with the least work left (the first of those
    tied). Raises ValueError when there is none."""
    if not work_left_ms:
        raise ValueError("work_left_ms: expected one entry per replica, got none")
    return min(range(len(work_left_ms)), key=lambda i: (work_left_ms[i], i))

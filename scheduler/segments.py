"""Segments: the unit of layer-wise batching (paper 003, section 4.1, Fig. 2).

A segment of app `a` is a set of a's requests that run together to the end of a's chain: the least
advanced member runs first, and every other member joins the batch at the stage where it stands.
While the segment passes through a model that other apps share, it also picks up *riders*:
requests of those apps standing at the stage it reaches (section 4.3, "batched with any requests
arriving earlier ... at the shared layers up to the bound B"). Riders leave at the end of the
shared model and go on to the next model of their own app later.

Its duration at stage k is h_k(batch_k) where batch_k = members at or behind k + riders on board;
a batch above B costs +inf. The batch changes only where a member joins or a rider boards, so the
duration is a sum over those stretches, each priced by `Deployment.run_ms` (memoised) and added in
order. walk(segment) costs O(stages + members + riders); without riders, O(members + models) for
its duration and O(members * (members + models)) with its actions (the planners' most frequent
questions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.deployment import Deployment
from scheduler.types import Action


@dataclass(frozen=True)
class Rider:
    """A request of another app standing at a model that app `a` also runs.

    `pos` is its stage mapped into a's chain; it rides until `leave` (the shared model's end in
    a's chain) and then stands at `next_pos` in its own app's chain.
    """

    id: str
    pos: int
    leave: int
    next_pos: int


@dataclass
class Walk:
    """The result of walking one segment: its duration, and when asked, its actions."""

    duration_ms: float
    actions: list[Action] = field(default_factory=list)
    riders: list[Rider] = field(default_factory=list)


def walk(
    d: Deployment,
    app: str,
    members: Sequence[tuple[int, str]],
    riders: Sequence[Rider] = (),
    build: bool = False,
) -> Walk:
    """Walk a segment of `app`.

    `members` are (position, id) sorted by ascending position; `riders` are sorted by ascending
    `pos` and all stand at or after members[0]. Riders board while the model's bound B leaves room
    beside the members that will be on board at the model's last stage; the rest stay behind.
    With `build`, also return the actions (one per stretch of stages with the same batch) and the
    riders that boarded.
    """
    if not riders:
        return _alone(d, app, members, build)
    return _by_stage(d, app, members, riders, build)


def _by_stage(
    d: Deployment,
    app: str,
    members: Sequence[tuple[int, str]],
    riders: Sequence[Rider],
    build: bool,
) -> Walk:
    """`walk` one stage at a time (riders board stage by stage)."""
    start = members[0][0]
    n = len(members)
    out = Walk(0.0)
    total = 0.0
    mi = 0  # members on board
    ri = 0
    own_ids: list[str] = []
    n_riders = len(riders)
    for link in d.chain(app):
        end = link.end
        if end <= start:
            continue
        limit = d.batch_limit(link.model)
        off = link.offset
        own_at_end = mi
        while own_at_end < n and members[own_at_end][0] < end:
            own_at_end += 1
        room = limit - own_at_end
        aboard: list[Rider] = []
        k = max(start, off)
        seg_from = k
        while k < end:
            new_m = mi
            while new_m < n and members[new_m][0] == k:
                new_m += 1
            boarding: list[Rider] = []
            while ri < n_riders and riders[ri].pos <= k:
                r = riders[ri]
                if r.pos == k and r.leave == end and room > 0:
                    boarding.append(r)
                    room -= 1
                ri += 1
            if (new_m > mi or boarding) and k > seg_from:  # the stretch before k ends here
                total += d.run_ms(link.model, seg_from - off, k - off, mi + len(aboard))
                if build:
                    out.actions.append(
                        _action(link.model, seg_from - off, k - off, own_ids, aboard)
                    )
                seg_from = k
            if build and new_m > mi:
                own_ids.extend(members[j][1] for j in range(mi, new_m))
            mi = new_m
            if boarding:
                aboard.extend(boarding)
            if mi + len(aboard) > limit:
                return Walk(math.inf)
            k += 1
        total += d.run_ms(link.model, seg_from - off, end - off, mi + len(aboard))
        if build:
            out.actions.append(_action(link.model, seg_from - off, end - off, own_ids, aboard))
            out.riders.extend(aboard)
    out.duration_ms = total
    return out


def _alone(d: Deployment, app: str, members: Sequence[tuple[int, str]], build: bool) -> Walk:
    """`walk` without riders: the batch changes only where a member joins, so each stretch
    between two joins is priced (and with `build`, made an action) at once."""
    start, n = members[0][0], len(members)
    out = Walk(0.0)
    total, aboard = 0.0, 0
    for link in d.chain(app):
        end, off = link.end, link.offset
        if end <= start:
            continue
        k = max(start, off)
        while k < end:
            while aboard < n and members[aboard][0] <= k:
                aboard += 1
            stop = min(members[aboard][0], end) if aboard < n else end
            total += d.run_ms(link.model, k - off, stop - off, aboard)
            if math.isinf(total):
                return Walk(math.inf)
            if build:
                ids = tuple(rid for _, rid in members[:aboard])
                out.actions.append(Action(link.model, (k - off, stop - off), ids))
            k = stop
    out.duration_ms = total
    return out


def _action(model: str, k0: int, k1: int, own: list[str], riders: list[Rider]) -> Action:
    return Action(model, (k0, k1), tuple(own) + tuple(r.id for r in riders))

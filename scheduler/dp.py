"""The dynamic programs over segments of one app (paper 003, sections 4.1 and 4.2).

Order the app's requests furthest-along first (ties: earlier arrival) and cut the order into
units: one unit per request (`exact`, the paper's per-request O(R^2) form), per stage (the
layer-unit form) or per layer group (G groups of about equal time; the default). A unit never
holds more than B requests (dp-tardy may cut units further: `cut_after`). A segment is a contiguous
run of units j..i; segments run furthest first, so requests finish in arrival order (Lemma 1).
D(j..i) is the segment's walk duration (`segments.walk`), riders included.

Completion time (section 4.1), as a suffix recurrence over units 0..U-1:

    g(U) = 0
    g(j) = min_{i >= j, n(j..i) <= B}  D(j..i) * (S(j) + W) + g(i + 1)

where S(j) counts the app's requests in units j..U-1 and W the requests of apps that run after
this one: every request not yet finished waits while a segment runs, so g(0) is the total
completion time measured from the start of the app. O(U * U_B) segment walks, U_B the number
of units that fit in B. The table entry g(j) depends only on units j..U-1 and W, so after the
front units advance (an executed layer group) entries behind them are reused from `memo`
("Incremental update"); segment durations are memoised by content and survive arrivals too.

Tardy requests (section 4.2), as a prefix recurrence with start time t0:

    F(0) = {0 tardy: end t0}
    F(i+1)[t + late(j..i, e + D(j..i))] <- min end e + D(j..i)  over j <= i, (t, e) in F(j)

For a fixed number of tardy requests the earliest end dominates (later segments can only get
later), so keeping the smallest end per tardy count is exact; ties keep the smaller total
completion time. O(U * U_B * T) with T the number of tardy counts kept.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import Any, Literal

from scheduler.deployment import Deployment
from scheduler.segments import Rider, walk
from scheduler.types import Request

UnitMode = Literal["request", "layer", "group"]
MEMO_LIMIT = 200_000


@dataclass(frozen=True)
class Unit:
    """Requests that the DP keeps in one segment: (position, id) ascending, and their deadlines."""

    members: tuple[tuple[int, str], ...]
    deadlines: tuple[float, ...]  # sorted

    @property
    def min_pos(self) -> int:
        return self.members[0][0]

    @cached_property
    def key(self) -> tuple[int, ...]:
        """The members' positions: what the memos know a unit by (computed once)."""
        return tuple(p for p, _ in self.members)


@dataclass(frozen=True)
class AppProblem:
    """One app's requests cut into units (furthest first) and the riders it may pick up."""

    app: str
    units: tuple[Unit, ...]
    riders: tuple[Rider, ...]
    bound: int

    @property
    def count(self) -> int:
        return sum(len(u.members) for u in self.units)


@dataclass(frozen=True)
class Solution:
    """A segmentation: `cuts` lists (j, i) unit ranges in run order."""

    cuts: tuple[tuple[int, int], ...]
    cost_ms: float  # completion-time objective (weighted by S + W)
    duration_ms: float
    tardy: int = 0


def make_problem(
    d: Deployment,
    app: str,
    own: Sequence[tuple[Request, int]],
    riders: Sequence[Rider],
    mode: UnitMode,
    cut_after: frozenset[str] = frozenset(),
) -> AppProblem:
    """Cut the app's requests (each with its current position), given in arrival order (ties by
    id), into units: furthest along first, ties in arrival order (the sort is stable); each
    unit is cut further after each of `cut_after` that a request not in it follows (the pieces
    keep the order)."""
    bound = min(d.batch_limit(link.model) for link in d.chain(app))
    ordered = sorted(own, key=lambda rp: -rp[1])
    if mode == "request":
        keys: Sequence[object] = range(len(ordered))
    elif mode == "layer":
        keys = [pos for _, pos in ordered]
    else:
        groups = d.chain_groups(app)
        keys = [groups[pos] for _, pos in ordered]
    units: list[Unit] = []
    start = 0
    for k in range(1, len(ordered) + 1):
        if k == len(ordered) or keys[k] != keys[start] or k - start == bound:
            run = ordered[start:k]
            marked = [r.id in cut_after for r, _ in run]
            cuts = [0, *(n + 1 for n in range(len(run) - 1) if marked[n] and not marked[n + 1])]
            cuts.append(len(run))
            for a, b in pairwise(cuts):
                piece = run[a:b]
                # members ascending by position, ties in arrival order (the sort is stable)
                members = tuple((pos, r.id) for r, pos in sorted(piece, key=lambda rp: rp[1]))
                units.append(Unit(members, tuple(sorted(r.deadline_ms for r, _ in piece))))
            start = k
    return AppProblem(app, tuple(units), tuple(sorted(riders, key=lambda x: (x.pos, x.id))), bound)


class SegmentCosts:
    """D(j..i) for one problem, memoised by content (positions of members and riders)."""

    def __init__(self, d: Deployment, prob: AppProblem, memo: dict[Any, float]) -> None:
        self.d = d
        self.prob = prob
        self.memo = memo
        self._rider_pos = [r.pos for r in prob.riders]
        self._keys = [u.key for u in prob.units]

    def riders_for(self, j: int, i: int) -> tuple[Rider, ...]:
        """Riders the segment j..i passes first: at or after its start, before unit j-1's start."""
        units = self.prob.units
        lo = bisect.bisect_left(self._rider_pos, units[i].min_pos)
        if j == 0:
            hi = len(self._rider_pos)
        else:
            hi = bisect.bisect_left(self._rider_pos, units[j - 1].min_pos)
        return self.prob.riders[lo:hi]

    def members(self, j: int, i: int) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for u in range(i, j - 1, -1):
            out.extend(self.prob.units[u].members)
        return out

    def duration(self, j: int, i: int) -> float:
        riders = self.riders_for(j, i)
        key = (
            self.prob.app,
            tuple(self._keys[j : i + 1]),
            tuple(r.pos for r in riders),
        )
        hit = self.memo.get(key)
        if hit is None:
            hit = walk(self.d, self.prob.app, self.members(j, i), riders).duration_ms
            if len(self.memo) > MEMO_LIMIT:
                self.memo.clear()
            self.memo[key] = hit
        return hit


def solve_time(costs: SegmentCosts, waiting_after: int, memo: dict[Any, Any]) -> Solution:
    """Minimise total completion time of the app (plus `waiting_after` requests that wait)."""
    prob = costs.prob
    units = prob.units
    n_units = len(units)
    counts = [len(u.members) for u in units]
    suffix = [0] * (n_units + 1)
    for j in range(n_units - 1, -1, -1):
        suffix[j] = suffix[j + 1] + counts[j]
    rider_key = tuple(r.pos for r in prob.riders)
    g = [0.0] * (n_units + 1)
    dur = [0.0] * (n_units + 1)  # total duration of the chosen segments from j on
    choice = [n_units] * (n_units + 1)
    tail_key: tuple[Any, ...] = ()
    for j in range(n_units - 1, -1, -1):
        tail_key = (units[j].key, tail_key)
        # g(j) also depends on where unit j-1 starts: it bounds the riders segments from j see.
        fence = units[j - 1].min_pos if j > 0 else -1
        key = (prob.app, waiting_after, rider_key, fence, tail_key)
        hit = memo.get(key)
        if hit is not None:  # (g, duration, segment length in units): all relative to j
            g[j], dur[j], choice[j] = hit[0], hit[1], j + hit[2]
            continue
        best, best_i, best_d = math.inf, n_units - 1, math.inf
        size = 0
        weight = suffix[j] + waiting_after
        for i in range(j, n_units):
            size += counts[i]
            if size > prob.bound:
                break
            seg = costs.duration(j, i)
            if math.isinf(seg):
                break
            c = seg * weight + g[i + 1]
            if c < best:
                best, best_i, best_d = c, i, seg + dur[i + 1]
        g[j], dur[j], choice[j] = best, best_d, best_i
        if len(memo) > MEMO_LIMIT:
            memo.clear()
        memo[key] = (best, best_d, best_i - j)
    cuts = []
    j = 0
    while j < n_units:
        cuts.append((j, choice[j]))
        j = choice[j] + 1
    return Solution(tuple(cuts), g[0], dur[0])


def solve_tardy(costs: SegmentCosts, start_ms: float, now_ms: float) -> Solution:
    """Minimise the number of the app's requests that finish after their deadline."""
    units = costs.prob.units
    n_units = len(units)
    counts = [len(u.members) for u in units]
    # frontier[i]: tardy count -> (end_ms, completion sum, j, previous tardy count)
    frontier: list[dict[int, tuple[float, float, int, int]]] = [{} for _ in range(n_units + 1)]
    frontier[0][0] = (start_ms, 0.0, -1, -1)
    for i in range(n_units):
        size = 0
        cell = frontier[i + 1]
        deadlines: list[float] = []  # of units j..i, sorted
        for j in range(i, -1, -1):
            size += counts[j]
            if size > costs.prob.bound:
                break
            seg = costs.duration(j, i)
            if math.isinf(seg):
                break
            deadlines = sorted([*deadlines, *units[j].deadlines])  # two sorted runs: linear
            for t_prev, (end, csum, _, _) in frontier[j].items():
                e2 = end + seg
                t2 = t_prev + bisect.bisect_left(deadlines, e2)
                c2 = csum + (e2 - now_ms) * size
                old = cell.get(t2)
                if old is None or (e2, c2) < (old[0], old[1]):
                    cell[t2] = (e2, c2, j, t_prev)
        _prune(cell)
    t_best = min(frontier[n_units])
    end, csum, _, _ = frontier[n_units][t_best]
    cuts = []
    i, t = n_units, t_best
    while i > 0:
        _, _, j, t_prev = frontier[i][t]
        cuts.append((j, i - 1))
        i, t = j, t_prev
    cuts.reverse()
    return Solution(tuple(cuts), csum, end - start_ms, t_best)


def _prune(cell: dict[int, tuple[float, float, int, int]]) -> None:
    """Drop entries with more tardy requests and no earlier end than a smaller count has."""
    best_end = math.inf
    for t in sorted(cell):
        if cell[t][0] >= best_end:
            del cell[t]
        else:
            best_end = cell[t][0]

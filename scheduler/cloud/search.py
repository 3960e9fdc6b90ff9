"""Exact choice of one option per module of a DAG app under its end-to-end latency objective.

Each module m offers options (latency_s, cost), sorted by latency ascending with cost strictly
descending (a Pareto frontier). The problem (the combination step of the brute-force optimum the
papers compare with, Harpagon §IV-B, Piccolo §IV-B; and the search of Nexus' quantized split):

    minimise   sum_m cost(o_m)
    subject to sum_{m in P} latency(o_m) <= L      for every source-to-sink path P of the DAG

Branch and bound over the modules in topological order. When module u is chosen its ancestors are
fixed, so its latency may be at most L - head(u) - tail(u), where head(u) is the longest fixed
path into u and tail(u) the longest path out of u at every later module's fastest option (a lower
bound on what they add). The bound of a partial choice is its cost plus, for every later module,
the cheapest option that fits the room left to it with the fixed modules at their latencies and
the others at their fastest; options are tried cheapest first and a branch stops as soon as its
bound reaches the best complete choice. Worst case prod_m |options_m|; in practice the bound cuts
almost everything (a few thousand nodes for three modules of a few hundred options).
Latency comparisons use `latency.fits` (the planner's tolerance).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from scheduler.cloud.latency import REL_TOL, fits
from scheduler.cloud.workload import App, module_parents


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (latency, cost) points on the frontier, by latency ascending: each kept
    point is strictly cheaper than every kept point with a smaller latency; among equal points
    the first is kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    kept: list[int] = []
    best = math.inf
    for i in order:
        cost = points[i][1]
        if not kept or cost < best - REL_TOL * max(abs(best), 1.0):
            kept.append(i)
            best = cost
    return kept


def cheapest_combination(
    app: App,
    options: Mapping[str, Sequence[tuple[float, float]]],
    slo_s: float | None = None,
) -> tuple[float, dict[str, int]] | None:
    """The cheapest choice of one option per module of `app` whose every path fits `slo_s`
    (default: the app's SLO), as (total cost, {module: option index}); None when no choice fits.

    `options[m]` must be a Pareto frontier: latency ascending, cost strictly descending.
    Guaranteed: the choice is optimal over all combinations (exact, ties to the first found)."""
    limit_s = app.slo_s if slo_s is None else slo_s
    order = list(app.modules)
    parents = module_parents(app)
    children: dict[str, list[str]] = {m: [] for m in order}
    for m, ps in parents.items():
        for p in ps:
            children[p].append(m)
    lats = {m: [o[0] for o in options[m]] for m in order}
    costs = {m: [o[1] for o in options[m]] for m in order}
    if any(not lats[m] for m in order):
        return None
    fastest = {m: lats[m][0] for m in order}
    tail: dict[str, float] = {}
    for m in reversed(order):
        tail[m] = max((fastest[c] + tail[c] for c in children[m]), default=0.0)

    def last_fitting(m: str, head_s: float) -> int:
        """Index of the slowest (cheapest) option of m that fits after head_s; -1 if none."""
        room = limit_s - head_s - tail[m]
        k = bisect.bisect_right(lats[m], room + REL_TOL * max(abs(limit_s), 1e-3)) - 1
        while k >= 0 and not fits(head_s + lats[m][k] + tail[m], limit_s):
            k -= 1
        return k

    def bound(i: int, end_s: dict[str, float]) -> float:
        """Cheapest possible cost of modules order[i:] given the fixed path ends `end_s`."""
        ends = dict(end_s)
        total = 0.0
        for m in order[i:]:
            head = max((ends[p] for p in parents[m]), default=0.0)
            k = last_fitting(m, head)
            if k < 0:
                return math.inf
            total += costs[m][k]
            ends[m] = head + fastest[m]
        return total

    best_cost = math.inf
    best: dict[str, int] = {}
    chosen: dict[str, int] = {}
    end_s: dict[str, float] = {}

    def visit(i: int, cost: float) -> None:
        nonlocal best_cost, best
        if i == len(order):
            if cost < best_cost:
                best_cost, best = cost, dict(chosen)
            return
        m = order[i]
        head = max((end_s[p] for p in parents[m]), default=0.0)
        k_max = last_fitting(m, head)
        if k_max < 0:
            return
        end_s[m] = head + fastest[m]
        floor_rest = bound(i + 1, end_s)
        for k in range(k_max, -1, -1):
            here = cost + costs[m][k]
            if here + floor_rest >= best_cost:
                break  # slower options of m are dearer and leave at least this bound
            end_s[m] = head + lats[m][k]
            if here + bound(i + 1, end_s) >= best_cost:
                continue
            chosen[m] = k
            visit(i + 1, here)
        end_s.pop(m, None)
        chosen.pop(m, None)

    visit(0, 0.0)
    if not best:
        return None
    return best_cost, best

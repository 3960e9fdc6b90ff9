"""Every configuration set of one module, bounded, and its (worst case, cost) Pareto frontier.

This is the per-module half of the brute-force optimum the papers compare with (Harpagon §IV-B,
Piccolo §IV-B); `search.cheapest_combination` is the other half. The space E(M) enumerated for a
module M at rate T under one dispatch model (configurations P_M sorted by t / p descending, as
Algorithm 1 and TC dispatch order them):

    a set is k <= K tuples (c_1, f_1) ... (c_k, f_k) of distinct configurations, in P_M's order;
    every tuple but the last carries whole machines, f_i = n_i t_i with n_i >= 1, and n_i is one
      of the J largest counts that leave the later tuples a positive rate;
    the last tuple carries the rest, T - sum_{i<k} f_i: floor of it in whole machines and at
      most one partially loaded machine; with dummy requests allowed, also the variant whose
      partial machine is filled to a whole one with dummy requests (d = its idle rate);
    its worst case is `latency.module_latency_s` (the planner's model), its cost sum p_i f_i / t_i.

K = 3 and J = 3 by default. Dummy requests anywhere in a set act on worst cases only through the
rates every machine collects at, so padding the last tuple stands for padding anywhere; what E
leaves out is a partial machine padded to a rate strictly between its own and a whole machine
(Piccolo's dummy rule makes such sets, d = b / (L - d_i) - u_i for a budget L), sets of more
than K tuples, and non-last tuples running fewer than their J largest counts. With dummy requests
allowed, the fastest set of E is the fastest set of any size with at most one machine of dummy
requests (see `fastest_set`).

Size: sum over k <= K of C(|P_M|, k) J^(k-1) sets before pruning. Depth-first in P_M's order,
a branch (fixed tuples, rate left r, next configuration c) is cut, without losing a frontier
point, when every set it can make is slower than `cap_s` or dominated by a set already found:
its worst case is at least that of its fixed tuples and of c collecting r plus the most dummy
requests a set holds, its cost at least that of its fixed tuples plus r / (t / p of c), the best
ratio left. 0.1 to 10 ms per module for the generator's 44-configuration modules.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from scheduler.cloud.configs import ModulePlan, by_throughput_per_price
from scheduler.cloud.latency import (
    REL_TOL,
    Assignment,
    Dispatch,
    machine_latency_s,
    module_latency_s,
    set_cost,
    single_set_latency_s,
    whole_machines,
)
from scheduler.cloud.search import pareto
from scheduler.cloud.workload import Config

MAX_TUPLES = 3
COUNTS = 3


def module_frontier(
    profile: Sequence[Config],
    rate_rps: float,
    dispatch: Dispatch,
    *,
    max_tuples: int = MAX_TUPLES,
    counts: int = COUNTS,
    dummy: bool = True,
    cap_s: float = math.inf,
) -> list[ModulePlan]:
    """The Pareto frontier of E(M) (module docstring) among sets whose worst case is at most
    `cap_s`: latency ascending, cost strictly descending. Empty when no set fits the cap.

    Guaranteed: every returned set carries rate_rps plus its dummy_rps, `wcl_s` and `cost` are
    the planner's own (`module_latency_s`, `set_cost`), and no set of E with a worst case within
    `cap_s` is both faster and cheaper than the frontier point at or below its latency."""
    ordered = by_throughput_per_price(profile)
    t = [c.throughput_rps for c in ordered]
    per_price = [c.throughput_per_price for c in ordered]
    most_dummy = max(t) if dummy else 0.0
    cap = cap_s * (1 + REL_TOL)
    cands: list[tuple[float, float, tuple[tuple[int, float], ...], float]] = []
    front_s: list[float] = []  # running frontier of cands: latency ascending,
    front_cost: list[float] = []  # cost strictly descending

    def full_s(c: Config, collect_rps: float, own_rps: float) -> float:
        return machine_latency_s(c, collect_rps, True, own_rps, dispatch)

    def dominated(latency_s: float, cost: float) -> bool:
        """Whether a found set is at least as fast and at least as cheap."""
        k = bisect.bisect_right(front_s, latency_s) - 1
        return k >= 0 and front_cost[k] <= cost

    def emit(prefix: list[tuple[int, float, float]], j: int, last_rps: float, dum: float) -> None:
        """Score the set prefix + (ordered[j], last_rps) padded with `dum` dummy rps."""
        worst = 0.0
        for i, f, rem in prefix:
            worst = max(worst, full_s(ordered[i], rem + dum, f))
        c = ordered[j]
        n = whole_machines(last_rps, t[j])
        x = last_rps - n * t[j]
        if x <= REL_TOL * max(t[j], last_rps):
            x = 0.0
        if n >= 1:
            worst = max(worst, full_s(c, last_rps, n * t[j]))
        if x > 0:
            worst = max(worst, machine_latency_s(c, x, False, x, dispatch))
        if worst > cap:
            return
        cost = sum(f / per_price[i] for i, f, _ in prefix) + last_rps / per_price[j]
        if dominated(worst, cost):
            return
        rates = tuple((i, f) for i, f, _ in prefix) + ((j, last_rps),)
        cands.append((worst, cost, rates, dum))
        k = bisect.bisect_left(front_s, worst)
        while k < len(front_s) and front_cost[k] >= cost:  # drop points this one dominates
            del front_s[k], front_cost[k]
        front_s.insert(k, worst)
        front_cost.insert(k, cost)

    def visit(j0: int, rem: float, prefix: list[tuple[int, float, float]], floor_s: float) -> None:
        """Sets that extend `prefix` with configurations j0.. carrying `rem`; `floor_s` bounds
        the worst case of the prefix from below (its tuples with the most dummy requests)."""
        spent = sum(f / per_price[i] for i, f, _ in prefix)
        for j in range(j0, len(ordered)):
            c = ordered[j]
            # Any tuple of c here collects at most rem + the most dummy a set holds; the rest
            # of the rate costs at least rem / (t / p) of c, the best ratio left.
            here_s = max(floor_s, full_s(c, rem + most_dummy, t[j]))
            if here_s > cap or dominated(here_s, spent + rem / per_price[j]):
                continue
            n = whole_machines(rem, t[j])
            x = rem - n * t[j]
            if x <= REL_TOL * max(t[j], rem):
                x = 0.0
            emit(prefix, j, rem, 0.0)
            if dummy and x > 0:
                emit(prefix, j, (n + 1) * t[j], (n + 1) * t[j] - rem)
            if len(prefix) + 1 >= max_tuples:
                continue
            hi = n if x > 0 else n - 1
            for m in range(hi, max(0, hi - counts), -1):
                visit(j + 1, rem - m * t[j], [*prefix, (j, m * t[j], rem)], here_s)

    if rate_rps > 0:
        visit(0, rate_rps, [], 0.0)
    fast = pareto([(w, c) for w, c, _, _ in cands])
    plans: list[ModulePlan] = []
    for k in fast:
        _, _, rates, dum = cands[k]
        plans.append(_plan_of([Assignment(ordered[i], f) for i, f in rates], dum, dispatch))
    return [plans[i] for i in pareto([(p.wcl_s, p.cost) for p in plans])]


def fastest_set(
    profile: Sequence[Config],
    rate_rps: float,
    dispatch: Dispatch,
    *,
    max_tuples: int = MAX_TUPLES,
    dummy: bool = True,
) -> ModulePlan:
    """The set of E(M) with the smallest worst case (ties: cheapest).

    With dummy requests allowed this is one configuration on whole machines (the last one
    filled with dummy requests), and no set of any number of tuples holding less than one
    machine of dummy requests is faster: the last tuple c_k of any set collects at most
    ceil(T / t_k) t_k, which this set's machines collect at (TC; under the other models a
    whole machine is the fastest a machine of c_k gets). Without dummy requests it is the
    fastest set of E (K tuples, module docstring)."""
    if dummy:
        best: tuple[float, float, float, Config] | None = None
        for c in profile:
            tput = c.throughput_rps
            filled_rps = max(1, math.ceil(rate_rps / tput - REL_TOL)) * tput
            for rate in (rate_rps, filled_rps):
                key = (single_set_latency_s(c, rate, dispatch), c.price * rate / tput, rate, c)
                if best is None or key[:2] < best[:2]:
                    best = key
        assert best is not None, "a validated profile is never empty"
        return _plan_of([Assignment(best[3], best[2])], best[2] - rate_rps, dispatch)
    return module_frontier(profile, rate_rps, dispatch, max_tuples=max_tuples, dummy=False)[0]


def _plan_of(assignments: list[Assignment], dummy_rps: float, dispatch: Dispatch) -> ModulePlan:
    return ModulePlan(
        assignments=tuple(assignments),
        dummy_rps=max(dummy_rps, 0.0),
        cost=set_cost(assignments),
        wcl_s=module_latency_s(assignments, dispatch),
    )

"""Configuration sets for one module at one rate under one latency budget (Harpagon §III-C).

Algorithm 1 (GenerateConfig), generalised to any dispatch model and an optional tuple limit K:
    P_M = configurations (hardware x batch x concurrency) sorted by t / p descending
    rw <- T_M; k <- 0
    while rw > 0:
        c <- P_M[k]; n <- rw / t_c
        if this is the K-th tuple: take all of rw with the first c' = P_M[k'], k' >= k, whose
            floor(n) full machines and partial machine all meet L_M; stop
        if n >= 1 and a full machine of c meets L_M (tc: d + b / rw):  floor(n) machines of c
        elif n < 1 and a partial machine of c meets L_M (tc: d + b / rw):  one machine at n
        else k <- k + 1 (no configuration left: infeasible)
With TC dispatch, rw is exactly the collection rate of the group taking it (the rate dispatched
to it and after it), so the step checks agree with Theorem 1 on the finished set.

Dummy requests (Theorem 2): for the set ordered by t / p with leftover workload
u_i = sum_{j > i} f_j, try T_M + dum_i with dum_i = t_i - u_i (Harpagon) or
dum_i = b_i / (L_M - d_i) - u_i (Piccolo), re-run Algorithm 1 and keep the cheapest set. When
Algorithm 1 is left with a residual no configuration can take (a tiny remainder collects too
slowly under TC), it takes the cheaper of: the last full tuple taking ceil(rw / t_i) more
machines padded with dummy requests (only if dummy requests are allowed), and backtracking
(that tuple gets one machine fewer; Algorithm 1 goes on from the next configuration). With
dummy requests allowed, every configuration c the loop looks at while rw is left also offers
the set that ends there, rw on ceil(rw / t_c) whole machines of c padded with dummy requests
(their group collects at least at rw), if those meet L_M: Algorithm 1 alone skips c when its
partial machine would collect too slowly, which padding cures. The cheapest option is kept.
Complexity: O(|P_M| log |P_M|) to sort, O(|P_M| (1 + N)) per run of Algorithm 1, N the
machines it backtracks (one per step, iteratively), K + 1 runs in all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scheduler.cloud.latency import (
    REL_TOL,
    Assignment,
    Dispatch,
    fits,
    machine_latency_s,
    module_latency_s,
    set_cost,
    single_set_latency_s,
    tc_order,
    whole_machines,
)
from scheduler.cloud.workload import Config

DummyRule = Literal["harpagon", "piccolo", "none"]


@dataclass(frozen=True)
class ModulePlan:
    """A module's configuration set: assignments in TC order, `dummy_rps` of padding included in
    their rates, `cost` (sum of price x rate / throughput) and worst case `wcl_s` (<= the budget
    it was made for, up to the tolerance of `fits`)."""

    assignments: tuple[Assignment, ...]
    dummy_rps: float
    cost: float
    wcl_s: float


def by_throughput_per_price(profile: Sequence[Config]) -> list[Config]:
    """P_M in Algorithm 1's order: t / p descending, ties by shorter duration, then by name."""
    return sorted(
        profile,
        key=lambda c: (-c.throughput_per_price, c.duration_s, c.hardware, c.batch, c.concurrency),
    )


def _takes_all(c: Config, rate_rps: float, budget_s: float, dispatch: Dispatch) -> bool:
    """Whether `c` can carry `rate_rps` on its own (full machines and the partial one)."""
    return fits(single_set_latency_s(c, rate_rps, dispatch), budget_s)


def generate_configs(
    ordered: Sequence[Config],
    rate_rps: float,
    budget_s: float,
    dispatch: Dispatch,
    max_tuples: int | None = None,
    pad_residual: bool = False,
) -> tuple[list[Assignment], float] | None:
    """Algorithm 1 on `ordered` (from `by_throughput_per_price`) for `rate_rps` > 0.

    Returns (assignments in TC order, dummy rps added by residual padding) or None when no set
    is found. Guaranteed: rates sum to rate_rps + dummy, at most `max_tuples` distinct
    configurations, and the set's worst case under `dispatch` fits `budget_s`."""
    eps = REL_TOL * max(rate_rps, 1.0)
    out: list[Assignment] = []
    rw, k = rate_rps, 0
    options: list[tuple[list[Assignment], float]] = []
    while True:
        pad_into = options if pad_residual else None
        rw, k, done = _greedy(ordered, out, rw, k, budget_s, dispatch, max_tuples, eps, pad_into)
        if done:
            options.append((out, 0.0))
            break
        # Stuck on a residual nothing takes: padding it is one option (if allowed); the other
        # is backtracking: the last tuple runs one machine fewer and Algorithm 1 goes on from
        # the next configuration. Each step removes a machine, so this ends.
        if pad_residual:
            padded = _pad(list(out), rw)
            if padded is not None:
                options.append(padded)
        if not out:
            break
        last = out.pop()
        t = last.config.throughput_rps
        if last.rate_rps - t > eps:
            out.append(Assignment(last.config, last.rate_rps - t))
        rw += t
        k = ordered.index(last.config) + 1
    return min(options, key=lambda o: set_cost(o[0]), default=None)


def _greedy(
    ordered: Sequence[Config],
    out: list[Assignment],
    rw: float,
    k: int,
    budget_s: float,
    dispatch: Dispatch,
    max_tuples: int | None,
    eps: float,
    padded: list[tuple[list[Assignment], float]] | None,
) -> tuple[float, int, bool]:
    """Algorithm 1 from state (out, rw, k), appending to `out`; returns (residual, next
    configuration, whether all the rate is placed). With `padded`, every configuration the loop
    looks at while a residual rw is left also records the set that stops there, placing rw on
    ceil(rw / t) whole machines of it padded with dummy requests, if those meet the budget."""
    while rw > eps:
        if k >= len(ordered):
            return rw, k, False
        if max_tuples is not None and len(out) == max_tuples - 1:
            for c in ordered[k:]:
                if _takes_all(c, rw, budget_s, dispatch):
                    _append(out, c, rw)
                    return 0.0, k, True
            return rw, len(ordered), False
        c = ordered[k]
        t = c.throughput_rps
        full = whole_machines(rw, t)
        if padded is not None and rw - full * t > eps:
            whole_rps = (full + 1) * t
            if fits(machine_latency_s(c, whole_rps, True, whole_rps, dispatch), budget_s):
                whole = list(out)
                _append(whole, c, whole_rps)
                padded.append((whole, whole_rps - rw))
        if full >= 1:
            if fits(machine_latency_s(c, rw, True, full * t, dispatch), budget_s):
                _append(out, c, full * t)
                rw -= full * t
                continue
        elif fits(machine_latency_s(c, rw, False, rw, dispatch), budget_s):
            _append(out, c, rw)
            rw = 0.0
            continue
        k += 1
    return rw, k, True


def _append(out: list[Assignment], c: Config, rate_rps: float) -> None:
    """Add `rate_rps` at `c`, merging with the previous tuple when it is the same configuration
    (its partial machine then comes after its full siblings, as TC dispatch orders them)."""
    if out and (out[-1].config is c or out[-1].config == c):
        out[-1] = Assignment(c, out[-1].rate_rps + rate_rps)
    else:
        out.append(Assignment(c, rate_rps))


def _pad(out: list[Assignment], rw: float) -> tuple[list[Assignment], float] | None:
    """Give the unplaceable residual `rw` to ceil(rw / t) more machines of the last (full) tuple,
    padded with dummy requests. Its machines then collect at least at the rate they were checked
    at (their own rate plus rw), so the set still meets the budget."""
    if not out:
        return None
    last = out[-1]
    t = last.config.throughput_rps
    extra = max(1, math.ceil(rw / t - REL_TOL))
    out[-1] = Assignment(last.config, last.rate_rps + extra * t)
    return out, extra * t - rw


def schedule_module(
    profile: Sequence[Config],
    rate_rps: float,
    budget_s: float,
    dispatch: Dispatch = "tc",
    max_tuples: int | None = None,
    dummy: DummyRule = "harpagon",
    *,
    presorted: bool = False,
) -> ModulePlan | None:
    """The cheapest of Algorithm 1's set and its dummy-request variants (Theorem 2).

    `presorted`: `profile` is already in `by_throughput_per_price` order (callers that build a
    module many times sort once). Returns None when no configuration set meets `budget_s` at
    `rate_rps` (with `dummy` "none", also when a residual cannot be placed). Guaranteed: `wcl_s`
    fits `budget_s`."""
    ordered = list(profile) if presorted else by_throughput_per_price(profile)
    pad = dummy != "none"
    base = generate_configs(ordered, rate_rps, budget_s, dispatch, max_tuples, pad)
    if base is None:
        return None
    best = _module_plan(base[0], base[1], dispatch)
    if dummy != "none":
        ranked = tc_order(best.assignments)
        for i, a in enumerate(ranked):
            leftover_rps = sum(b.rate_rps for b in ranked[i + 1 :])
            if leftover_rps <= REL_TOL * rate_rps:
                continue
            c = a.config
            if dummy == "harpagon":
                dum_rps = c.throughput_rps - leftover_rps
            elif budget_s > c.duration_s:
                dum_rps = c.batch / (budget_s - c.duration_s) - leftover_rps
            else:
                continue
            if dum_rps <= REL_TOL * rate_rps:
                continue
            cand = generate_configs(
                ordered, rate_rps + dum_rps, budget_s, dispatch, max_tuples, pad
            )
            if cand is None:
                continue
            plan = _module_plan(cand[0], dum_rps + cand[1], dispatch)
            if plan.cost < best.cost - REL_TOL * max(best.cost, 1.0):
                best = plan
    assert fits(best.wcl_s, budget_s), "configuration set exceeds its latency budget"
    return best


def _module_plan(assignments: list[Assignment], dummy_rps: float, dispatch: Dispatch) -> ModulePlan:
    ordered = tc_order(assignments)
    return ModulePlan(
        assignments=tuple(ordered),
        dummy_rps=dummy_rps,
        cost=set_cost(ordered),
        wcl_s=module_latency_s(ordered, dispatch),
    )

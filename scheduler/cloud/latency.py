"""Worst-case latency of a module's configuration set under a dispatch policy (Harpagon §III-B).

A configuration set is a list of tuples (c_i, f_i): configuration c_i (batch b_i, duration d_i,
throughput t_i = b_i s_i / d_i, price p_i) carrying request rate f_i, i.e. floor(f_i / t_i) fully
loaded machines and at most one partially loaded machine at rate f_i - floor(f_i / t_i) t_i.
Its cost is sum_i p_i f_i / t_i (frame-rate proportionality, Harpagon §III-A).

Dispatch models (`Dispatch`):
  tc       Throughput-cost dispatch, Theorem 1: machines ranked by r = t / p (descending); each
           receives whole batches; machine i collects at w_i = the rate dispatched to it and to
           every machine after it, so L_wc(i) = d_i + b_i / w_i. Fully loaded siblings of one
           configuration take batches in turn (they share w = f_i + rate after them); the
           configuration's partially loaded machine comes after them (w = its own rate + rate
           after it). This ordering is what makes Harpagon Table II come out as printed.
  rr       Round-robin of single requests: a fully loaded machine collects at its own throughput,
           d + b / t (= 2d at concurrency 1); a partially loaded one at its own rate r, d + b / r.
  machine  Per-machine-throughput estimate (Scrooge): d + b / t for every machine.
  2d       The papers' baseline estimate 2d for every machine, partial ones included (Piccolo
           Table II uses it).
The module's worst case is the maximum over its machines. Every function is O(K log K) for K
tuples. Comparisons against a budget use `fits` (relative tolerance 1e-9): several of the papers'
examples sit exactly on the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scheduler.cloud.workload import Config

Dispatch = Literal["tc", "rr", "machine", "2d"]
DISPATCHES: tuple[Dispatch, ...] = ("tc", "rr", "machine", "2d")

REL_TOL = 1e-9


def fits(latency_s: float, budget_s: float) -> bool:
    """latency_s <= budget_s up to a relative tolerance of 1e-9 (and 1e-12 s absolute)."""
    return latency_s <= budget_s + REL_TOL * max(abs(budget_s), 1e-3)


def whole_machines(rate_rps: float, throughput_rps: float) -> int:
    """floor(rate / throughput), rounding up values within 1e-9 of the next integer."""
    n = rate_rps / throughput_rps
    return math.floor(n + REL_TOL * max(1.0, n))


@dataclass(frozen=True)
class Assignment:
    """Configuration `config` carrying `rate_rps` (> 0), dummy requests included."""

    config: Config
    rate_rps: float

    @property
    def machines(self) -> float:
        """Machine count, fractional for a partially loaded machine: rate / throughput."""
        return self.rate_rps / self.config.throughput_rps

    @property
    def cost(self) -> float:
        """price x rate / throughput."""
        return self.config.price * self.machines

    def split(self) -> tuple[int, float]:
        """(number of fully loaded machines, rate of the partially loaded one, 0.0 if none)."""
        t = self.config.throughput_rps
        full = whole_machines(self.rate_rps, t)
        partial = self.rate_rps - full * t
        if partial <= REL_TOL * max(t, self.rate_rps):
            partial = 0.0
        return full, partial


def set_cost(assignments: Sequence[Assignment]) -> float:
    """Total cost of a configuration set: sum of price x rate / throughput."""
    return sum(a.cost for a in assignments)


def machine_latency_s(
    config: Config, collect_rps: float, full: bool, own_rps: float, dispatch: Dispatch
) -> float:
    """Worst-case latency of one machine running `config`.

    `collect_rps` is its TC batch-collection rate w (used by `tc` only), `full` whether it is
    fully loaded, `own_rps` the rate dispatched to it (used by `rr` for a partial machine)."""
    d, b = config.duration_s, config.batch
    if dispatch == "tc":
        return d + b / collect_rps
    if dispatch == "rr":
        return d + b / (config.throughput_rps if full else own_rps)
    if dispatch == "machine":
        return d + b / config.throughput_rps
    return 2.0 * d


def tc_order(assignments: Sequence[Assignment]) -> list[Assignment]:
    """Assignments in TC dispatch order: throughput-cost ratio descending (stable for ties)."""
    return sorted(assignments, key=lambda a: -a.config.throughput_per_price)


def assignment_latencies_s(
    assignments: Sequence[Assignment], dispatch: Dispatch
) -> list[tuple[Assignment, float]]:
    """Each assignment (in TC order) with the worst-case latency over its machines.

    Guaranteed: the module's worst case is the maximum of the returned latencies."""
    ordered = tc_order(assignments)
    out: list[tuple[Assignment, float]] = []
    after_rps = sum(a.rate_rps for a in ordered)
    for a in ordered:
        after_rps -= a.rate_rps
        after_rps = max(after_rps, 0.0)
        full, partial_rps = a.split()
        worst = 0.0
        if full > 0:
            rate = full * a.config.throughput_rps
            worst = machine_latency_s(
                a.config, rate + partial_rps + after_rps, True, rate, dispatch
            )
        if partial_rps > 0:
            worst = max(
                worst,
                machine_latency_s(a.config, partial_rps + after_rps, False, partial_rps, dispatch),
            )
        out.append((a, worst))
    return out


def single_set_latency_s(config: Config, rate_rps: float, dispatch: Dispatch) -> float:
    """`module_latency_s([Assignment(config, rate_rps)], dispatch)` without building the set:
    the worst case of `config` carrying all of `rate_rps` (full machines and a partial one)."""
    full, partial_rps = Assignment(config, rate_rps).split()
    worst = 0.0
    if full > 0:
        own = full * config.throughput_rps
        worst = machine_latency_s(config, own + partial_rps, True, own, dispatch)
    if partial_rps > 0:
        worst = max(worst, machine_latency_s(config, partial_rps, False, partial_rps, dispatch))
    return worst


def module_latency_s(assignments: Sequence[Assignment], dispatch: Dispatch) -> float:
    """Worst-case latency of the module: the maximum over all its machines (Theorem 1)."""
    return max((lat for _, lat in assignment_latencies_s(assignments, dispatch)), default=0.0)


def single_config_latency_s(config: Config, rate_rps: float, dispatch: Dispatch) -> float:
    """GetWCL(c) of Algorithm 2: the worst case of `config` when its group collects the whole
    module rate (`tc`: d + b / T; `rr` and `machine`: d + b / t, which is 2d at concurrency 1;
    `2d`: 2d). Partial machines are not considered here, as in the papers' examples."""
    return machine_latency_s(config, rate_rps, True, rate_rps, dispatch)

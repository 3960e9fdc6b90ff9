"""Latency splitting across an app's DAG by latency-cost efficiency (Harpagon §III-D, Alg. 2).

Each module M at rate T_M holds one configuration c (start: the one with the smallest estimated
worst case GetWCL, ties to the highest price, i.e. the least cost-efficient). Its estimated cost
is C_M(c) = p_c T_M / t_c. Repeatedly, over all modules and all their configurations c_new,

    LC = (C_M(c_prev) - C_M(c_new)) / (GetWCL(c_new) - GetWCL(c_prev))

(+inf when c_new is cheaper and no slower), switch the one maximal-LC candidate with a lower cost
whose DAG's longest path GetLat stays within the SLO L; stop when none is left. Each switch lowers
the estimated total cost, so it ends after at most sum_M |P_M| switches; each round costs
O(sum_M |P_M| + V + E). The budget of M is then GetWCL(M) x L / (longest path through M)
(Piccolo Alg. 2 line 19, with the path through M for DAGs), so every path's budgets sum to <= L.

Latency reassigner (§III-C): after the configuration sets are built, the unused latency on the
paths through a module (L - longest actual path through it) is offered to that module alone;
its set is rebuilt at wcl + slack and kept if cheaper; the largest saving is applied first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from scheduler.cloud.configs import ModulePlan
from scheduler.cloud.latency import REL_TOL, Dispatch, fits, single_config_latency_s
from scheduler.cloud.workload import App, Config, module_parents


class SloTooTight(Exception):
    """No split meets the app's SLO; `min_slo_s` is the smallest end-to-end estimate reachable."""

    def __init__(self, app: str, min_slo_s: float) -> None:
        super().__init__(f"{app}: smallest reachable end-to-end latency is {min_slo_s} s")
        self.app = app
        self.min_slo_s = min_slo_s


def path_latencies_s(app: App, latency_s: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """(longest source-to-sink path, longest path through each module) for per-module latencies."""
    parents = module_parents(app)
    children: dict[str, list[str]] = {m: [] for m in app.modules}
    for m, ps in parents.items():
        for p in ps:
            children[p].append(m)
    to: dict[str, float] = {}
    for m in app.modules:
        to[m] = latency_s[m] + max((to[p] for p in parents[m]), default=0.0)
    frm: dict[str, float] = {}
    for m in reversed(app.modules):
        frm[m] = latency_s[m] + max((frm[c] for c in children[m]), default=0.0)
    through = {m: to[m] + frm[m] - latency_s[m] for m in app.modules}
    return max(to.values()), through


def latency_cost_efficiency(
    prev: Config, new: Config, rate_rps: float, dispatch: Dispatch
) -> float:
    """LC of switching a module at `rate_rps` from `prev` to `new`: estimated cost saved per
    second of estimated worst case spent; +inf when `new` saves cost without adding latency,
    -inf when it saves nothing."""
    saving = prev.price * rate_rps / prev.throughput_rps - new.price * rate_rps / new.throughput_rps
    if saving <= 0:
        return -math.inf
    delta_s = single_config_latency_s(new, rate_rps, dispatch) - single_config_latency_s(
        prev, rate_rps, dispatch
    )
    return saving / delta_s if delta_s > 0 else math.inf


def split_latency(
    app: App, profiles: Mapping[str, Sequence[Config]], dispatch: Dispatch
) -> dict[str, float]:
    """Per-module latency budgets (seconds) for `app` by Algorithm 2.

    Raises `SloTooTight` when even the fastest configurations miss the SLO. Guaranteed: on every
    DAG path the budgets sum to at most slo_s (up to float rounding)."""
    _, est_s = lc_configs(app, profiles, dispatch)
    _, through = path_latencies_s(app, est_s)
    return {m: est_s[m] * app.slo_s / through[m] for m in app.modules}


def lc_configs(
    app: App, profiles: Mapping[str, Sequence[Config]], dispatch: Dispatch
) -> tuple[dict[str, Config], dict[str, float]]:
    """Algorithm 2's final configuration per module and its GetWCL estimate."""

    def wcl(m: str, c: Config) -> float:
        return single_config_latency_s(c, app.rate_rps[m], dispatch)

    def cost(m: str, c: Config) -> float:
        return c.price * app.rate_rps[m] / c.throughput_rps

    def default_key(m: str, c: Config) -> tuple[float, float, float]:
        return (wcl(m, c), -c.price, cost(m, c))

    chosen = {m: min(profiles[m], key=partial(default_key, m)) for m in app.modules}
    est = {m: wcl(m, c) for m, c in chosen.items()}
    e2e, through = path_latencies_s(app, est)
    if not fits(e2e, app.slo_s):
        raise SloTooTight(app.name, e2e)
    while True:
        best: tuple[float, float] | None = None
        pick: tuple[str, Config] | None = None
        for m in app.modules:
            prev = chosen[m]
            for c in profiles[m]:
                saving = cost(m, prev) - cost(m, c)
                if saving <= REL_TOL * max(cost(m, prev), 1.0):
                    continue
                delta = wcl(m, c) - est[m]
                if delta > 0 and not fits(through[m] + delta, app.slo_s):
                    continue
                lc = saving / delta if delta > 0 else math.inf
                if best is None or (lc, saving) > best:
                    best, pick = (lc, saving), (m, c)
        if pick is None:
            return chosen, est
        m, c = pick
        chosen[m] = c
        est[m] = wcl(m, c)
        _, through = path_latencies_s(app, est)


def reassign_slack(
    app: App,
    budgets_s: dict[str, float],
    plans: dict[str, ModulePlan],
    rebuild: Callable[[str, float], ModulePlan | None],
    max_rounds: int = 64,
) -> int:
    """Latency reassigner: offer each module the slack on its paths, apply the best saving.

    `rebuild(module, budget_s)` returns the module's set for that budget or None. `budgets_s`
    and `plans` are updated in place; returns how many reassignments were applied. Guaranteed:
    every path's worst case stays within slo_s and each reassignment lowers the total cost."""
    applied = 0
    for _ in range(max_rounds):
        _, through = path_latencies_s(app, {m: p.wcl_s for m, p in plans.items()})
        best: tuple[float, str, float, ModulePlan] | None = None
        for m in app.modules:
            slack_s = app.slo_s - through[m]
            budget = plans[m].wcl_s + slack_s
            if slack_s <= REL_TOL * app.slo_s or budget <= budgets_s[m] * (1 + REL_TOL):
                continue
            got = rebuild(m, budget)
            if got is None:
                continue
            saving = plans[m].cost - got.cost
            if saving > REL_TOL * max(plans[m].cost, 1.0) and (best is None or saving > best[0]):
                best = (saving, m, budget, got)
        if best is None:
            break
        _, m, budget, plan = best
        plans[m] = plan
        budgets_s[m] = budget
        applied += 1
    return applied

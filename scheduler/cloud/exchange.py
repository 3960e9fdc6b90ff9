"""Budget exchange: the exact split over each module's Algorithm 1 frontier (layerbatch's own
step after Harpagon §III-C/D; switchable, `exchange=False` is the paper's Harpagon).

Algorithm 2 and the latency reassigner move latency one way: to a module that saves with it. They
never take latency from a module whose set would cost a little more when faster to give it to one
that saves more with it (e.g. a tracker from 83 to 28 ms for +0.02 so that the activity model
runs at 131 instead of 49 ms for -0.47). The exchange searches those trades exactly:

    cap_m  = L - (longest path through m with every module on its fastest set - fastest_m)
    F_m    = S_0 = A1(cap_m), S_{j+1} = A1(wcl(S_j) (1 - 1e-7)), until A1 finds no set or
             MAX_STEPS sets: the sets Algorithm 1 (with Theorem 2's dummy variants, `build`)
             makes as the module's budget shrinks; plus the module's set in the plan given and
             the Pareto frontier of its one-configuration sets within cap_m (`one_config`)
    choose one set per module from the Pareto frontier of F_m minimising sum_m cost
             subject to sum_{m in P} wcl <= L on every DAG path P   (`search.cheapest_combination`)

Guaranteed: the result is never costlier than the plan it starts from (its sets are candidates)
nor than any plan of one configuration per module that fits L under the same dispatch (Clipper's
and InferLine's kind), and every path of it fits L. Cost: at most MAX_STEPS builds per module
(median 7 on the generator's workloads), one pass over its configurations, and the
branch-and-bound search; on those workloads it lifts harpagon from 91.4% to 97.0% equal to the
optimum for about 3.5x the planning time (bench/cost_planner.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from scheduler.cloud.configs import ModulePlan
from scheduler.cloud.search import cheapest_combination, pareto
from scheduler.cloud.split import path_latencies_s
from scheduler.cloud.workload import App

MAX_STEPS = 16
SHRINK = 1e-7  # relative step below a set's worst case: well above `latency.fits`' tolerance


def algorithm1_frontier(
    build: Callable[[float], ModulePlan | None], cap_s: float, max_steps: int = MAX_STEPS
) -> list[ModulePlan]:
    """The sets `build(budget_s)` returns from `cap_s` down, each budget just under the worst
    case of the set before (so every set is strictly faster than the one before)."""
    out: list[ModulePlan] = []
    budget_s = cap_s
    while len(out) < max_steps:
        got = build(budget_s)
        if got is None:
            break
        out.append(got)
        budget_s = got.wcl_s * (1 - SHRINK)
    return out


def exchange(
    app: App,
    plans: Mapping[str, ModulePlan],
    fastest: Mapping[str, ModulePlan],
    build: Callable[[str, float], ModulePlan | None],
    one_config: Callable[[str, float], list[ModulePlan]],
) -> dict[str, ModulePlan]:
    """The cheapest choice over the modules' Algorithm 1 frontiers, their one-configuration
    sets and `plans` (module docstring); `fastest[m]` is m's fastest set, used for the caps."""
    _, through = path_latencies_s(app, {m: p.wcl_s for m, p in fastest.items()})
    options: dict[str, list[ModulePlan]] = {}
    for m in app.modules:
        cap_s = app.slo_s - (through[m] - fastest[m].wcl_s)
        sets = [
            plans[m],
            *algorithm1_frontier(functools.partial(build, m), cap_s),
            *one_config(m, cap_s),
        ]
        options[m] = [sets[i] for i in pareto([(p.wcl_s, p.cost) for p in sets])]
    found = cheapest_combination(
        app, {m: [(p.wcl_s, p.cost) for p in sets] for m, sets in options.items()}
    )
    assert found is not None, "the plan given fits the SLO, so some combination does"
    return {m: options[m][k] for m, k in found[1].items()}

"""Latency splitting across an app's DAG (Harpagon §III-D, Alg. 2; Piccolo §III-D) and the
alternatives the papers compare with (Harpagon §IV, Table III; Piccolo §IV, Table III).

Algorithm 2. Each module M at rate T_M holds one configuration c (start: the one with the smallest
estimated worst case GetWCL, ties to the highest price, i.e. the least cost-efficient). Its
estimated cost is C_M(c) = p_c T_M / t_c. Repeatedly, over all modules and all their
configurations c_new with C_M(c_new) < C_M(c_prev),

    LC = (C_M(c_prev) - C_M(c_new)) / (GetWCL(c_new) - GetWCL(c_prev))

(+inf when c_new is no slower), switch the one candidate with the largest key whose DAG's longest
path GetLat stays within the SLO L; stop when none is left. The key (`Select`) is
  lc          LC, then the saving (Algorithm 2 itself);
  throughput  the new configuration's machine throughput t_new, then the saving: the
              throughput-based split of Scrooge and InferLine as Harpagon §II/§IV describe it
              ("prefers modules with larger throughput", Harp-tb);
  cost        the saving C_M(c_prev) - C_M(c_new): cost-direct (below), and InferLine's greedy
              planner (every step takes the action that lowers the cost most).
Each switch lowers the estimated total cost, so a run ends after at most sum_M |P_M| switches,
each round O(sum_M |P_M| (V + E)). The budget of M is then GetWCL(M) x L / (longest path
through M) (Piccolo Alg. 2 line 19, with the path through M for DAGs), so every path's budgets
sum to <= L.

Node merger (§III-D): modules with the same parents and the same children (two or more) form a
super-module. Besides every single switch, a round then also offers, for each super-module and
each latency level l it can reach (one of its members' GetWCL values at or above the group's
current maximum), the joint switch where every member takes its cheapest configuration with
GetWCL <= l (or keeps its own when that is cheaper); its LC is the members' total saving over the
rise of the group's maximum (they run side by side, so a path crosses one of them).
Cost-direct (§III-D): undo the last r switches of the run (r = 1..COST_DIRECT_ROUNDS) and finish
greedily by the largest saving. Both only add candidate splits: `candidate_splits` returns them
all and the planner keeps the cheapest plan.

Even split (Clipper, Harpagon §IV-A): every module of a path gets L / (number of modules on the
longest path through it, counted in modules). Quantized split (Nexus, Harp-q): budgets are
multiples of a step q; each module's set is built at every multiple up to L, and the cheapest
choice whose budgets sum to at most L on every path is found exactly (`search`), O(V L / q)
builds plus the search.

Latency reassigner (§III-C): after the configuration sets are built, the unused latency on the
paths through a module (L - longest actual path through it) is offered to that module alone;
its set is rebuilt at wcl + slack and kept if cheaper; the largest saving is applied first.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from scheduler.cloud.configs import ModulePlan
from scheduler.cloud.latency import REL_TOL, Dispatch, fits, single_config_latency_s
from scheduler.cloud.search import cheapest_combination, pareto
from scheduler.cloud.workload import App, Config, module_parents

Select = Literal["lc", "throughput", "cost"]
COST_DIRECT_ROUNDS = 3


class SloTooTight(Exception):
    """No split meets the app's SLO; `min_slo_s` is the smallest end-to-end estimate reachable."""

    def __init__(self, app: str, min_slo_s: float) -> None:
        super().__init__(f"{app}: smallest reachable end-to-end latency is {min_slo_s} s")
        self.app = app
        self.min_slo_s = min_slo_s


def path_latencies_s(app: App, latency_s: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """(longest source-to-sink path, longest path through each module) for per-module latencies."""
    parents = module_parents(app)
    children = _children(app, parents)
    to: dict[str, float] = {}
    for m in app.modules:
        to[m] = latency_s[m] + max((to[p] for p in parents[m]), default=0.0)
    frm: dict[str, float] = {}
    for m in reversed(app.modules):
        frm[m] = latency_s[m] + max((frm[c] for c in children[m]), default=0.0)
    through = {m: to[m] + frm[m] - latency_s[m] for m in app.modules}
    return max(to.values()), through


def scaled_budgets_s(app: App, latency_s: Mapping[str, float]) -> dict[str, float]:
    """latency_s[m] x slo_s / (longest path through m): the split Algorithm 2 line 19 makes.

    Guaranteed: on every path the budgets sum to at most slo_s (each term is scaled by at most
    slo_s over that path's own length), and budget >= latency when every path fits slo_s."""
    _, through = path_latencies_s(app, latency_s)
    return {m: latency_s[m] * app.slo_s / through[m] for m in app.modules}


def even_budgets_s(app: App) -> dict[str, float]:
    """Clipper's even split: slo_s / (modules on the longest path through m, in modules)."""
    _, through = path_latencies_s(app, dict.fromkeys(app.modules, 1.0))
    return {m: app.slo_s / through[m] for m in app.modules}


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
    """Per-module latency budgets (seconds) for `app` by Algorithm 2 (no merger, no cost-direct).

    Raises `SloTooTight` when even the fastest configurations miss the SLO. Guaranteed: on every
    DAG path the budgets sum to at most slo_s (up to float rounding)."""
    _, est_s = lc_configs(app, profiles, dispatch)
    return scaled_budgets_s(app, est_s)


def lc_configs(
    app: App, profiles: Mapping[str, Sequence[Config]], dispatch: Dispatch
) -> tuple[dict[str, Config], dict[str, float]]:
    """Algorithm 2's final configuration per module and its GetWCL estimate."""
    sp = _Splitter(app, profiles, dispatch)
    final = sp.run(None, "lc", merge=False)[-1]
    return final, sp.estimates(final)


def candidate_splits(
    app: App,
    profiles: Mapping[str, Sequence[Config]],
    dispatch: Dispatch,
    select: Select = "lc",
    *,
    merge: bool = False,
    cost_direct: bool = False,
) -> list[dict[str, float]]:
    """The per-module budgets of every split the switches ask for, distinct, the plain run first:
    the run keyed by `select`; with `merge`, also the run with node merger; with `cost_direct`,
    also each run with its last r = 1..COST_DIRECT_ROUNDS switches finished by saving instead.

    Raises `SloTooTight` when even the fastest configurations miss the SLO. Guaranteed: every
    returned split sums to at most slo_s on every path."""
    sp = _Splitter(app, profiles, dispatch)
    finals: list[dict[str, Config]] = []
    for merged in (False, True) if merge else (False,):
        history = sp.run(None, select, merge=merged)
        finals.append(history[-1])
        if cost_direct:
            for r in range(1, min(COST_DIRECT_ROUNDS, len(history) - 1) + 1):
                finals.append(sp.run(history[-1 - r], "cost", merge=merged)[-1])
    out: list[dict[str, float]] = []
    seen: list[dict[str, Config]] = []
    for final in finals:
        if final not in seen:
            seen.append(final)
            out.append(scaled_budgets_s(app, sp.estimates(final)))
    return out


class _Splitter:
    """Algorithm 2's state for one app: GetWCL and cost tables, the candidate switches."""

    def __init__(
        self, app: App, profiles: Mapping[str, Sequence[Config]], dispatch: Dispatch
    ) -> None:
        self.app = app
        self.configs = {m: list(profiles[m]) for m in app.modules}
        self.wcl = {
            m: [single_config_latency_s(c, app.rate_rps[m], dispatch) for c in cs]
            for m, cs in self.configs.items()
        }
        self.cost = {
            m: [c.price * app.rate_rps[m] / c.throughput_rps for c in cs]
            for m, cs in self.configs.items()
        }
        self.tput = {m: [c.throughput_rps for c in cs] for m, cs in self.configs.items()}
        # For the node merger: per module, configurations by GetWCL and the cheapest so far.
        self.by_wcl: dict[str, list[float]] = {}
        self.cheapest_upto: dict[str, list[int]] = {}
        for m in app.modules:
            wcls = self.wcl[m]
            order = sorted(range(len(wcls)), key=wcls.__getitem__)
            self.by_wcl[m] = [self.wcl[m][i] for i in order]
            best: list[int] = []
            for i in order:
                if not best or self.cost[m][i] < self.cost[m][best[-1]]:
                    best.append(i)
                else:
                    best.append(best[-1])
            self.cheapest_upto[m] = best
        parents = module_parents(app)
        children = _children(app, parents)
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
        for m in app.modules:
            key = (tuple(sorted(parents[m])), tuple(sorted(children[m])))
            groups.setdefault(key, []).append(m)
        self.groups = [g for g in groups.values() if len(g) >= 2]

    def estimates(self, chosen: Mapping[str, Config]) -> dict[str, float]:
        """GetWCL of each module's configuration in `chosen`."""
        return {m: self.wcl[m][self.configs[m].index(c)] for m, c in chosen.items()}

    def start(self) -> dict[str, int]:
        """The default DAG: each module's smallest GetWCL, ties to the highest price."""
        app = self.app
        state: dict[str, int] = {}
        for m in app.modules:
            wcl, cs, cost = self.wcl[m], self.configs[m], self.cost[m]
            state[m] = min(range(len(cs)), key=lambda i: (wcl[i], -cs[i].price, cost[i]))
        e2e, _ = path_latencies_s(app, {m: self.wcl[m][i] for m, i in state.items()})
        if not fits(e2e, app.slo_s):
            raise SloTooTight(app.name, e2e)
        return state

    def run(
        self, chosen: Mapping[str, Config] | None, select: Select, *, merge: bool
    ) -> list[dict[str, Config]]:
        """The states of one run from `chosen` (default: the start), the start included."""
        if chosen is None:
            state = self.start()
        else:
            state = {m: self.configs[m].index(c) for m, c in chosen.items()}
        history = [self._configs_of(state)]
        while True:
            move = self._best_move(state, select, merge)
            if move is None:
                return history
            state.update(move)
            history.append(self._configs_of(state))

    def _configs_of(self, state: Mapping[str, int]) -> dict[str, Config]:
        return {m: self.configs[m][i] for m, i in state.items()}

    def _best_move(
        self, state: dict[str, int], select: Select, merge: bool
    ) -> dict[str, int] | None:
        app = self.app
        est = {m: self.wcl[m][i] for m, i in state.items()}
        _, through = path_latencies_s(app, est)
        best_key: tuple[float, float] | None = None
        best: dict[str, int] | None = None
        for m in app.modules:
            now_cost = self.cost[m][state[m]]
            tol = REL_TOL * max(now_cost, 1.0)
            for i, c_cost in enumerate(self.cost[m]):
                saving = now_cost - c_cost
                if saving <= tol:
                    continue
                delta = self.wcl[m][i] - est[m]
                if delta > 0 and not fits(through[m] + delta, app.slo_s):
                    continue
                key = self._key(select, saving, delta, self.tput[m][i])
                if best_key is None or key > best_key:
                    best_key, best = key, {m: i}
        if merge:
            for group in self.groups:
                for key, move in self._group_moves(group, state, est, select):
                    if best_key is None or key > best_key:
                        best_key, best = key, move
        return best

    def _group_moves(
        self, group: list[str], state: dict[str, int], est: dict[str, float], select: Select
    ) -> list[tuple[tuple[float, float], dict[str, int]]]:
        """Joint switches of a super-module (see the module docstring), with their keys."""
        top = max(est[m] for m in group)
        levels = sorted({w for m in group for w in self.wcl[m] if w >= top})
        out: list[tuple[tuple[float, float], dict[str, int]]] = []
        for level in levels:
            move: dict[str, int] = {}
            saving = 0.0
            for m in group:
                k = bisect.bisect_right(self.by_wcl[m], level) - 1
                pick = self.cheapest_upto[m][k]
                now_cost = self.cost[m][state[m]]
                gain = now_cost - self.cost[m][pick]
                if gain > REL_TOL * max(now_cost, 1.0):
                    move[m] = pick
                    saving += gain
            if len(move) < 2:
                continue  # one member alone is a single switch, offered already
            new_est = {**est, **{m: self.wcl[m][i] for m, i in move.items()}}
            e2e, _ = path_latencies_s(self.app, new_est)
            if not fits(e2e, self.app.slo_s):
                continue
            delta = max(new_est[m] for m in group) - top
            out.append((self._key(select, saving, delta, -math.inf), move))
        return out

    @staticmethod
    def _key(select: Select, saving: float, delta_s: float, tput_rps: float) -> tuple[float, float]:
        if select == "cost":
            return (saving, 0.0)
        if select == "throughput":
            return (tput_rps, saving)
        return (saving / delta_s if delta_s > 0 else math.inf, saving)


def quantized_split(
    app: App,
    step_s: float,
    build: Callable[[str, float], ModulePlan | None],
) -> tuple[dict[str, float], dict[str, ModulePlan]] | None:
    """Nexus' quantized split: budgets k x step_s (k >= 1, at most slo_s), the cheapest choice
    of one budget per module whose budgets sum to at most slo_s on every path, each module
    built by `build(module, budget_s)`. Returns (budgets, plans), or None when no multiple of
    step_s leaves every module a set. Exact over the multiples (`search.cheapest_combination`)."""
    steps = math.floor(app.slo_s / step_s * (1 + REL_TOL))
    options: dict[str, list[tuple[float, float]]] = {}
    built: dict[str, list[tuple[float, ModulePlan]]] = {}
    for m in app.modules:
        pts: list[tuple[float, ModulePlan]] = []
        for k in range(1, steps + 1):
            got = build(m, k * step_s)
            if got is not None:
                pts.append((k * step_s, got))
        keep = pareto([(b, p.cost) for b, p in pts])
        built[m] = [pts[i] for i in keep]
        options[m] = [(b, p.cost) for b, p in built[m]]
    found = cheapest_combination(app, options)
    if found is None:
        return None
    _, pick = found
    return (
        {m: built[m][k][0] for m, k in pick.items()},
        {m: built[m][k][1] for m, k in pick.items()},
    )


def reassign_slack(
    app: App,
    budgets_s: dict[str, float],
    plans: dict[str, ModulePlan],
    rebuild: Callable[[str, float], ModulePlan | None],
    max_rounds: int = 64,
) -> int:
    """Latency reassigner: offer each module the slack on its paths, apply the best saving.

    `rebuild(module, budget_s)` returns the module's set for that budget or None. `budgets_s`
    and `plans` are updated in place (a module's budget becomes the one its new set was built
    for: its worst case plus the slack of its paths, so after reassignment the budgets of one
    path may overlap; `scaled_budgets_s` turns the final worst cases back into a split);
    returns how many reassignments were applied. Guaranteed: every path's worst case stays
    within slo_s and each reassignment lowers the total cost."""
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


def _children(app: App, parents: Mapping[str, list[str]]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {m: [] for m in app.modules}
    for m, ps in parents.items():
        for p in ps:
            children[p].append(m)
    return children

"""The cloud cost planner: a workload in, the plan document of issue 7 out.

For each app independently (Harpagon §III, Piccolo §III), a heuristic system
  1. splits the SLO into per-module budgets (`split`: latency-cost efficiency with node merger and
     cost-direct, throughput-based, InferLine's greedy, even, or quantized);
  2. builds each module's configuration set within its budget with Algorithm 1 and, if the system
     has them, dummy requests (`configs.schedule_module`, Theorem 2);
  3. hands unused path latency to modules (`split.reassign_slack`), if the system has it;
and keeps the cheapest plan over the splits it tried;
  4. with the budget exchange (`exchange`, harpagon only): the cheapest choice over every
     module's Algorithm 1 frontier and that plan, exactly (it trades latency between modules).
Fallback: when no split leaves every module a set (Algorithm 2's estimates are optimistic about
partially loaded machines, an even split can starve a module), every module takes its fastest
set (`optimal.fastest_set`) and step 3 runs from there, so a system plans at every SLO at or
above the smallest one it reports. `optimal` instead searches every set of
`optimal.module_frontier` per module, exactly
(`search.cheapest_combination`). Total cost is the sum over modules of price x rate / throughput.

Systems (Harpagon Table III, Piccolo Table III; `SYSTEMS`):

    system     worst case        tuples  dummy     reassign  split                    hw   conc
    harpagon   d + b/w (tc)      any     t - u     yes       LC + merger + cost-direct any  any
                                                             + exchange (layerbatch's)
    piccolo    d + b/w (tc)      any     b/(L-d)-u yes       LC                       any  any
    nexus      2d                2       no        no        quantized, 0.01 s steps  one  1
    scrooge    d + b/t (machine) 2       no        no        throughput-based         any  any
    inferline  2d                1       no        no        greedy (largest saving)  any  1
    clipper    2d                1       no        no        even                     one  1
    optimal    d + b/w (tc)      <= 3    filled    -         exact search             any  any

"one" hardware: the app is planned on each single hardware type that profiles all its modules and
the cheapest plan is kept (a homogeneous cluster of the best type); concurrency 1: only profile
rows with concurrency 1 are used (no spatial multiplexing). Every switch of `plan` overrides the
system's own setting, so e.g. `plan(w, "harpagon", split="throughput")` is Harp-tb.

`optimal` is exact over a bounded space: per module, the sets of `optimal.module_frontier`
(at most `max_configs` tuples, default 3; each tuple but the last on one of its 3 largest whole
machine counts; the last tuple's partial machine as it is or, with dummy requests, filled to a
whole one) together with the sets `harpagon` and `piccolo` build for that module on the same
workload under the same switches, and the sets every baseline builds (as it plans, with its own
latency model) re-timed under optimal's dispatch; among all choices of one such set per module
it returns the cheapest whose every DAG path fits the SLO. The other systems' sets are in the
space so that it is a lower bound by construction (Piccolo's dummy rule pads partial machines to
rates in between, which the enumeration does not hold) for every plan that meets the SLO under
optimal's dispatch: a baseline's plan that misses it there, by its optimistic model, may cost
less.

The planner reads no clock: `runtime_ms` is left for the caller to fill in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from scheduler.cloud.configs import (
    DummyRule,
    ModulePlan,
    by_throughput_per_price,
    schedule_module,
)
from scheduler.cloud.exchange import exchange as exchange_budgets
from scheduler.cloud.latency import (
    DISPATCHES,
    Assignment,
    Dispatch,
    assignment_latencies_s,
    fits,
    module_latency_s,
)
from scheduler.cloud.optimal import MAX_TUPLES, fastest_set, module_frontier
from scheduler.cloud.search import cheapest_combination, pareto
from scheduler.cloud.split import (
    Select,
    SloTooTight,
    candidate_splits,
    even_budgets_s,
    path_latencies_s,
    quantized_split,
    reassign_slack,
    scaled_budgets_s,
)
from scheduler.cloud.workload import App, Config, Workload
from scheduler.errors import InputError
from scheduler.validate import MAX_LATENCY_MS

SplitKind = Literal["lc", "throughput", "greedy", "even", "quantized", "exact"]


@dataclass(frozen=True)
class System:
    """One planner's features (Harpagon Table III, Piccolo Table III).

    `split` is "lc", "throughput", "greedy", "even", "quantized:STEP" (STEP in seconds) or
    "exact" (the optimum); `merge` and `cost_direct` apply to the "lc" split only; `hetero`
    False plans each app on one hardware type; `spatial` False uses concurrency-1 rows only."""

    dispatch: Dispatch
    max_tuples: int | None
    dummy: DummyRule
    reassign: bool
    split: str
    merge: bool = False
    cost_direct: bool = False
    hetero: bool = True
    spatial: bool = True
    exchange: bool = False


SYSTEMS: dict[str, System] = {
    "harpagon": System(
        "tc", None, "harpagon", True, "lc", merge=True, cost_direct=True, exchange=True
    ),
    "piccolo": System("tc", None, "piccolo", True, "lc"),
    "nexus": System("2d", 2, "none", False, "quantized:0.01", hetero=False, spatial=False),
    "scrooge": System("machine", 2, "none", False, "throughput"),
    "inferline": System("2d", 1, "none", False, "greedy", spatial=False),
    "clipper": System("2d", 1, "none", False, "even", hetero=False, spatial=False),
    "optimal": System("tc", None, "harpagon", False, "exact"),
}

_SELECT: dict[str, Select] = {"lc": "lc", "throughput": "throughput", "greedy": "cost"}


def switches_used(system: str, split: str | None = None) -> frozenset[str]:
    """The switches of `plan` that can change a plan of `system` (with `split` in place of its
    own, if given): "split" if the system has a split to replace (all but `optimal`, which
    searches), and each feature the system has and runs, which the switch turns off: "dummy"
    (dummy requests, also in `optimal`'s search), "reassign" and "exchange" (after a heuristic
    split, not a search), "merge" and "cost_direct" (steps of the "lc" split). Turning off a
    feature not listed changes nothing: e.g. `optimal` seeds its search with harpagon's and
    piccolo's own features, whatever the switches say.

    Raises `InputError` for an unknown system or split."""
    if system not in SYSTEMS:
        raise InputError("--system", "", f"one of {', '.join(SYSTEMS)}", system)
    spec = SYSTEMS[system]
    searches = spec.split == "exact"
    kind, _ = _parse_split(spec.split if split is None or searches else split)
    used = set() if searches else {"split"}
    if spec.dummy != "none":
        used.add("dummy")
    if kind != "exact":
        used.update(name for name in ("reassign", "exchange") if getattr(spec, name))
    if kind == "lc":
        used.update(name for name in ("merge", "cost_direct") if getattr(spec, name))
    return frozenset(used)


def plan(
    workload: Workload,
    system: str = "harpagon",
    *,
    dispatch: Dispatch | None = None,
    max_configs: int | None = None,
    dummy: bool = True,
    reassign: bool = True,
    split: str | None = None,
    merge: bool | None = None,
    cost_direct: bool | None = None,
    exchange: bool = True,
) -> dict[str, Any]:
    """Plan `workload` as `system` would; the keyword switches override the system's features
    (`dummy=False`, `reassign=False`, `exchange=False` turn a feature off; `split`, `merge`,
    `cost_direct` set it).

    Returns {"cost", "e2e_latency_s": {app: s}, "modules": {m: {"budget_s", "wcl_s",
    "dummy_rps", "configs": [{"hardware", "batch", "concurrency", "machines", "rate_rps",
    "wcl_s"}]}}}. A module's `budget_s` is its share of the SLO in the final plan: its worst case
    scaled by slo_s / (the longest path of worst cases through it), so wcl_s <= budget_s and the
    budgets along every path sum to at most slo_s. (The budgets sets were built for overlap
    after the latency reassigner, which gives each module the slack of its paths in turn.)

    Raises `InputError` for an unknown system, dispatch or split, and for an SLO no plan of this
    system meets, naming the smallest SLO it meets (rounded up): the longest path of every
    module's fastest set, at which the system returns a plan (see "fallback" above). With dummy
    requests that is the fastest set of any size holding at most one machine of them, and no
    split of the system reaches below it (a module's first tuple collects at most its rate);
    without them, the fastest set of at most three tuples (`optimal.fastest_set`).
    Guaranteed: every app's e2e_latency_s (its longest DAG path of module worst cases) fits its
    slo_s."""
    spec = _resolve(
        system, dispatch, max_configs, dummy, reassign, split, merge, cost_direct, exchange
    )
    total = 0.0
    e2e: dict[str, float] = {}
    modules: dict[str, Any] = {}
    for app in workload.apps:
        plans = _plan_app_any_hardware(workload, app, system, spec)
        wcl = {m: p.wcl_s for m, p in plans.items()}
        e2e[app.name], _ = path_latencies_s(app, wcl)
        budgets = scaled_budgets_s(app, wcl)
        for m in app.modules:
            total += plans[m].cost
            modules[m] = _module_doc(budgets[m], plans[m], spec.dispatch)
    return {"cost": total, "e2e_latency_s": e2e, "modules": modules}


def _resolve(
    system: str,
    dispatch: Dispatch | None,
    max_configs: int | None,
    dummy: bool,
    reassign: bool,
    split: str | None,
    merge: bool | None,
    cost_direct: bool | None,
    exchange: bool,
) -> System:
    if system not in SYSTEMS:
        raise InputError("--system", "", f"one of {', '.join(SYSTEMS)}", system)
    spec = SYSTEMS[system]
    if dispatch is not None and dispatch not in DISPATCHES:
        raise InputError("--dispatch", "", f"one of {', '.join(DISPATCHES)}", dispatch)
    if max_configs is not None and max_configs < 1:
        raise InputError("--configs", "", "a positive number of configurations", max_configs)
    if split is not None:
        if spec.split == "exact":
            raise InputError("--split", "", f"no split for system {system} (it searches)", split)
        _parse_split(split)
    return replace(
        spec,
        dispatch=dispatch or spec.dispatch,
        max_tuples=max_configs if max_configs is not None else spec.max_tuples,
        dummy=spec.dummy if dummy else "none",
        reassign=spec.reassign and reassign,
        split=split if split is not None else spec.split,
        merge=spec.merge if merge is None else merge,
        cost_direct=spec.cost_direct if cost_direct is None else cost_direct,
        exchange=spec.exchange and exchange,
    )


def _parse_split(split: str) -> tuple[SplitKind, float]:
    """("quantized", step_s) for "quantized:STEP", else (kind, 0.0); InputError otherwise."""
    if split in ("lc", "throughput", "greedy", "even", "exact"):
        return split, 0.0  # type: ignore[return-value]
    head, _, tail = split.partition(":")
    if head == "quantized":
        try:
            step_s = float(tail)
        except ValueError:
            step_s = math.nan
        if step_s >= MIN_QUANTUM_S and math.isfinite(step_s):
            return "quantized", step_s
    raise InputError(
        "--split",
        "",
        f"lc, throughput, greedy, even or quantized:STEP (STEP >= {MIN_QUANTUM_S:g} seconds)",
        split,
    )


MIN_QUANTUM_S = 0.001  # quantized splits search SLO / STEP steps per module: nexus's is 0.01


class _Infeasible(Exception):
    """No plan fits the SLO; `min_slo_s` is the smallest SLO this system meets."""

    def __init__(self, min_slo_s: float) -> None:
        super().__init__(f"smallest feasible SLO {min_slo_s} s")
        self.min_slo_s = min_slo_s


def _plan_app_any_hardware(
    workload: Workload, app: App, system: str, spec: System
) -> dict[str, ModulePlan]:
    """The app's plan under `spec`, over one hardware type at a time if it is not `hetero`."""
    profiles: dict[str, tuple[Config, ...]] = {}
    for m in app.modules:
        rows = workload.profiles[m]
        if not spec.spatial:
            rows = tuple(c for c in rows if c.concurrency == 1)
            if not rows:
                raise InputError(
                    workload.source,
                    f"modules.{m}.profile",
                    f"a row with concurrency 1 (system {system} has no spatial multiplexing)",
                )
        profiles[m] = rows
    if spec.hetero:
        variants = [profiles]
    else:
        common = set.intersection(*({c.hardware for c in profiles[m]} for m in app.modules))
        if not common:
            raise InputError(
                workload.source,
                f"apps.{app.name}",
                f"one hardware type that profiles every module (system {system} runs an app "
                "on one type)",
            )
        variants = [
            {m: tuple(c for c in rows if c.hardware == hw) for m, rows in profiles.items()}
            for hw in sorted(common)
        ]
    best: dict[str, ModulePlan] | None = None
    min_slo_s = math.inf
    for variant in variants:
        try:
            got = _plan_app(workload, app, variant, spec)
        except _Infeasible as exc:
            min_slo_s = min(min_slo_s, exc.min_slo_s)
            continue
        if best is None or _cost(got) < _cost(best):
            best = got
    if best is None:
        smallest = f"{_round_up(min_slo_s)} s, the smallest end-to-end worst case a {system} plan"
        expected = (
            f"at least {smallest} reaches"
            if min_slo_s <= MAX_LATENCY_MS / 1000.0  # else no SLO a workload may name is enough
            else f"modules some {system} plan serves within an hour (the largest SLO a workload "
            f"names); {smallest} reaches"
        )
        raise InputError(workload.source, f"apps.{app.name}.slo_s", expected, app.slo_s)
    return best


def _plan_app(
    workload: Workload, app: App, profiles: Mapping[str, Sequence[Config]], spec: System
) -> dict[str, ModulePlan]:
    """One app on the given profile rows; raises `_Infeasible` when no plan fits its SLO."""
    kind, step_s = _parse_split(spec.split)
    if kind == "exact":
        return _optimal_app(workload, app, profiles, spec)

    ordered = {m: by_throughput_per_price(profiles[m]) for m in app.modules}

    def build(m: str, budget_s: float) -> ModulePlan | None:
        return schedule_module(
            ordered[m],
            app.rate_rps[m],
            budget_s,
            spec.dispatch,
            spec.max_tuples,
            spec.dummy,
            presorted=True,
        )

    starts: list[tuple[dict[str, float], dict[str, ModulePlan]]] = []
    if kind == "quantized":
        found = quantized_split(app, step_s, build)
        if found is not None:
            starts.append(found)
    else:
        if kind == "even":
            splits = [even_budgets_s(app)]
        else:
            try:
                splits = candidate_splits(
                    app,
                    profiles,
                    spec.dispatch,
                    _SELECT[kind],
                    merge=spec.merge and kind == "lc",
                    cost_direct=spec.cost_direct and kind == "lc",
                )
            except SloTooTight:
                splits = []
        for budgets in splits:
            plans = _build_all(app, budgets, build)
            if plans is not None:
                starts.append((budgets, plans))
    limit = min(spec.max_tuples or MAX_TUPLES, MAX_TUPLES)
    if not starts:
        starts.append(_fastest_start(app, profiles, spec, limit))
    best: dict[str, ModulePlan] | None = None
    for budgets, plans in starts:
        if spec.reassign:
            reassign_slack(app, budgets, plans, build)
        if best is None or _cost(plans) < _cost(best):
            best = plans
    assert best is not None
    if spec.exchange:
        fastest = _fastest_sets(app, profiles, spec, limit)

        def one_config(m: str, cap_s: float) -> list[ModulePlan]:
            return module_frontier(
                profiles[m],
                app.rate_rps[m],
                spec.dispatch,
                max_tuples=1,
                dummy=spec.dummy != "none",
                cap_s=cap_s,
            )

        best = exchange_budgets(app, best, fastest, build, one_config)
    return best


def _build_all(
    app: App, budgets: Mapping[str, float], build: Callable[[str, float], ModulePlan | None]
) -> dict[str, ModulePlan] | None:
    plans: dict[str, ModulePlan] = {}
    for m in app.modules:
        got = build(m, budgets[m])
        if got is None:
            return None
        plans[m] = got
    return plans


def _fastest_sets(
    app: App, profiles: Mapping[str, Sequence[Config]], spec: System, limit: int
) -> dict[str, ModulePlan]:
    """Every module's fastest set (`optimal.fastest_set`, at most `limit` tuples without
    dummy requests)."""
    dummy = spec.dummy != "none"
    return {
        m: fastest_set(profiles[m], app.rate_rps[m], spec.dispatch, max_tuples=limit, dummy=dummy)
        for m in app.modules
    }


def _fastest_start(
    app: App, profiles: Mapping[str, Sequence[Config]], spec: System, limit: int
) -> tuple[dict[str, float], dict[str, ModulePlan]]:
    """Every module on its fastest set, if that fits the SLO; else `_Infeasible` with the
    longest path of them."""
    plans = _fastest_sets(app, profiles, spec, limit)
    e2e, _ = path_latencies_s(app, {m: p.wcl_s for m, p in plans.items()})
    if not fits(e2e, app.slo_s):
        raise _Infeasible(e2e)
    return {m: p.wcl_s for m, p in plans.items()}, plans


def _optimal_app(
    workload: Workload, app: App, profiles: Mapping[str, Sequence[Config]], spec: System
) -> dict[str, ModulePlan]:
    """The exact optimum over the space the module docstring names."""
    tuples = spec.max_tuples or MAX_TUPLES
    dummy = spec.dummy != "none"
    _, fastest = _fastest_start(app, profiles, spec, tuples)
    _, through = path_latencies_s(app, {m: p.wcl_s for m, p in fastest.items()})
    pool: dict[str, list[ModulePlan]] = {}
    for m in app.modules:
        cap_s = app.slo_s - (through[m] - fastest[m].wcl_s)
        pool[m] = module_frontier(
            profiles[m],
            app.rate_rps[m],
            spec.dispatch,
            max_tuples=tuples,
            dummy=dummy,
            cap_s=cap_s,
        )
    for name in ("harpagon", "piccolo"):
        seed = replace(
            SYSTEMS[name],
            dispatch=spec.dispatch,
            max_tuples=spec.max_tuples,
            dummy=SYSTEMS[name].dummy if dummy else "none",
        )
        try:
            plans = _plan_app(workload, app, profiles, seed)
        except _Infeasible:
            continue
        for m, p in plans.items():
            pool[m].append(p)
    for name, other in SYSTEMS.items():  # the baselines, each as it plans, re-timed here
        if name in ("harpagon", "piccolo", "optimal"):
            continue
        try:
            plans = _plan_app_any_hardware(workload, app, name, other)
        except InputError:
            continue
        for m, p in plans.items():
            if spec.max_tuples is None or len(p.assignments) <= spec.max_tuples:
                pool[m].append(_retimed(p, spec.dispatch))
    options: dict[str, list[ModulePlan]] = {}
    for m, sets in pool.items():
        options[m] = [sets[i] for i in pareto([(p.wcl_s, p.cost) for p in sets])]
    found = cheapest_combination(
        app, {m: [(p.wcl_s, p.cost) for p in sets] for m, sets in options.items()}
    )
    assert found is not None, "the fastest sets fit the SLO, so some combination does"
    return {m: options[m][k] for m, k in found[1].items()}


def retimed_e2e_s(
    workload: Workload, doc: Mapping[str, Any], dispatch: Dispatch
) -> dict[str, float]:
    """Each app's end-to-end worst case of the plan document `doc` (from `plan`, any system)
    re-timed under `dispatch`: the same machines and rates, whatever model planned them."""
    out: dict[str, float] = {}
    for app in workload.apps:
        lat: dict[str, float] = {}
        for m in app.modules:
            by_key = {(c.hardware, c.batch, c.concurrency): c for c in workload.profiles[m]}
            sets = [
                Assignment(by_key[(c["hardware"], c["batch"], c["concurrency"])], c["rate_rps"])
                for c in doc["modules"][m]["configs"]
                if c["rate_rps"] > 0
            ]
            lat[m] = module_latency_s(sets, dispatch)
        out[app.name] = path_latencies_s(app, lat)[0]
    return out


def _retimed(plan: ModulePlan, dispatch: Dispatch) -> ModulePlan:
    """The same machines and rates, their worst case under `dispatch`."""
    return replace(plan, wcl_s=module_latency_s(plan.assignments, dispatch))


def _cost(plans: Mapping[str, ModulePlan]) -> float:
    return sum(p.cost for p in plans.values())


def _round_up(x: float) -> str:
    """x rounded up to 6 significant digits, so the printed SLO is always feasible."""
    if not math.isfinite(x) or x <= 0:
        return f"{x:.6g}"
    quantum = 10.0 ** (math.floor(math.log10(x)) - 5)
    return f"{math.ceil(x / quantum - 1e-9) * quantum:.6g}"


def _module_doc(budget_s: float, plan: ModulePlan, dispatch: Dispatch) -> dict[str, Any]:
    return {
        "budget_s": budget_s,
        "wcl_s": plan.wcl_s,
        "dummy_rps": plan.dummy_rps,
        "configs": [
            {
                "hardware": a.config.hardware,
                "batch": a.config.batch,
                "concurrency": a.config.concurrency,
                "machines": a.machines,
                "rate_rps": a.rate_rps,
                "wcl_s": lat,
            }
            for a, lat in assignment_latencies_s(plan.assignments, dispatch)
        ],
    }

"""The cloud cost planner: a workload in, the plan document of issue 7 out.

For each app independently (Harpagon §III, Piccolo §III): split the SLO into per-module budgets
by latency-cost efficiency (`split.split_latency`, Algorithm 2), build each module's
configuration set with Algorithm 1 and dummy requests (`configs.schedule_module`, Theorem 2),
then hand unused path latency to modules (`split.reassign_slack`). Total cost is the sum over
modules of price x rate / throughput. The planner reads no clock: `runtime_ms` is left for the
caller to fill in.
"""

from __future__ import annotations

from typing import Any

from scheduler.cloud.configs import DummyRule, ModulePlan, schedule_module
from scheduler.cloud.latency import DISPATCHES, Dispatch, assignment_latencies_s
from scheduler.cloud.split import SloTooTight, path_latencies_s, reassign_slack, split_latency
from scheduler.cloud.workload import App, Workload
from scheduler.errors import InputError

SYSTEMS: dict[str, tuple[Dispatch, int | None, DummyRule, bool]] = {
    # name: (dispatch, tuple limit, dummy rule, latency reassigner)
    "harpagon": ("tc", None, "harpagon", True),
    "piccolo": ("tc", None, "piccolo", True),
}


def plan(
    workload: Workload,
    system: str = "harpagon",
    *,
    dispatch: Dispatch | None = None,
    max_configs: int | None = None,
    dummy: bool = True,
    reassign: bool = True,
) -> dict[str, Any]:
    """Plan `workload` as `system` would; the keyword switches override the system's features.

    Returns {"cost", "e2e_latency_s": {app: s}, "modules": {m: {"budget_s", "wcl_s",
    "dummy_rps", "configs": [{"hardware", "batch", "concurrency", "machines", "rate_rps",
    "wcl_s"}]}}}. Raises `InputError` for an unknown system or dispatch, or an SLO no
    configuration meets (naming the smallest end-to-end latency reachable). Guaranteed: every
    app's e2e_latency_s (its longest DAG path of module worst cases) fits its slo_s."""
    if system not in SYSTEMS:
        raise InputError(
            "--system", "", f"one of {', '.join(SYSTEMS)} (others not implemented)", system
        )
    sys_dispatch, sys_limit, sys_dummy, sys_reassign = SYSTEMS[system]
    disp = dispatch or sys_dispatch
    if disp not in DISPATCHES:
        raise InputError("--dispatch", "", f"one of {', '.join(DISPATCHES)}", disp)
    if max_configs is not None and max_configs < 1:
        raise InputError("--configs", "", "a positive number of configurations", max_configs)
    limit = max_configs if max_configs is not None else sys_limit
    rule: DummyRule = sys_dummy if dummy else "none"
    total = 0.0
    e2e: dict[str, float] = {}
    modules: dict[str, Any] = {}
    for app in workload.apps:
        budgets, plans = _plan_app(workload, app, disp, limit, rule, reassign and sys_reassign)
        e2e[app.name], _ = path_latencies_s(app, {m: p.wcl_s for m, p in plans.items()})
        for m in app.modules:
            total += plans[m].cost
            modules[m] = _module_doc(budgets[m], plans[m], disp)
    return {"cost": total, "e2e_latency_s": e2e, "modules": modules}


def _plan_app(
    workload: Workload,
    app: App,
    dispatch: Dispatch,
    limit: int | None,
    rule: DummyRule,
    reassign: bool,
) -> tuple[dict[str, float], dict[str, ModulePlan]]:
    try:
        budgets = split_latency(app, workload.profiles, dispatch)
    except SloTooTight as exc:
        raise InputError(
            "workload",
            f"apps.{app.name}.slo_s",
            f"at least {exc.min_slo_s:.6g} s, the smallest end-to-end worst case its modules reach",
            app.slo_s,
        ) from None

    def build(m: str, budget_s: float) -> ModulePlan | None:
        return schedule_module(
            workload.profiles[m], app.rate_rps[m], budget_s, dispatch, limit, rule
        )

    plans: dict[str, ModulePlan] = {}
    for m in app.modules:
        got = build(m, budgets[m])
        if got is None:
            raise InputError(
                "workload",
                f"apps.{app.name}",
                f"a configuration set for module {m} at {app.rate_rps[m]:g} req/s within its "
                f"{budgets[m]:.6g} s budget (allow dummy requests or relax slo_s)",
            )
        plans[m] = got
    if reassign:
        reassign_slack(app, budgets, plans, build)
    return budgets, plans


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

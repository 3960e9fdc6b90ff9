"""Several models on one cluster: maximise the smallest throughput / workload share (PPipe 3).

Paper 004, section 3 ("In the presence of multiple DNN models, given the ratio between the DNNs'
workloads, the MILP formulation computes the normalized throughput for each DNN (throughput
divided by the DNN's workload percentage), and maximizes the lowest normalized throughput") and
A.1 ("each DNN model has its own set of decision variables and constraints, with the additional
constraint that the total number of GPUs allocated to all DNN models does not exceed the
cluster configuration"). Formulation (solved by `scheduler.pipeline.milp.solve_candidates`):

    maximise   t
    s.t.       sum_{c of g} x_c >= share_g * t                        for every model g
               x_c <= r_{c,d} w_{c,d};  sum_{c of g at (d,k)} w / m <= n_{g,d,k}   (per model g)
               sum_{g,d} n_{g,d,k} <= N_k                             for every GPU type k

with each model's candidates built for its own SLO (same margin, P and MPS limit). A physical GPU
serves one model. A second solve keeps t and maximises total throughput, so GPUs the bottleneck
model cannot use still serve the others. Shares are positive weights (they need not sum to 1):
t is the rate at which every model g gets at least share_g * t (solved with them scaled to
sum to 1, t read back in the given scale: HiGHS's time depends on it). Size: the union of the
models' MILPs plus G rows and one column.

Speed (more than SCREEN_MODELS_MIN candidates in all; `solve_screened_models`): exact LP-bound
screening over the union of the models' candidates (`scheduler.pipeline.screening`, several
models): an incumbent t = z from the MILP over each model's SCREEN_TOP candidates of largest
UB(c), then the MILP over S = {c : UB(c) >= z}. No solution with t >= z uses a candidate outside
S, so both its solves (t, then the total at that t) are those over all candidates, and its gap
bounds the whole problem. The bound is loose where whole GPUs split between models matter (the
LP shares them; 8% on 8 GPUs), so S keeps much: `bench/pipeline_models.py` measures the solve
2-4x faster, the same t (cyclegan and repvgg-b3 at 200 ms SLOs on 4 L4 + 4 T4, 8603 candidates:
126 -> 37 s). The incumbent also gives a plan when the time limit stops the last MILP before it
finds one (4571 candidates under 2 s: no plan before).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from scheduler.errors import InputError
from scheduler.pipeline.candidates import Candidate
from scheduler.pipeline.cluster import Cluster
from scheduler.pipeline.milp import (
    HEURISTIC_NODES,
    HEURISTIC_SHARE,
    SCREEN_TOP,
    MilpResult,
    candidates_or_refusal,
    check_limits,
    solve_candidates,
    system_limits,
)
from scheduler.pipeline.plan import ModelShare, ModelsPlan
from scheduler.pipeline.profiles import ModelProfiles
from scheduler.pipeline.screening import candidate_bounds, share_weights

MODEL_SYSTEMS = ("ppipe", "np")
# fewer candidates in all: the plain MILP (the screening's LPs and incumbent cost about as much
# as they save: 289 candidates of three models, 0.7 s plain, 1.1 s screened)
SCREEN_MODELS_MIN = 1000


@dataclass(frozen=True)
class Workload:
    """One model to serve: its block profiles, its workload share and its SLO."""

    profiles: ModelProfiles
    share: float
    slo_ms: float


def plan_models(
    workloads: Sequence[Workload],
    cluster: Cluster,
    margin: float = 0.1,
    max_parts: int = 3,
    max_mps: int = 4,
    system: str = "ppipe",
    time_limit_s: float | None = None,
    mip_rel_gap: float = 1e-4,
    *,
    prune: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ModelsPlan:
    """Solve the multi-model MILP (module docstring); pure, `solve_s` None. `prune` False skips
    the LP-bound screening (same optimum, slower; for checking it). `progress`, if given, is
    told once, before the solve (which may take minutes), how many candidates each model has.

    Guarantees: with status "optimal", every model g gets at least share_g * t (t =
    `normalized_rps`, optimal within the gap), its pipelines meet its SLO with the margin, and
    all models together use at most the cluster's GPUs. Raises InputError for no models, a model
    named twice, a share that is not a positive number, system dart-r, and everything
    `plan_pipelines` refuses (naming the model whose SLO no pipeline meets).
    """
    if system not in MODEL_SYSTEMS:
        raise InputError(
            "plan", "system", f"one of {', '.join(MODEL_SYSTEMS)} for several models", system
        )
    check_limits(system, max_parts, max_mps)
    if not workloads:
        raise InputError("plan", "models", "at least one model")
    names = [w.profiles.model for w in workloads]
    for name in names:
        if names.count(name) > 1:
            raise InputError("plan", "models", "each model once", name)
    for w in workloads:
        if not isinstance(w.share, int | float) or not (math.isfinite(w.share) and w.share > 0):
            raise InputError("plan", f"share.{w.profiles.model}", "a positive number", w.share)
    parts, mps = system_limits(system, max_parts, max_mps)
    groups = [
        candidates_or_refusal(w.profiles, cluster, w.slo_ms, margin, parts, mps, system)
        for w in workloads
    ]
    # solved with the shares scaled to sum to 1, so that t is of the order of the total rate:
    # the same problem however the shares are written (HiGHS took 74 s on two models at shares
    # 1 and 1, 3 s at 0.5 and 0.5), then t read back in the caller's shares
    if progress is not None:
        counts = ", ".join(f"{n} {len(c)}" for n, c in zip(names, groups, strict=True))
        limit = "" if time_limit_s is None else f", at most {time_limit_s:g} s"
        total = sum(len(c) for c in groups)
        progress(f"{total} candidate pipelines ({counts}); solving{limit}")
    total_share = sum(float(w.share) for w in workloads)
    shares = [float(w.share) / total_share for w in workloads]
    if prune and sum(len(cands) for cands in groups) > SCREEN_MODELS_MIN:
        result = solve_screened_models(groups, cluster, shares, time_limit_s, mip_rel_gap)
    else:
        result = solve_candidates(groups, cluster, shares, time_limit_s, mip_rel_gap)
    models = {
        w.profiles.model: ModelShare(float(w.share), w.slo_ms, plan)
        for w, plan in zip(workloads, result.plans, strict=True)
    }
    return ModelsPlan(result.normalized_rps / total_share, result.status, result.gap, None, models)


def solve_screened_models(
    groups: Sequence[Sequence[Candidate]],
    cluster: Cluster,
    shares: Sequence[float],
    time_limit_s: float | None,
    mip_rel_gap: float,
) -> MilpResult:
    """`solve_candidates` with exact LP-bound screening (module: Speed); the incumbent's MILP
    runs HEURISTIC_NODES nodes under HEURISTIC_SHARE of the limit, the last MILP the rest. The
    result is the last MILP's unless the limit stopped it below the incumbent (or before any
    solution): then the incumbent's, status "time_limit", its gap against the union's bound B.
    Plans count all of each model's candidates."""
    weights = share_weights(groups, cluster, shares)
    union = [
        replace(cand, rates_rps=tuple(w * r for r in cand.rates_rps))
        for cands, w in zip(groups, weights, strict=True)
        for cand in cands
    ]
    bounds = candidate_bounds(union, cluster)
    starts = list(itertools.accumulate((len(cands) for cands in groups), initial=0))
    ubs = [bounds.used_bound_rps[a:b] for a, b in itertools.pairwise(starts)]
    tops = [
        set(sorted(range(len(ub)), key=lambda i: (-ub[i], i))[:SCREEN_TOP]) for ub in ubs
    ]  # fmt: skip
    heuristic_s = None if time_limit_s is None else time_limit_s * HEURISTIC_SHARE
    first = solve_candidates(
        [[cands[i] for i in sorted(top)] for cands, top in zip(groups, tops, strict=True)],
        cluster, shares, heuristic_s, mip_rel_gap, node_limit=HEURISTIC_NODES,
    )  # fmt: skip
    z = first.normalized_rps * (1 - 1e-9)  # the incumbent's t, less rounding
    keep = [
        [cand for i, cand in enumerate(cands) if ub[i] >= z or i in top]
        for cands, ub, top in zip(groups, ubs, tops, strict=True)
    ]
    rest_s = None if time_limit_s is None else time_limit_s - (heuristic_s or 0.0)
    final = solve_candidates(keep, cluster, shares, rest_s, mip_rel_gap)
    best = final
    found = any(plan.pipelines for plan in final.plans)
    stopped = final.status != "optimal"  # by the time limit (an optimum is never worse)
    if z > 0 and stopped and (not found or final.normalized_rps < first.normalized_rps):
        # stopped below the incumbent: the incumbent, against the bound on every solution
        gap = max(0.0, bounds.bound_rps - first.normalized_rps) / first.normalized_rps
        best = replace(first, status="time_limit", gap=gap)
    plans = [
        replace(plan, status=best.status, gap=best.gap, candidates=len(cands))
        for plan, cands in zip(best.plans, groups, strict=True)
    ]
    return replace(best, plans=plans)


def solve_models(
    workloads: Sequence[Workload],
    cluster: Cluster,
    margin: float = 0.1,
    max_parts: int = 3,
    max_mps: int = 4,
    system: str = "ppipe",
    time_limit_s: float | None = None,
    clock: Callable[[], float] | None = None,
    mip_rel_gap: float = 1e-4,
    progress: Callable[[str], None] | None = None,
) -> ModelsPlan:
    """`plan_models`, timed with the caller's `clock` (seconds), like `milp.solve`."""
    start_s = clock() if clock is not None else None
    plan = plan_models(
        workloads, cluster, margin, max_parts, max_mps, system, time_limit_s, mip_rel_gap,
        progress=progress,
    )  # fmt: skip
    if clock is None or start_s is None:
        return plan
    elapsed = clock() - start_s
    models = {
        name: replace(entry, plan=replace(entry.plan, solve_s=elapsed))
        for name, entry in plan.models.items()
    }
    return replace(plan, solve_s=elapsed, models=models)


def parse_named_numbers(text: str, field: str) -> dict[str, float]:
    """`"A=0.5,B=0.5"` -> {"A": 0.5, "B": 0.5}; InputError naming `field` for anything else
    (a missing '=', a name given twice, a number that is not positive and finite)."""
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not name or not (math.isfinite(number) and number > 0) or name in out:
            raise InputError(field, "", "NAME=POSITIVE_NUMBER,... with each name once", text)
        out[name] = number
    return out

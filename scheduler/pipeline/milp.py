"""PPipe control plane: the pool-based pipeline MILP with batch-size unification.

Paper 004, sections 3 and 5.1-5.3 and Appendix A.1/A.2, as issue 8 states it. The candidates c
(pipeline configurations meeting the latency SLO (L), exact dominance pruning) are built in
`scheduler.pipeline.candidates`; this module solves, with scipy.optimize.milp (HiGHS):

Variables: x_c >= 0 real (pipeline throughput, rps), w_{c,d} >= 0 integer (workers = virtual
GPUs of partition d), n_{g,d,k} >= 0 integer (physical GPUs of type k at partition index d of
model g; one model: g is dropped), and for several models t >= 0 real.

    one model:     maximise  sum_c x_c                                       (A.2 eq. 15)
    several:       maximise  t  s.t.  sum_{c of g} x_c >= share_g * t  for all g  (section 3)
    s.t.           x_c <= r_{c,d} * w_{c,d}                   for all c, d  (eq. 25, 28)
                   sum_{c of g, d: k_d = k} w_{c,d} / m_{c,d} <= n_{g,d,k}  for all g, d, k (23)
                   sum_{g, d} n_{g,d,k} <= N_k                for all k
                   w_{c,d} <= N_{k_d} * m_{c,d},  x_c <= min_d r_{c,d} * N_{k_d} * m_{c,d}

With several models a second solve keeps t at the first solve's value (less MAX_MIN_SLACK) and
maximises sum_c x_c, so GPUs the bottleneck model cannot use still serve the others. A plan's pipelines report
x_c and ceil(x_c / r_{c,d}) workers per partition (no idle worker is listed). The NP baseline
is the same MILP with P = 1 and M = {1}; DART-r (`scheduler.pipeline.dart`) is solved directly.
Size: |C| continuous + sum_c D_c + G * P * K integer variables, sum_c D_c + G * P * K + K (+ G)
rows.

Speed (one model, more than SCREEN_TOP candidates; `solve_screened`): exact LP-bound screening
(`scheduler.pipeline.screening`) drops every candidate that no solution better than an incumbent
can use, and the last MILP searches only above that incumbent; the reported gap bounds the
whole problem, so the optimum and the gap semantics are those of the plain MILP.

Configuration MILP (the last MILP when at most CONFIG_LIMIT configurations survive). Some optimum
runs every candidate c at a point x where one of its worker counts steps up (x = j * r_{c,d}, or
x = U_c) on w_{c,d} = ceil(x / r_{c,d}) workers: lowering w to ceil(x_c / r) and raising x_c to
the next such point changes no GPU count and loses no throughput. `screening.configs` lists the
configurations (c, x) that a solution worth the cutoff z' or more can use (UB(c, x) >= z'); with
y_j in {0, 1} per configuration j = (c_j, x_j, w_j) and n_{d,k} as above:

    maximise  sum_j x_j y_j
    s.t.      sum_{j: k_{c_j,d} = k} L * w_{j,d} / m_{c_j,d} * y_j <= L * n_{d,k}   for all d, k
              sum_d n_{d,k} <= N_k  for all k,   sum_{j of c} y_j <= 1  for all c,
              sum_j x_j y_j >= z'

(L: the lcm of the MPS levels, so every coefficient is an integer). Its LP relaxation sees the
ceilings the plain one averages away (a sliver of a pipeline costs whole workers), which closes
the gap the plain MILP leaves on efficientnet-b8; its optimum is the plain MILP's.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp
from scipy.sparse import coo_matrix

from scheduler.errors import InputError
from scheduler.pipeline.candidates import (
    BATCHING_DELAY_FACTOR,
    Candidate,
    enumerate_candidates,
    estimated_throughput_rps,
    smallest_workable_slo_ms,
)
from scheduler.pipeline.cluster import Cluster, GpuPool
from scheduler.pipeline.dart import plan_dart_r
from scheduler.pipeline.plan import Partition, Pipeline, PipelinePlan, pipeline_of, worker_count
from scheduler.pipeline.profiles import ModelProfiles
from scheduler.pipeline.screening import Config, candidate_bounds, configs

__all__ = [
    "BATCHING_DELAY_FACTOR",
    "SYSTEMS",
    "Candidate",
    "Cluster",
    "GpuPool",
    "Partition",
    "Pipeline",
    "PipelinePlan",
    "enumerate_candidates",
    "estimated_throughput_rps",
    "plan_pipelines",
    "smallest_workable_slo_ms",
    "solve",
    "solve_candidates",
]

SYSTEMS = ("ppipe", "np", "dart-r")
_STATUS = {0: "optimal", 1: "time_limit", 2: "infeasible", 3: "unbounded"}
_X_ZERO_RPS = 1e-6
SCREEN_TOP = 20  # candidates of largest UB(c) the incumbent MILP chooses among
HEURISTIC_NODES = 500  # branch-and-bound nodes the incumbent MILP may spend
HEURISTIC_SHARE = 0.2  # of the time limit, for the incumbent MILP
MAX_MIN_SHARE = 0.7  # of the time limit, for several models' max-min solve (then the total's)
# the total's solve keeps t within this share of the max-min optimum: HiGHS's tolerances let t
# overshoot by about 1e-9 relative, and a bound that tight cut off the most total (430 -> 366 rps)
MAX_MIN_SLACK = 1e-6
CUTOFF_SHARE = 0.5  # the final MILP looks for solutions above z * (1 + this * mip_rel_gap)
WARM_TOP = 50  # candidates of largest UB(c) whose configurations the second incumbent uses
CONFIG_LIMIT = 100_000  # most configurations the final MILP takes; more: the plain MILP over S
FloatArray = np.ndarray[Any, np.dtype[np.float64]]


def check_limits(system: str, max_parts: int, max_mps: int) -> None:
    """Raise InputError for an unknown system or a non-positive P or MPS limit."""
    if system not in SYSTEMS:
        raise InputError("plan", "system", f"one of {', '.join(SYSTEMS)}", system)
    if not isinstance(max_parts, int) or max_parts < 1:
        raise InputError("plan", "max_parts", "a positive integer", max_parts)
    if not isinstance(max_mps, int) or max_mps < 1:
        raise InputError("plan", "mps", "a positive integer", max_mps)


def system_limits(system: str, max_parts: int, max_mps: int) -> tuple[int, int]:
    """(P, M) the MILP runs with: NP is one partition at MPS 1."""
    return (1, 1) if system == "np" else (max_parts, max_mps)


def candidates_or_refusal(
    profiles: ModelProfiles,
    cluster: Cluster,
    slo_ms: float,
    margin: float,
    max_parts: int,
    max_mps: int,
    system: str,
    *,
    prune: bool = True,
) -> list[Candidate]:
    """The (pruned) candidates; InputError naming the smallest workable SLO if there are none
    (or the cluster, if it has no GPU at all)."""
    if not cluster.types_in_use():
        raise InputError(cluster.source, "gpus", "at least one GPU (every count is 0)")
    cands = enumerate_candidates(profiles, cluster, slo_ms, margin, max_parts, max_mps, prune=prune)
    if cands:
        return cands
    smallest = smallest_workable_slo_ms(profiles, cluster, margin, max_parts, max_mps)
    expected = (
        "an SLO some pipeline can meet, but no pipeline fits any SLO on this cluster"
        if smallest is None
        else f"an SLO of at least {smallest:.3f} ms (the smallest any {system} pipeline meets)"
    )
    where = "plan" if not profiles.model else f"plan {profiles.model}"
    raise InputError(where, "slo_ms", expected, slo_ms)


def plan_pipelines(
    profiles: ModelProfiles,
    cluster: Cluster,
    slo_ms: float,
    margin: float = 0.1,
    max_parts: int = 3,
    max_mps: int = 4,
    system: str = "ppipe",
    time_limit_s: float | None = None,
    mip_rel_gap: float = 1e-4,
    *,
    prune: bool = True,
) -> PipelinePlan:
    """Solve the MILP for one model (pure: no clock; `solve_s` is None).

    `prune` False skips the exact dominance pruning and LP-bound screening (same optimum,
    slower; for checking them).
    `system` "np" is the NP baseline (one partition, MPS level 1), "dart-r" the DART-r baseline
    (`scheduler.pipeline.dart`, which ignores P and the MPS limit). Guarantees: the plan's
    pipelines meet (L), use at most the cluster's GPUs (per type, summed over partition indices
    of the integer counts n_{d,k}), and with status "optimal" their total throughput is the
    optimum within HiGHS's relative gap (reported as `gap`). Raises InputError for a bad SLO,
    margin, P, MPS limit, system, a cluster GPU type without profiles, or an SLO no pipeline
    meets (naming the smallest workable SLO). The plan records `profiles.model` and `slo_ms`.
    """
    check_limits(system, max_parts, max_mps)
    if system == "dart-r":
        plan = plan_dart_r(profiles, cluster, slo_ms, margin)
    else:
        parts, mps = system_limits(system, max_parts, max_mps)
        cands = candidates_or_refusal(
            profiles, cluster, slo_ms, margin, parts, mps, system, prune=prune
        )
        if prune and len(cands) > SCREEN_TOP:
            plan = solve_screened(cands, cluster, time_limit_s, mip_rel_gap)
        else:
            plan = solve_candidates([cands], cluster, None, time_limit_s, mip_rel_gap).plans[0]
    return replace(plan, model=profiles.model, slo_ms=float(slo_ms))


@dataclass(frozen=True)
class _Layout:
    """Column indices of the MILP's variables."""

    x_start: list[int]  # per model: first x column; x_c of model g at x_start[g] + c
    w_start: int  # the w columns are w_start .. n_start - 1
    w_index: list[list[list[int]]]  # [g][c][d] -> column
    n_start: int  # n_{g,d,k} at n_start + (g * parts + d) * K + k
    t_index: int | None
    size: int


def _layout(groups: Sequence[Sequence[Candidate]], parts: int, types: int, multi: bool) -> _Layout:
    x_start, w_index = [], []
    col = 0
    for cands in groups:
        x_start.append(col)
        col += len(cands)
    w_start = col
    for cands in groups:
        per_model = []
        for cand in cands:
            per_model.append(list(range(col, col + len(cand.gpus))))
            col += len(cand.gpus)
        w_index.append(per_model)
    n_start = col
    col += len(groups) * parts * types
    t_index = col if multi else None
    return _Layout(x_start, w_start, w_index, n_start, t_index, col + (1 if multi else 0))


@dataclass(frozen=True)
class _Model:
    """The MILP's arrays (see module): rows A v <= upper, 0 <= v <= var_upper."""

    layout: _Layout
    matrix: Any  # scipy.sparse CSR matrix
    upper: FloatArray
    var_upper: FloatArray
    integrality: FloatArray
    total: FloatArray  # objective vector of sum_c x_c


def _build(
    groups: Sequence[Sequence[Candidate]],
    cluster: Cluster,
    shares: Sequence[float] | None,
    min_total_rps: float | None = None,
) -> _Model:
    """The MILP's arrays; `min_total_rps`: also the row sum_c x_c >= min_total_rps."""
    types = sorted(cluster.gpus)
    parts = max((len(c.gpus) for cands in groups for c in cands), default=1)
    lay = _layout(groups, parts, len(types), shares is not None)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    upper: list[float] = []

    def add_row(entries: list[tuple[int, float]], bound: float) -> None:
        for col, val in entries:
            rows.append(len(upper))
            cols.append(col)
            vals.append(val)
        upper.append(bound)

    var_upper = np.zeros(lay.size)
    for g, cands in enumerate(groups):
        usage: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for c, cand in enumerate(cands):
            x_col = lay.x_start[g] + c
            caps = []
            for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True)):
                w_col = lay.w_index[g][c][d]
                add_row([(x_col, 1.0), (w_col, -cand.rates_rps[d])], 0.0)  # x <= r w
                usage.setdefault((d, types.index(gpu)), []).append((w_col, 1.0 / m))
                var_upper[w_col] = cluster.gpus[gpu].count * m
                caps.append(cand.rates_rps[d] * cluster.gpus[gpu].count * m)
            var_upper[x_col] = min(caps)
        for (d, k), entries in sorted(usage.items()):  # sum w / m <= n_{g,d,k}
            add_row([*entries, (lay.n_start + (g * parts + d) * len(types) + k, -1.0)], 0.0)
    for k, gpu in enumerate(types):  # sum_{g,d} n_{g,d,k} <= N_k
        n_cols = [
            lay.n_start + (g * parts + d) * len(types) + k
            for g in range(len(groups))
            for d in range(parts)
        ]
        var_upper[n_cols] = cluster.gpus[gpu].count
        add_row([(col, 1.0) for col in n_cols], float(cluster.gpus[gpu].count))
    total = np.zeros(lay.size)
    for g, cands in enumerate(groups):
        total[lay.x_start[g] : lay.x_start[g] + len(cands)] = 1.0
    integrality = np.zeros(lay.size)
    integrality[lay.w_start : lay.n_start + len(groups) * parts * len(types)] = 1
    if lay.t_index is not None and shares is not None:
        var_upper[lay.t_index] = min(
            float(var_upper[lay.x_start[g] : lay.x_start[g] + len(cands)].sum()) / share
            for g, (cands, share) in enumerate(zip(groups, shares, strict=True))
        )
        for g, (cands, share) in enumerate(zip(groups, shares, strict=True)):
            x_cols = range(lay.x_start[g], lay.x_start[g] + len(cands))  # share t - x_g <= 0
            add_row([(lay.t_index, share), *((col, -1.0) for col in x_cols)], 0.0)
    if min_total_rps is not None:  # -sum_c x_c <= -min_total_rps
        add_row([(int(col), -1.0) for col in np.flatnonzero(total)], -min_total_rps)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(upper), lay.size)).tocsr()
    return _Model(lay, matrix, np.array(upper), var_upper, integrality, total)


def _run(
    model: _Model,
    objective: FloatArray,
    lower: FloatArray,
    time_limit_s: float | None,
    mip_rel_gap: float,
    cutoff: float | None = None,
    node_limit: int | None = None,
) -> OptimizeResult:
    """Maximise objective . v with HiGHS; `cutoff`: only solutions worth more are searched
    (HiGHS's objective_bound, passed through scipy verbatim)."""
    options: dict[str, Any] = {"disp": False, "mip_rel_gap": mip_rel_gap}
    if time_limit_s is not None:
        options["time_limit"] = time_limit_s
    if node_limit is not None:
        options["node_limit"] = node_limit
    if cutoff is not None:
        options["objective_bound"] = -cutoff
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
        return milp(
            -objective,
            constraints=LinearConstraint(model.matrix, -np.inf, model.upper),
            integrality=model.integrality,
            bounds=Bounds(lower, model.var_upper),
            options=options,
        )


def _status(res: OptimizeResult) -> str:
    return _STATUS.get(int(res.status), "error")


def _gap(res: OptimizeResult) -> float | None:
    gap = getattr(res, "mip_gap", None)
    return None if gap is None else float(gap)


def _pipelines(
    x: FloatArray | None, cands: Sequence[Candidate], start: int
) -> tuple[tuple[Pipeline, ...], list[int]]:
    """The plan's pipelines for x (candidates with x_c > 0) and their candidate indices."""
    if x is None:
        return (), []
    used = [
        c
        for c in range(len(cands))
        if float(x[start + c]) > _X_ZERO_RPS
        and all(worker_count(float(x[start + c]), rate) > 0 for rate in cands[c].rates_rps)
    ]
    return tuple(pipeline_of(cands[c], float(x[start + c])) for c in used), used


@dataclass(frozen=True)
class MilpResult:
    """`solve_candidates`'s answer: one plan per model, t, and the joint status and gap."""

    plans: list[PipelinePlan]
    normalized_rps: float
    status: str
    gap: float | None


def solve_candidates(
    groups: Sequence[Sequence[Candidate]],
    cluster: Cluster,
    shares: Sequence[float] | None,
    time_limit_s: float | None,
    mip_rel_gap: float,
    *,
    node_limit: int | None = None,
) -> MilpResult:
    """Solve the MILP over one candidate list per model, without screening.

    `shares` None: maximise total throughput (t is that total). Otherwise one share per model:
    maximise t = min_g x_g / share_g, then total throughput at that t less MAX_MIN_SLACK (see
    module; the first solve under MAX_MIN_SHARE of `time_limit_s`, the second under the rest;
    each under `node_limit` branch-and-bound nodes). Plans carry the joint status and gap;
    `solve_s` None.
    """
    model = _build(groups, cluster, shares)
    lay = model.layout
    lower = np.zeros(lay.size)
    if lay.t_index is None:
        res = _run(model, model.total, lower, time_limit_s, mip_rel_gap, node_limit=node_limit)
        x = res.x
        t_value = float(model.total @ x) if x is not None else 0.0
    else:
        objective = np.zeros(lay.size)
        objective[lay.t_index] = 1.0
        first_s = None if time_limit_s is None else time_limit_s * MAX_MIN_SHARE
        res = _run(model, objective, lower, first_s, mip_rel_gap, node_limit=node_limit)
        x = res.x
        t_value = float(x[lay.t_index]) if x is not None else 0.0
        if x is not None and res.status == 0:
            lower[lay.t_index] = t_value * (1 - MAX_MIN_SLACK)
            rest_s = None if time_limit_s is None else time_limit_s - (first_s or 0.0)
            second = _run(model, model.total, lower, rest_s, mip_rel_gap, node_limit=node_limit)
            if second.x is not None:
                x = second.x
    status, gap = _status(res), _gap(res)
    plans = []
    for g, cands in enumerate(groups):
        pipelines, _ = _pipelines(x, cands, lay.x_start[g])
        total = sum(p.throughput_rps for p in pipelines)
        plans.append(PipelinePlan(total, status, gap, None, pipelines, len(cands)))
    return MilpResult(plans, t_value, status, gap)


@dataclass(frozen=True)
class _Single:
    plan: PipelinePlan
    used: list[int]
    dual_bound_rps: float | None
    res: OptimizeResult


def _solve_single(
    cands: Sequence[Candidate],
    cluster: Cluster,
    time_limit_s: float | None,
    mip_rel_gap: float,
    *,
    cutoff: float | None = None,
    node_limit: int | None = None,
) -> _Single:
    model = _build([cands], cluster, None, cutoff)
    lower = np.zeros(model.layout.size)
    res = _run(model, model.total, lower, time_limit_s, mip_rel_gap, cutoff, node_limit)
    pipelines, used = _pipelines(res.x, cands, 0)
    total = sum(p.throughput_rps for p in pipelines)
    plan = PipelinePlan(total, _status(res), _gap(res), None, pipelines, len(cands))
    bound = getattr(res, "mip_dual_bound", None)
    dual = None if bound is None or not math.isfinite(float(bound)) else -float(bound)
    return _Single(plan, used, dual, res)


def _solve_configs(
    cands: Sequence[Candidate],
    chosen: Sequence[Config],
    cluster: Cluster,
    time_limit_s: float | None,
    mip_rel_gap: float,
    cutoff: float | None,
    node_limit: int | None = None,
) -> _Single:
    """The configuration MILP (see module) over `chosen`, with sum_j x_j y_j >= cutoff."""
    types = sorted(cluster.gpus)
    parts = max(len(cands[cfg.cand].gpus) for cfg in chosen)
    n_y, n_n = len(chosen), parts * len(types)
    owners = sorted({cfg.cand for cfg in chosen})
    owner_row = {c: n_n + len(types) + i for i, c in enumerate(owners)}
    scale = math.lcm(*(m for c in owners for m in cands[c].mps))  # integer coefficients
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for j, cfg in enumerate(chosen):
        cand = cands[cfg.cand]
        for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True)):
            rows.append(d * len(types) + types.index(gpu))
            cols.append(j)
            vals.append(float(cfg.workers[d] * (scale // m)))
        rows.append(owner_row[cfg.cand])
        cols.append(j)
        vals.append(1.0)
    for d in range(parts):
        for k in range(len(types)):
            rows += [d * len(types) + k, n_n + k]
            cols += [n_y + d * len(types) + k] * 2
            vals += [-float(scale), 1.0]
    counts = [float(cluster.gpus[gpu].count) for gpu in types]
    upper = np.array([0.0] * n_n + counts + [1.0] * len(owners))
    objective = np.zeros(n_y + n_n)
    objective[:n_y] = [cfg.x_rps for cfg in chosen]
    if cutoff is not None:  # -sum_j x_j y_j <= -cutoff
        rows += [len(upper)] * n_y
        cols += list(range(n_y))
        vals += [-cfg.x_rps for cfg in chosen]
        upper = np.append(upper, -cutoff)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(upper), n_y + n_n)).tocsr()
    var_upper = np.concatenate([np.ones(n_y), np.repeat([counts], parts, axis=0).ravel()])
    model = _Model(_layout([], parts, len(types), False), matrix, upper, var_upper,
                   np.ones(n_y + n_n), objective)  # fmt: skip
    res = _run(model, objective, np.zeros(n_y + n_n), time_limit_s, mip_rel_gap, cutoff, node_limit)
    picked = [] if res.x is None else [j for j in range(n_y) if float(res.x[j]) > 0.5]
    pipelines = tuple(
        pipeline_of(cands[chosen[j].cand], chosen[j].x_rps, chosen[j].workers) for j in picked
    )
    total = sum(p.throughput_rps for p in pipelines)
    plan = PipelinePlan(total, _status(res), _gap(res), None, pipelines, len(cands))
    bound = getattr(res, "mip_dual_bound", None)
    dual = None if bound is None or not math.isfinite(float(bound)) else -float(bound)
    return _Single(plan, [chosen[j].cand for j in picked], dual, res)


def solve_screened(
    cands: Sequence[Candidate],
    cluster: Cluster,
    time_limit_s: float | None,
    mip_rel_gap: float,
) -> PipelinePlan:
    """One model's MILP with exact LP-bound screening (`scheduler.pipeline.screening`).

    1. UB(c) for every candidate from the LP relaxation's prices.
    2. Incumbent z: the MILP over the SCREEN_TOP candidates of largest UB, stopped after
       HEURISTIC_NODES branch-and-bound nodes (deterministic) and HEURISTIC_SHARE of the limit.
    3. Cutoff z' = z * (1 + CUTOFF_SHARE * mip_rel_gap). The MILP over S = {c : UB(c) >= z'}
       with the row sum_c x_c >= z' (and z' as HiGHS's objective_bound), under the rest of the
       time limit: infeasible proves z within the gap. No solution using a candidate outside S
       is worth z' or more.
       When at most CONFIG_LIMIT configurations (c, x) have UB(c, x) >= z', the last MILP is
       the configuration MILP over them (see module) instead, and "outside" also covers the
       configurations left out (each UB(c, x) < z'). Before it, when they span more than
       WARM_TOP candidates, the configuration MILP over those of the WARM_TOP candidates of
       largest UB, without the cutoff row (HEURISTIC_NODES nodes, HEURISTIC_SHARE of the limit),
       may raise z; z' and the configurations are then screened again at the new z'.
    The better of the two solutions is the plan. Its gap is against max(the last MILP's bound
    over S, or z' if it found nothing above z', and max UB outside S): a bound on every
    solution over all candidates. `candidates` counts all of `cands`.
    """
    bounds = candidate_bounds(cands, cluster)
    ub = bounds.used_bound_rps
    order = sorted(range(len(cands)), key=lambda i: (-ub[i], i))
    top = sorted(order[:SCREEN_TOP])
    share = None if time_limit_s is None else time_limit_s * HEURISTIC_SHARE
    first = _solve_single(
        [cands[i] for i in top], cluster, share, mip_rel_gap, node_limit=HEURISTIC_NODES
    )
    z_rps = first.plan.throughput_rps
    cutoff = z_rps * (1 + CUTOFF_SHARE * mip_rel_gap) if z_rps > 0 else None
    keep = [i for i in range(len(cands)) if cutoff is None or ub[i] >= cutoff]
    outside = max((ub[i] for i in range(len(cands)) if cutoff and ub[i] < cutoff), default=0.0)
    rest = None if time_limit_s is None else time_limit_s - (share or 0.0)
    chosen: list[Config] | None = None  # None: the plain MILP over S
    warm: _Single | None = None
    if keep and cutoff and bounds.prices is not None:
        listed, below = configs(cands, cluster, bounds, cutoff)
        if len(listed) <= CONFIG_LIMIT:
            chosen, outside = listed, max(outside, below)
        if chosen and len({cfg.cand for cfg in chosen}) > WARM_TOP:
            warm_set = set(order[:WARM_TOP])
            warm = _solve_configs(
                cands, [cfg for cfg in chosen if cfg.cand in warm_set], cluster, share,
                mip_rel_gap, None, node_limit=HEURISTIC_NODES,
            )  # fmt: skip
            better = warm.plan.throughput_rps * (1 + CUTOFF_SHARE * mip_rel_gap)
            if better > cutoff:  # a better incumbent: screen again at its cutoff
                cutoff = better
                chosen, below = configs(cands, cluster, bounds, cutoff)
                outside = max((u for u in ub if u < cutoff), default=0.0)
                outside = max(outside, below)
        if rest is not None and warm is not None and share is not None:
            rest = max(0.0, rest - share)
    final: _Single | None = None
    if chosen:
        final = _solve_configs(cands, chosen, cluster, rest, mip_rel_gap, cutoff)
    elif keep and chosen is None:
        final = _solve_single([cands[i] for i in keep], cluster, rest, mip_rel_gap, cutoff=cutoff)
    best = first.plan
    for later in (warm, final):
        if later is not None and later.plan.throughput_rps > best.throughput_rps:
            best = later.plan
    if final is None or (final.res.status == 2 and cutoff):
        proved, inside = True, cutoff or 0.0  # no solution over S reaches z'
    else:
        proved = final.res.status == 0
        inside = bounds.bound_rps if final.dual_bound_rps is None else final.dual_bound_rps
        inside = max(inside, cutoff or 0.0)  # solutions over S below z' were cut off
    value = best.throughput_rps
    gap = max(0.0, max(inside, outside) - value) / value if value > 0 else None
    proved = proved or (gap is not None and gap <= mip_rel_gap)
    status = "optimal" if proved else ("time_limit" if final is None else _status(final.res))
    return replace(best, status=status, gap=gap, candidates=len(cands))


def solve(
    profiles: ModelProfiles,
    cluster: Cluster,
    slo_ms: float,
    margin: float = 0.1,
    max_parts: int = 3,
    max_mps: int = 4,
    system: str = "ppipe",
    time_limit_s: float | None = None,
    clock: Callable[[], float] | None = None,
    mip_rel_gap: float = 1e-4,
    *,
    prune: bool = True,
) -> PipelinePlan:
    """`plan_pipelines`, timed: the one place that times, with a clock the caller passes.

    `clock` returns seconds (the command line passes `time.perf_counter`); `solve_s` is the
    difference around candidate enumeration and the MILP, or None without a clock.
    """
    start_s = clock() if clock is not None else None
    plan = plan_pipelines(
        profiles,
        cluster,
        slo_ms,
        margin,
        max_parts,
        max_mps,
        system,
        time_limit_s,
        mip_rel_gap,
        prune=prune,
    )
    if clock is None or start_s is None:
        return plan
    return replace(plan, solve_s=clock() - start_s)

"""Exact LP-bound screening of pipeline candidates before the PPipe MILP (issue 8, speed).

Lagrangian bound. Relax the pool rows (A.2 eq. 23 per partition index, `scheduler.pipeline.milp`)
with prices p_{d,k} >= 0 per physical GPU of type k at partition index d and the cluster rows
with q_k >= 0. For every feasible solution, as w_{c,d} >= ceil(x_c / r_{c,d}) is an integer,

    sum_c x_c <= B0 + sum_c h_c(x_c),   B0 = sum_k q_k N_k + sum_{d,k} max(0, p_{d,k} - q_k) N_k,
    h_c(x) = x - sum_d (p_{d,k_d} / m_d) * ceil(x / r_{c,d})     (h_c(0) = 0).

With g_c = max_{0 <= x <= U_c} h_c(x) >= 0 (U_c: x_c's bound) and B = B0 + sum_c g_c, every
solution is worth at most B, and every solution that uses c (x_c > 0) at most

    UB(c) = B - g_c + max_{0 < x <= U_c} h_c(x).

h_c rises with slope 1 between the points x = j * r_{c,d} (where a ceiling steps up), so both
maxima are taken over those points and U_c: at most sum_d N_{k_d} * m_d points per candidate.
The prices are the duals of the LP relaxation (w and n real; one LP with |C| + P*K columns),
which makes B0 the LP optimum and g_c = 0 up to rounding; the ceilings make UB(c) < B for
candidates whose integer worker counts cannot match their rates.

Screening. Given any feasible solution worth z (an incumbent), no candidate with UB(c) < z is
used by a solution better than z, so the optimum over S = {c : UB(c) >= z} (plus the incumbent's
candidates) is the optimum over all candidates, and the MILP's bound over S, raised to
max_{c not in S} UB(c) (< z), bounds the whole problem. Cost: O(sum_c D_c * points) numpy work.

Configurations. The same argument holds per throughput: every solution that runs c at x_c is
worth at most UB(c, x_c) = B - g_c + h_c(x_c). A solution's x_c may be raised to the smallest
point x >= x_c where a ceiling steps up (or U_c) on the same workers, so some optimum runs every
candidate at such a point with w_{c,d} = ceil(x / r_{c,d}): a configuration (c, x). `configs`
lists the configurations with UB(c, x) >= z; every solution worth z or more is made of them, at
most one per candidate (the configuration MILP of `scheduler.pipeline.milp`).

Several models (`scheduler.pipeline.shares`: maximise t s.t. X_g >= s_g t, X_g = sum_{c of g} x_c;
a physical GPU serves one model). For weights lambda_g >= 0 with sum_g lambda_g s_g = 1, every
solution has t <= sum_g lambda_g X_g. Summing each model's GPU counts per partition index turns
every solution into one of the one-model problem over the union of the models' candidates, so
`candidate_bounds` over the union, with model g's rates scaled by lambda_g (x' = lambda_g x),
bounds t for every solution that uses c: UB(c) < z drops c from the search for t > z (and for the
total at any t >= z). `share_weights` takes lambda from the duals of the share rows of the union's
LP relaxation of max t, the weights that make sum_g lambda_g X_g's LP bound that relaxation's t.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, hstack, vstack

from scheduler.pipeline.candidates import Candidate
from scheduler.pipeline.cluster import Cluster

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
_CEIL_SLACK = 1e-9  # ceil(x / r - slack): may undercount a worker, never overcount (safe side)


@dataclass(frozen=True)
class CandidateBounds:
    """The LP relaxation's value and, per candidate, UB(c) (see module)."""

    lp_rps: float
    bound_rps: float  # B: no solution is worth more
    used_bound_rps: tuple[float, ...]  # UB(c) per candidate, in input order
    prices: Any = None  # p[d, k] / m per candidate partition: [c] -> array (None: no prices)
    best_any_rps: tuple[float, ...] = ()  # g_c per candidate


@dataclass(frozen=True)
class Config:
    """Candidate `cand` (an index) at throughput `x_rps` on `workers` (ceil(x / r) each)."""

    cand: int
    x_rps: float
    workers: tuple[int, ...]
    bound_rps: float  # UB(c, x)


def throughput_cap_rps(cand: Candidate, cluster: Cluster) -> float:
    """U_c: the candidate's throughput with every GPU of its types on its bottleneck."""
    return min(
        rate * cluster.gpus[gpu].count * m
        for rate, gpu, m in zip(cand.rates_rps, cand.gpus, cand.mps, strict=True)
    )


def _relaxation(
    cands: Sequence[Candidate], cluster: Cluster
) -> tuple[Any, FloatArray, list[tuple[float, float]]]:
    """(A, b, bounds) of the rows sum_{c,d at (d,k)} x_c / (r_{c,d} m_{c,d}) <= n_{d,k} and
    sum_d n_{d,k} <= N_k over the columns x_c (input order), then n_{d,k} (d-major)."""
    types = sorted(cluster.gpus)
    parts = max(len(c.gpus) for c in cands)
    n_k = len(types)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for c, cand in enumerate(cands):
        for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True)):
            rows.append(d * n_k + types.index(gpu))
            cols.append(c)
            vals.append(1.0 / (cand.rates_rps[d] * m))
    n_col = len(cands)
    for d in range(parts):
        for k in range(n_k):
            rows += [d * n_k + k, parts * n_k + k]
            cols += [n_col + d * n_k + k] * 2
            vals += [-1.0, 1.0]
    matrix = coo_matrix((vals, (rows, cols)), shape=(parts * n_k + n_k, n_col + parts * n_k))
    counts = [float(cluster.gpus[gpu].count) for gpu in types]
    rhs = np.array([0.0] * (parts * n_k) + counts)
    bounds = [(0.0, throughput_cap_rps(c, cluster)) for c in cands]
    bounds += [(0.0, counts[k]) for _ in range(parts) for k in range(n_k)]
    return matrix.tocsr(), rhs, bounds


def lp_prices(cands: Sequence[Candidate], cluster: Cluster) -> tuple[float, FloatArray, FloatArray]:
    """(LP optimum, p[d, k], q[k]) of the relaxation max sum x_c s.t.
    sum_{c,d at (d,k)} x_c / (r_{c,d} m_{c,d}) <= n_{d,k}, sum_d n_{d,k} <= N_k, bounds."""
    parts, n_k = max(len(c.gpus) for c in cands), len(cluster.gpus)
    matrix, rhs, bounds = _relaxation(cands, cluster)
    objective = np.concatenate([-np.ones(len(cands)), np.zeros(parts * n_k)])
    res = linprog(objective, A_ub=matrix, b_ub=rhs, bounds=bounds, method="highs")
    if res.status != 0:
        return math.inf, np.zeros((parts, n_k)), np.zeros(n_k)
    duals = np.maximum(0.0, -np.asarray(res.ineqlin.marginals, dtype=float))
    return float(-res.fun), duals[: parts * n_k].reshape(parts, n_k), duals[parts * n_k :]


def share_weights(
    groups: Sequence[Sequence[Candidate]], cluster: Cluster, shares: Sequence[float]
) -> FloatArray:
    """lambda_g per model (see module: several models): >= 0, sum_g lambda_g s_g = 1, from the
    union's LP relaxation of max t s.t. X_g >= s_g t; equal weights if that LP fails."""
    union = [cand for cands in groups for cand in cands]
    matrix, rhs, bounds = _relaxation(union, cluster)
    n_col, n_g = matrix.shape[1], len(groups)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    start = 0
    for g, (cands, share) in enumerate(zip(groups, shares, strict=True)):
        rows += [g] * (len(cands) + 1)  # s_g t - X_g <= 0
        cols += [*range(start, start + len(cands)), n_col]
        vals += [-1.0] * len(cands) + [float(share)]
        start += len(cands)
    share_rows = coo_matrix((vals, (rows, cols)), shape=(n_g, n_col + 1))
    objective = np.zeros(n_col + 1)
    objective[n_col] = -1.0
    res = linprog(
        objective,
        A_ub=vstack([hstack([matrix, coo_matrix((matrix.shape[0], 1))]), share_rows]).tocsr(),
        b_ub=np.concatenate([rhs, np.zeros(n_g)]),
        bounds=[*bounds, (0.0, None)],
        method="highs",
    )
    weights = np.ones(n_g)
    if res.status == 0:
        weights = np.maximum(0.0, -np.asarray(res.ineqlin.marginals, dtype=float)[-n_g:])
    total = float(weights @ np.asarray(shares, dtype=float))
    if not total > 0:
        weights, total = np.ones(n_g), float(sum(shares))
    return weights / total


def candidate_bounds(cands: Sequence[Candidate], cluster: Cluster) -> CandidateBounds:
    """B and UB(c) for every candidate (see module); valid for any prices, tight with the LP's.

    Guarantee: every feasible MILP solution is worth at most `bound_rps`, and every one using
    candidate i at most `used_bound_rps[i]`.
    """
    types = sorted(cluster.gpus)
    lp_rps, p, q = lp_prices(cands, cluster)
    if not math.isfinite(lp_rps):
        inf = (math.inf,) * len(cands)
        return CandidateBounds(math.inf, math.inf, inf)
    counts = np.array([float(cluster.gpus[gpu].count) for gpu in types])
    base = float(q @ counts + (np.maximum(0.0, p - q[None, :]) * counts[None, :]).sum())
    best_any = np.zeros(len(cands))
    best_used = np.zeros(len(cands))
    all_prices = []
    for c, cand in enumerate(cands):
        prices = np.array(
            [
                p[d, types.index(gpu)] / m
                for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True))
            ]
        )
        all_prices.append(prices)
        _, _, gain = _points(cand, cluster, prices)
        best_used[c] = float(gain.max())
        best_any[c] = max(0.0, best_used[c])
    bound = base + float(best_any.sum())
    used = tuple(float(v) for v in bound - best_any + best_used)
    return CandidateBounds(lp_rps, bound, used, all_prices, tuple(float(g) for g in best_any))


def _points(
    cand: Candidate, cluster: Cluster, prices: np.ndarray[Any, np.dtype[np.float64]]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(x, workers, h_c(x)) at the points where a ceiling of c steps up, and at U_c."""
    rates = np.array(cand.rates_rps)
    cap = throughput_cap_rps(cand, cluster)
    points = [rate * np.arange(1, math.floor(cap / rate * (1 + 1e-12)) + 1) for rate in rates]
    xs = np.unique(np.concatenate([*points, [cap]]))
    xs = xs[(xs > 0) & (xs <= cap)]
    workers = np.maximum(np.ceil(xs[:, None] / rates[None, :] - _CEIL_SLACK), 1.0)
    gain = xs - (workers * prices[None, :]).sum(axis=1)
    return xs, workers, gain


def configs(
    cands: Sequence[Candidate], cluster: Cluster, bounds: CandidateBounds, threshold_rps: float
) -> tuple[list[Config], float]:
    """The configurations (c, x) with UB(c, x) >= threshold_rps (see module), and the largest
    UB(c, x) below it (0.0 if none): every solution using a configuration not listed is worth
    at most that. `bounds` must come from `candidate_bounds` on the same `cands`."""
    out: list[Config] = []
    below = 0.0
    if bounds.prices is None:
        raise ValueError("configs needs the bounds' prices")
    for c, cand in enumerate(cands):
        xs, workers, gain = _points(cand, cluster, bounds.prices[c])
        ub = bounds.bound_rps - bounds.best_any_rps[c] + gain
        keep = ub >= threshold_rps
        if (~keep).any():
            below = max(below, float(ub[~keep].max()))
        for i in np.flatnonzero(keep):
            wk = tuple(int(w) for w in workers[i])
            out.append(Config(c, float(xs[i]), wk, float(ub[i])))
    return out, below

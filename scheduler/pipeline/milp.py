"""PPipe control plane: the pool-based pipeline MILP with batch-size unification.

Paper 004, section 5.1-5.3 and Appendix A.1/A.2, as issue 8 states it. Formulation solved here:

Candidates. A pooled pipeline is a tuple of GPU types (k_0, ..., k_{D-1}), 1 <= D <= P; its
partitions cover blocks [0, N) in order with cuts 0 = c_0 < c_1 < ... < c_D = N; partition d
runs blocks [c_d, c_{d+1}) on virtual GPUs of type k_d at MPS level m_d; all partitions use one
batch size b (unification, A.2 eq. 18). Every such tuple (types, cuts, levels, b) that meets

    sum_d C_d(b) + sum_{d<D-1} b * Y(c_{d+1}) + 1.3 * (b - 1) / X + margin * SLO <= SLO      (L)

is a candidate c (A.2 eq. 27 with the issue's batching delay). C_d(b) is the sum of the
partition's block latencies on a 1/m_d virtual GPU; Y(j) = bytes(cut j) * 8 / NIC bit rate per
sample (the model's own input and output cross no NIC); X, the estimated throughput, is
sum_k count_k * b_k / T_k(b_k) with b_k the largest batch whose whole-model latency T_k (MPS 1)
plus margin * SLO fits the SLO (types where none fits add 0; b = 1 has no batching delay).
A worker's rate r_{c,d} = min(b / C_d(b), B / (8 * in_bytes), B / (8 * out_bytes)) where
B = NIC bit rate / (GPUs per server * m_d) is its share of its server's NIC (full duplex).

MILP (scipy.optimize.milp, HiGHS). Variables: x_c >= 0 real (pipeline throughput, rps),
w_{c,d} >= 0 integer (workers = virtual GPUs), n_{d,k} >= 0 integer (physical GPUs of type k
at partition index d).

    maximise   sum_c x_c                                          (A.2 eq. 15)
    s.t.       x_c <= r_{c,d} * w_{c,d}               for all c, d (eq. 25, 28)
               sum_{c, d: k_d = k} w_{c,d} / m_{c,d} <= n_{d,k}  for all d, k (eq. 23)
               sum_d n_{d,k} <= N_k                   for all k

Exact pruning: among candidates with the same types and cuts, j is dropped when some i has, per
partition, a level m_i that is a multiple of m_j and a rate per physical GPU m_i * r_i >= m_j * r_j
(j's workers move to i on the same GPUs at no lower rate; mutual ties keep the first, i.e. the
lower levels and smaller batch). Size: sum_{D<=P} K^D * C(N-1, D-1) * M^D * B candidates
before pruning (K types, M levels, B batch sizes), each with D integer worker variables; the NP
baseline is the same MILP with P = 1 and M = {1}.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from scheduler.errors import InputError
from scheduler.pipeline.profiles import ModelProfiles

BATCHING_DELAY_FACTOR = 1.3
SYSTEMS = ("ppipe", "np")
_EPS = 1e-9
_STATUS = {0: "optimal", 1: "time_limit", 2: "infeasible", 3: "unbounded"}


@dataclass(frozen=True)
class GpuPool:
    """`count` GPUs of one type, `per_server` of them behind one NIC."""

    count: int
    per_server: int


@dataclass(frozen=True)
class Cluster:
    """GPU pools by type and the NIC bit rate of every server, Gbit/s."""

    gpus: Mapping[str, GpuPool]
    nic_gbps: float

    @staticmethod
    def from_json(doc: object, source: str = "cluster") -> Cluster:
        """Parse `{"gpus": {"L4": {"count": 25, "per_server": 4}}, "nic_gbps": 10}`.

        Raises InputError naming the field for anything else.
        """
        if not isinstance(doc, dict):
            raise InputError(source, "", "a JSON object with gpus and nic_gbps", doc)
        gpus_doc = doc.get("gpus")
        if not isinstance(gpus_doc, dict) or not gpus_doc:
            raise InputError(
                source, "gpus", "an object of GPU type -> {count, per_server}", gpus_doc
            )
        pools = {}
        for name, pool in sorted(gpus_doc.items()):
            if not isinstance(pool, dict):
                raise InputError(
                    source, f"gpus.{name}", "an object with count and per_server", pool
                )
            count, per_server = pool.get("count"), pool.get("per_server", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise InputError(source, f"gpus.{name}.count", "a non-negative integer", count)
            if not isinstance(per_server, int) or isinstance(per_server, bool) or per_server < 1:
                raise InputError(
                    source, f"gpus.{name}.per_server", "a positive integer", per_server
                )
            pools[str(name)] = GpuPool(count=count, per_server=per_server)
        nic = doc.get("nic_gbps")
        if not isinstance(nic, int | float) or isinstance(nic, bool) or not nic > 0:
            raise InputError(source, "nic_gbps", "a positive number of Gbit/s", nic)
        return Cluster(gpus=pools, nic_gbps=float(nic))


@dataclass(frozen=True)
class Partition:
    """Blocks [start, stop) on `workers` virtual GPUs of type `gpu` at MPS level `mps`."""

    blocks: tuple[int, int]
    gpu: str
    mps: int
    workers: int
    latency_ms: float
    worker_rate_rps: float

    @property
    def gpus_used(self) -> float:
        """Physical GPUs this partition occupies: workers / mps."""
        return self.workers / self.mps


@dataclass(frozen=True)
class Pipeline:
    """One pooled pipeline of the plan. `latency_ms` is (L)'s left side without the margin."""

    gpus: tuple[str, ...]
    batch: int
    throughput_rps: float
    latency_ms: float
    partitions: tuple[Partition, ...]


@dataclass(frozen=True)
class PipelinePlan:
    """The MILP's answer. `solve_s` is None unless `solve` was given a clock."""

    throughput_rps: float
    status: str
    gap: float | None
    solve_s: float | None
    pipelines: tuple[Pipeline, ...]
    candidates: int

    def to_json(self) -> dict[str, Any]:
        """The issue-8 plan document (keys exactly as the issue names them)."""
        return {
            "throughput_rps": self.throughput_rps,
            "status": self.status,
            "gap": self.gap,
            "solve_s": self.solve_s,
            "pipelines": [
                {
                    "gpus": list(p.gpus),
                    "batch": p.batch,
                    "throughput_rps": p.throughput_rps,
                    "latency_ms": p.latency_ms,
                    "partitions": [
                        {
                            "blocks": list(q.blocks),
                            "gpu": q.gpu,
                            "mps": q.mps,
                            "workers": q.workers,
                            "gpus_used": q.gpus_used,
                        }
                        for q in p.partitions
                    ],
                }
                for p in self.pipelines
            ],
        }


@dataclass(frozen=True)
class Candidate:
    """A pipeline configuration that meets (L): per-partition latency and per-worker rate."""

    gpus: tuple[str, ...]
    bounds: tuple[int, ...]
    mps: tuple[int, ...]
    batch: int
    latency_ms: float
    partition_ms: tuple[float, ...]
    rates_rps: tuple[float, ...]


def _check(profiles: ModelProfiles, cluster: Cluster, slo_ms: float, margin: float) -> None:
    if not slo_ms > 0 or not math.isfinite(slo_ms):
        raise InputError("plan", "slo_ms", "a positive number of milliseconds", slo_ms)
    if not 0 <= margin < 1:
        raise InputError("plan", "margin", "a fraction of the SLO in [0, 1)", margin)
    for gpu in cluster.gpus:
        profiles.require_gpu(gpu)


def estimated_throughput_rps(
    profiles: ModelProfiles, cluster: Cluster, slo_ms: float, margin: float
) -> float:
    """X of (L): sum over types of count * b / T(b), b the largest batch fitting SLO - margin."""
    total = 0.0
    budget_ms = slo_ms * (1 - margin)
    for gpu, pool in sorted(cluster.gpus.items()):
        if (gpu, 1) not in profiles.latency_us or pool.count == 0:
            continue
        best = 0.0
        for batch in range(1, profiles.max_batch(gpu, 1) + 1):
            whole_ms = profiles.partition_latency_ms(gpu, 1, 0, profiles.num_blocks, batch)
            if whole_ms <= budget_ms + _EPS:
                best = batch / (whole_ms / 1000.0)
        total += pool.count * best
    return total


def _levels(profiles: ModelProfiles, gpu: str, max_mps: int) -> tuple[int, ...]:
    return tuple(m for m in profiles.mps_levels(gpu) if m <= max_mps)


def _shapes(
    profiles: ModelProfiles, cluster: Cluster, max_parts: int, max_mps: int
) -> list[tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]]:
    """All (types, bounds, levels) in a fixed order; types with no GPUs are left out."""
    types = [g for g in sorted(cluster.gpus) if cluster.gpus[g].count > 0]
    shapes = []
    n = profiles.num_blocks
    for parts in range(1, min(max_parts, n) + 1):
        for gpus in itertools.product(types, repeat=parts):
            level_sets = [_levels(profiles, g, max_mps) for g in gpus]
            for cuts in itertools.combinations(range(1, n), parts - 1):
                bounds = (0, *cuts, n)
                for levels in itertools.product(*level_sets):
                    shapes.append((gpus, bounds, tuple(levels)))
    return shapes


def _transfer_ms(profiles: ModelProfiles, cluster: Cluster, bounds: tuple[int, ...]) -> float:
    """Per-sample transfer time of all inner cuts, ms."""
    bits = sum(profiles.cut_bytes[j - 1] * 8 for j in bounds[1:-1])
    return bits / (cluster.nic_gbps * 1e9) * 1000.0


def enumerate_candidates(
    profiles: ModelProfiles,
    cluster: Cluster,
    slo_ms: float,
    margin: float,
    max_parts: int = 3,
    max_mps: int = 4,
) -> list[Candidate]:
    """Every non-dominated candidate meeting (L), in a deterministic order."""
    _check(profiles, cluster, slo_ms, margin)
    x_rps = estimated_throughput_rps(profiles, cluster, slo_ms, margin)
    budget_ms = slo_ms * (1 - margin)
    nic_bps = cluster.nic_gbps * 1e9
    out: list[Candidate] = []
    group: list[Candidate] = []
    group_key: tuple[tuple[str, ...], tuple[int, ...]] | None = None
    for gpus, bounds, levels in _shapes(profiles, cluster, max_parts, max_mps):
        if (gpus, bounds) != group_key:
            out.extend(_undominated(group))
            group, group_key = [], (gpus, bounds)
        transfer_ms = _transfer_ms(profiles, cluster, bounds)
        max_batch = min(profiles.max_batch(g, m) for g, m in zip(gpus, levels, strict=True))
        for batch in range(1, max_batch + 1):
            delay_ms = 0.0
            if batch > 1:
                if x_rps <= 0:
                    break
                delay_ms = BATCHING_DELAY_FACTOR * (batch - 1) / x_rps * 1000.0
            part_ms = tuple(
                profiles.partition_latency_ms(g, m, bounds[d], bounds[d + 1], batch)
                for d, (g, m) in enumerate(zip(gpus, levels, strict=True))
            )
            latency_ms = sum(part_ms) + batch * transfer_ms + delay_ms
            if latency_ms > budget_ms + _EPS:
                continue
            rates = []
            for d, (g, m) in enumerate(zip(gpus, levels, strict=True)):
                rate = batch / (part_ms[d] / 1000.0)
                share_bps = nic_bps / (cluster.gpus[g].per_server * m)
                for j in (bounds[d], bounds[d + 1]):
                    if 0 < j < profiles.num_blocks and profiles.cut_bytes[j - 1] > 0:
                        rate = min(rate, share_bps / (8 * profiles.cut_bytes[j - 1]))
                rates.append(rate)
            group.append(Candidate(gpus, bounds, levels, batch, latency_ms, part_ms, tuple(rates)))
    out.extend(_undominated(group))
    return out


def _undominated(group: list[Candidate]) -> list[Candidate]:
    """Drop candidates another one of the same types and cuts dominates (exact, see module).

    i dominates j when, per partition, m_i is a multiple of m_j and m_i * r_i >= m_j * r_j:
    j's w workers become w * m_i / m_j workers of i on the same physical GPUs, at no lower
    rate. Of candidates dominating each other (equal levels and rates) the first is kept.
    """
    if len(group) < 2:
        return group
    levels = np.array([cand.mps for cand in group])
    per_gpu = np.array([cand.rates_rps for cand in group]) * levels
    divides = (levels[:, None, :] % levels[None, :, :] == 0).all(axis=2)
    better = (per_gpu[:, None, :] >= per_gpu[None, :, :]).all(axis=2)
    dom = divides & better  # dom[i, j]: i dominates j
    np.fill_diagonal(dom, False)
    first = np.tri(len(group), k=-1, dtype=bool)  # first[j, i]: i comes before j
    removed = (dom.T & (~dom | first)).any(axis=1)
    return [cand for cand, gone in zip(group, removed, strict=True) if not gone]


def smallest_workable_slo_ms(
    profiles: ModelProfiles, cluster: Cluster, margin: float, max_parts: int = 3, max_mps: int = 4
) -> float | None:
    """The smallest SLO at which some pipeline meets (L) at batch 1 (None: no GPUs at all).

    Batch 1 has no batching delay, so this is min over shapes of (inference + transfer) /
    (1 - margin); with latencies that grow with the batch size no SLO below it is workable.
    """
    best: float | None = None
    for gpus, bounds, levels in _shapes(profiles, cluster, max_parts, max_mps):
        base_ms = _transfer_ms(profiles, cluster, bounds) + sum(
            profiles.partition_latency_ms(g, m, bounds[d], bounds[d + 1], 1)
            for d, (g, m) in enumerate(zip(gpus, levels, strict=True))
        )
        slo = base_ms / (1 - margin)
        best = slo if best is None else min(best, slo)
    return best


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
) -> PipelinePlan:
    """Solve the MILP for one model (pure: no clock; `solve_s` is None).

    `system` "np" is the NP baseline (one partition, MPS level 1). Guarantees: the plan's
    pipelines meet (L), use at most the cluster's GPUs (per type, summed over partition
    indices of the integer counts n_{d,k}), and with status "optimal" their total throughput is
    the MILP optimum within HiGHS's relative gap (reported as `gap`). Raises InputError for a bad
    SLO, margin, P, MPS limit, system, a cluster GPU type without profiles, or an SLO no pipeline
    meets (naming the smallest workable SLO).
    """
    if system not in SYSTEMS:
        raise InputError("plan", "system", f"one of {', '.join(SYSTEMS)}", system)
    if not isinstance(max_parts, int) or max_parts < 1:
        raise InputError("plan", "max_parts", "a positive integer", max_parts)
    if not isinstance(max_mps, int) or max_mps < 1:
        raise InputError("plan", "mps", "a positive integer", max_mps)
    if system == "np":
        max_parts, max_mps = 1, 1
    cands = enumerate_candidates(profiles, cluster, slo_ms, margin, max_parts, max_mps)
    if not cands:
        smallest = smallest_workable_slo_ms(profiles, cluster, margin, max_parts, max_mps)
        expected = (
            "an SLO some pipeline can meet, but no pipeline fits any SLO on this cluster"
            if smallest is None
            else f"an SLO of at least {smallest:.3f} ms (the smallest any {system} pipeline meets)"
        )
        raise InputError("plan", "slo_ms", expected, slo_ms)
    return _solve_milp(cands, cluster, max_parts, time_limit_s, mip_rel_gap)


def _upper_bounds(
    cands: list[Candidate],
    cluster: Cluster,
    types: list[str],
    w_index: list[list[int]],
    n_vars: int,
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Implied bounds: w <= N_k * m, x_c <= min_d r_d * N_k * m, n_{d,k} <= N_k."""
    upper = np.empty(n_vars)
    for c, cand in enumerate(cands):
        caps = []
        for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True)):
            upper[w_index[c][d]] = cluster.gpus[gpu].count * m
            caps.append(cand.rates_rps[d] * cluster.gpus[gpu].count * m)
        upper[c] = min(caps)
    start = len(cands) + sum(len(w) for w in w_index)
    for i in range(start, n_vars):
        upper[i] = cluster.gpus[types[(i - start) % len(types)]].count
    return upper


def _solve_milp(
    cands: list[Candidate],
    cluster: Cluster,
    max_parts: int,
    time_limit_s: float | None,
    mip_rel_gap: float,
) -> PipelinePlan:
    types = sorted(cluster.gpus)
    n_cands = len(cands)
    w_index: list[list[int]] = []
    next_var = n_cands
    for cand in cands:
        w_index.append(list(range(next_var, next_var + len(cand.gpus))))
        next_var += len(cand.gpus)
    n_base = next_var
    n_vars = n_base + max_parts * len(types)

    def n_var(d: int, gpu: str) -> int:
        return n_base + d * len(types) + types.index(gpu)

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    upper: list[float] = []
    row = 0
    for c, cand in enumerate(cands):  # x_c - r * w <= 0
        for d, rate in enumerate(cand.rates_rps):
            rows += [row, row]
            cols += [c, w_index[c][d]]
            vals += [1.0, -rate]
            upper.append(0.0)
            row += 1
    usage_rows: dict[tuple[int, str], int] = {}
    for d in range(max_parts):  # sum w / m - n_{d,k} <= 0
        for gpu in types:
            usage_rows[(d, gpu)] = row
            rows.append(row)
            cols.append(n_var(d, gpu))
            vals.append(-1.0)
            upper.append(0.0)
            row += 1
    for c, cand in enumerate(cands):
        for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True)):
            rows.append(usage_rows[(d, gpu)])
            cols.append(w_index[c][d])
            vals.append(1.0 / m)
    for gpu in types:  # sum_d n_{d,k} <= N_k
        for d in range(max_parts):
            rows.append(row)
            cols.append(n_var(d, gpu))
            vals.append(1.0)
        upper.append(float(cluster.gpus[gpu].count))
        row += 1
    matrix = coo_matrix((vals, (rows, cols)), shape=(row, n_vars)).tocsr()
    objective = np.zeros(n_vars)
    objective[:n_cands] = -1.0
    integrality = np.ones(n_vars)
    integrality[:n_cands] = 0
    options: dict[str, Any] = {"disp": False, "mip_rel_gap": mip_rel_gap}
    if time_limit_s is not None:
        options["time_limit"] = time_limit_s
    res = milp(
        objective,
        constraints=LinearConstraint(matrix, -np.inf, np.array(upper)),
        integrality=integrality,
        bounds=Bounds(np.zeros(n_vars), _upper_bounds(cands, cluster, types, w_index, n_vars)),
        options=options,
    )
    status = _STATUS.get(int(res.status), "error")
    gap = getattr(res, "mip_gap", None)
    gap_value = None if gap is None else float(gap)
    if res.x is None:
        return PipelinePlan(0.0, status, gap_value, None, (), n_cands)
    pipelines = []
    for c, cand in enumerate(cands):
        x_rps = float(res.x[c])
        if x_rps <= 1e-6:
            continue
        parts = tuple(
            Partition(
                blocks=(cand.bounds[d], cand.bounds[d + 1]),
                gpu=gpu,
                mps=m,
                workers=math.ceil(x_rps / cand.rates_rps[d] - 1e-7),
                latency_ms=cand.partition_ms[d],
                worker_rate_rps=cand.rates_rps[d],
            )
            for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True))
        )
        pipelines.append(Pipeline(cand.gpus, cand.batch, x_rps, cand.latency_ms, parts))
    total = sum(p.throughput_rps for p in pipelines)
    return PipelinePlan(total, status, gap_value, None, tuple(pipelines), n_cands)


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
) -> PipelinePlan:
    """`plan_pipelines`, timed: the one place that times, with a clock the caller passes.

    `clock` returns seconds (the command line passes `time.perf_counter`); `solve_s` is the
    difference around candidate enumeration and the MILP, or None without a clock.
    """
    start_s = clock() if clock is not None else None
    plan = plan_pipelines(
        profiles, cluster, slo_ms, margin, max_parts, max_mps, system, time_limit_s
    )
    if clock is None or start_s is None:
        return plan
    return replace(plan, solve_s=clock() - start_s)

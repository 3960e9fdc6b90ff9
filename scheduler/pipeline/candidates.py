"""Pipeline candidates of the PPipe MILP: every configuration that meets the latency SLO (L).

Paper 004, sections 5.2-5.3 and Appendix A.2, as issue 8 states it. A pooled pipeline is a
tuple of GPU types (k_0, ..., k_{D-1}), 1 <= D <= P; its partitions cover blocks [0, N) in
order with cuts 0 = c_0 < c_1 < ... < c_D = N; partition d runs blocks [c_d, c_{d+1}) on
virtual GPUs of type k_d at MPS level m_d; all partitions use one batch size b (unification,
A.2 eq. 18). Every such tuple (types, cuts, levels, b) that meets

    sum_d C_d(b) + sum_{d<D-1} b * Y(c_{d+1}) + 1.3 * (b - 1) / X + margin * SLO <= SLO      (L)

is a candidate (A.2 eq. 27 with the issue's batching delay). C_d(b) is the sum of the
partition's block latencies on a 1/m_d virtual GPU (5.1); Y(j) = bytes(cut j) * 8 / NIC bit
rate per sample (the model's own input and output cross no NIC); X, the estimated throughput, is
sum_k count_k * b_k / T_k(b_k) with b_k the largest batch whose whole-model latency T_k (MPS 1)
plus margin * SLO fits the SLO (types where none fits add 0; b = 1 has no batching delay).
A worker's rate r_d = min(b / C_d(b), B / (8 * in_bytes), B / (8 * out_bytes)) where
B = NIC bit rate / (GPUs per server * m_d) is its share of its server's NIC (full duplex).

Exact pruning (the MILP optimum is unchanged). Candidate i dominates j when D_i <= D_j, i's
types are the first D_i of j's, and for every d < D_i the level m_{i,d} is a multiple of m_{j,d}
and the rate per physical GPU m_{i,d} * r_{i,d} >= m_{j,d} * r_{j,d}: any solution using j
moves j's w_{j,d} workers to w_{j,d} * m_{i,d} / m_{j,d} workers of i on the same physical GPUs
at the same partition indices (and frees j's partitions d >= D_i) at no lower throughput.
Domination is transitive, so dropping every dominated candidate keeps an optimum; of candidates
that dominate each other (equal types, levels and per-GPU rates) the first in enumeration order
is kept. It runs in two passes: within each (types, cuts) group, then across the cuts of each
types tuple and against the candidates of its proper prefixes.

Size: sum_{D<=P} K^D * C(N-1, D-1) * M^D * B candidates before (L) and pruning (K types,
M levels, B batch sizes); enumeration is linear in that, pruning quadratic per group.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.errors import InputError
from scheduler.pipeline.cluster import Cluster
from scheduler.pipeline.profiles import ModelProfiles

BATCHING_DELAY_FACTOR = 1.3
EPS = 1e-9

Shape = tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]  # (types, bounds, levels)


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


def check_inputs(profiles: ModelProfiles, cluster: Cluster, slo_ms: float, margin: float) -> None:
    """Raise InputError for a bad SLO or margin, or a cluster GPU type without profiles."""
    if not slo_ms > 0 or not math.isfinite(slo_ms):
        raise InputError("plan", "slo_ms", "a positive number of milliseconds", slo_ms)
    if not 0 <= margin < 1:
        raise InputError("plan", "margin", "a fraction of the SLO in [0, 1)", margin)
    for gpu in cluster.gpus:
        profiles.require_gpu(gpu, cluster.source)


def whole_model_rate_rps(
    profiles: ModelProfiles, gpu: str, slo_ms: float, margin: float
) -> tuple[int, float]:
    """(b, b / T(b)) for the largest batch b whose whole-model latency on one `gpu` at MPS 1
    fits SLO - margin * SLO; (0, 0.0) when not even batch 1 fits or MPS 1 is not profiled."""
    if (gpu, 1) not in profiles.latency_us:
        return 0, 0.0
    budget_ms = slo_ms * (1 - margin)
    best = (0, 0.0)
    for batch in range(1, profiles.max_batch(gpu, 1) + 1):
        whole_ms = profiles.partition_latency_ms(gpu, 1, 0, profiles.num_blocks, batch)
        if whole_ms <= budget_ms + EPS:
            best = (batch, batch / (whole_ms / 1000.0))
    return best


def estimated_throughput_rps(
    profiles: ModelProfiles, cluster: Cluster, slo_ms: float, margin: float
) -> float:
    """X of (L): sum over types of count * b / T(b), b the largest batch fitting SLO - margin."""
    return sum(
        pool.count * whole_model_rate_rps(profiles, gpu, slo_ms, margin)[1]
        for gpu, pool in sorted(cluster.gpus.items())
        if pool.count > 0
    )


def _levels(profiles: ModelProfiles, gpu: str, max_mps: int) -> tuple[int, ...]:
    return tuple(m for m in profiles.mps_levels(gpu) if m <= max_mps)


def shapes(
    profiles: ModelProfiles,
    cluster: Cluster,
    max_parts: int,
    max_mps: int,
    types: Sequence[str] | None = None,
) -> list[Shape]:
    """All (types, bounds, levels) in a fixed order over `types` (default: the cluster's types
    with GPUs); grouped by (types, bounds)."""
    use = list(types) if types is not None else cluster.types_in_use()
    n = profiles.num_blocks
    _check_shape_count(n, sum(len(_levels(profiles, g, max_mps)) for g in use), max_parts)
    out = []
    for parts in range(1, min(max_parts, n) + 1):
        for gpus in itertools.product(use, repeat=parts):
            level_sets = [_levels(profiles, g, max_mps) for g in gpus]
            for cuts in itertools.combinations(range(1, n), parts - 1):
                bounds = (0, *cuts, n)
                for levels in itertools.product(*level_sets):
                    out.append((gpus, bounds, tuple(levels)))
    return out


MAX_SHAPES = 10**6  # pipeline shapes one plan may enumerate


def _check_shape_count(blocks: int, options: int, max_parts: int) -> None:
    """Refuse a partition limit whose shapes (block cuts x a GPU type and MPS level per
    partition, `options` of those) pass MAX_SHAPES, naming the largest limit that fits: on 2
    GPU types at 4 MPS levels, P = 4 takes 10 s and 0.6 GB, P = 5 past 6 GB and minutes."""
    total, fits = 0, 0
    for parts in range(1, min(max_parts, blocks) + 1):
        total += math.comb(blocks - 1, parts - 1) * options**parts
        if total > MAX_SHAPES:
            expected = (
                f"at most {fits} partitions here: {parts} make over {MAX_SHAPES} pipeline shapes "
                f"of {blocks} blocks on {options} GPU type and MPS level pairs"
            )
            raise InputError("plan", "max_parts", expected, max_parts)
        fits = parts


def transfer_ms(profiles: ModelProfiles, cluster: Cluster, bounds: tuple[int, ...]) -> float:
    """Per-sample transfer time of all inner cuts, ms."""
    bits = sum(profiles.cut_bytes[j - 1] * 8 for j in bounds[1:-1])
    return bits / (cluster.nic_gbps * 1e9) * 1000.0


def shape_candidates(
    profiles: ModelProfiles,
    cluster: Cluster,
    shape: Shape,
    slo_ms: float,
    margin: float,
    x_rps: float,
) -> list[Candidate]:
    """The candidates of one shape: one per batch size that meets (L), ascending."""
    gpus, bounds, levels = shape
    budget_ms = slo_ms * (1 - margin)
    nic_bps = cluster.nic_gbps * 1e9
    per_sample_ms = transfer_ms(profiles, cluster, bounds)
    max_batch = min(profiles.max_batch(g, m) for g, m in zip(gpus, levels, strict=True))
    out = []
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
        latency_ms = sum(part_ms) + batch * per_sample_ms + delay_ms
        if latency_ms > budget_ms + EPS:
            continue
        rates = []
        for d, (g, m) in enumerate(zip(gpus, levels, strict=True)):
            rate = batch / (part_ms[d] / 1000.0)
            share_bps = nic_bps / (cluster.gpus[g].per_server * m)
            for j in (bounds[d], bounds[d + 1]):
                if 0 < j < profiles.num_blocks and profiles.cut_bytes[j - 1] > 0:
                    rate = min(rate, share_bps / (8 * profiles.cut_bytes[j - 1]))
            rates.append(rate)
        out.append(Candidate(gpus, bounds, levels, batch, latency_ms, part_ms, tuple(rates)))
    return out


def enumerate_candidates(
    profiles: ModelProfiles,
    cluster: Cluster,
    slo_ms: float,
    margin: float,
    max_parts: int = 3,
    max_mps: int = 4,
    *,
    prune: bool = True,
) -> list[Candidate]:
    """Every candidate meeting (L) (without `prune`), or only the undominated ones (see the
    module docstring), in enumeration order: by partition count, types, cuts, levels, batch."""
    check_inputs(profiles, cluster, slo_ms, margin)
    x_rps = estimated_throughput_rps(profiles, cluster, slo_ms, margin)
    by_types: dict[tuple[str, ...], list[Candidate]] = {}
    group: list[Candidate] = []
    group_key: tuple[tuple[str, ...], tuple[int, ...]] | None = None

    def close_group() -> None:
        if group_key is not None and group:
            kept = undominated(group) if prune else group
            by_types.setdefault(group_key[0], []).extend(kept)

    for shape in shapes(profiles, cluster, max_parts, max_mps):
        if (shape[0], shape[1]) != group_key:
            close_group()
            group, group_key = [], (shape[0], shape[1])
        group.extend(shape_candidates(profiles, cluster, shape, slo_ms, margin, x_rps))
    close_group()
    if not prune:
        return [c for cands in by_types.values() for c in cands]
    kept: dict[tuple[str, ...], list[Candidate]] = {}
    for types, cands in by_types.items():  # insertion order: shorter tuples first
        prefixes = [c for d in range(1, len(types)) for c in kept.get(types[:d], [])]
        kept[types] = undominated(cands, prefixes)
    return [c for cands in kept.values() for c in cands]


def _dominates(
    levels_i: np.ndarray, per_gpu_i: np.ndarray, levels_j: np.ndarray, per_gpu_j: np.ndarray
) -> np.ndarray:
    """dom[a, b]: row a of i dominates row b of j on the first columns of i (see module)."""
    depth = levels_i.shape[1]
    lj, rj = levels_j[:, :depth], per_gpu_j[:, :depth]
    divides = (levels_i[:, None, :] % lj[None, :, :] == 0).all(axis=2)
    better = (per_gpu_i[:, None, :] >= rj[None, :, :]).all(axis=2)
    result: np.ndarray = divides & better
    return result


def undominated(group: list[Candidate], prefixes: Sequence[Candidate] = ()) -> list[Candidate]:
    """Drop the candidates of `group` (one types tuple) that another one of the group, or one
    of `prefixes` (candidates whose types are a proper prefix of the group's), dominates.

    Of group members dominating each other (equal levels and per-GPU rates) the first is kept.
    """
    if not group:
        return group
    levels = np.array([cand.mps for cand in group])
    per_gpu = np.array([cand.rates_rps for cand in group]) * levels
    removed = np.zeros(len(group), dtype=bool)
    if len(group) > 1:
        dom = _dominates(levels, per_gpu, levels, per_gpu)  # dom[i, j]: i dominates j
        np.fill_diagonal(dom, False)
        first = np.tri(len(group), k=-1, dtype=bool)  # first[j, i]: i comes before j
        removed |= (dom.T & (~dom | first)).any(axis=1)
    by_depth: dict[int, list[Candidate]] = {}
    for cand in prefixes:
        by_depth.setdefault(len(cand.gpus), []).append(cand)
    for depth_cands in by_depth.values():
        p_levels = np.array([cand.mps for cand in depth_cands])
        p_per_gpu = np.array([cand.rates_rps for cand in depth_cands]) * p_levels
        removed |= _dominates(p_levels, p_per_gpu, levels, per_gpu).any(axis=0)
    return [cand for cand, gone in zip(group, removed, strict=True) if not gone]


def smallest_workable_slo_ms(
    profiles: ModelProfiles, cluster: Cluster, margin: float, max_parts: int = 3, max_mps: int = 4
) -> float | None:
    """The smallest SLO at which some pipeline meets (L) at batch 1 (None: no GPUs at all).

    Batch 1 has no batching delay, so this is min over shapes of (inference + transfer) /
    (1 - margin); with latencies that grow with the batch size no SLO below it is workable.
    """
    best: float | None = None
    for gpus, bounds, levels in shapes(profiles, cluster, max_parts, max_mps):
        base_ms = transfer_ms(profiles, cluster, bounds) + sum(
            profiles.partition_latency_ms(g, m, bounds[d], bounds[d + 1], 1)
            for d, (g, m) in enumerate(zip(gpus, levels, strict=True))
        )
        slo = base_ms / (1 - margin)
        best = slo if best is None else min(best, slo)
    return best

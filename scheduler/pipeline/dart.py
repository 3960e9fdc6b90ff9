"""DART-r, the chain-pipeline baseline of PPipe (paper 004, section 7.1 "Baselines").

"DART-r replicates DART configurations for pairs of low- and high-class GPUs; if one GPU class
has more GPUs than the other, the leftover GPUs are allocated to individually run entire DNNs
without partitioning." Formulation solved here, for a cluster of two GPU types (one type: every
GPU is a leftover):

Classes. The high class h is the type with the smaller whole-model latency at batch 1 on a whole
GPU (MPS 1; ties: the first name), the low class l the other. There are p = min(N_h, N_l)
pairs and N_left = |N_h - N_l| leftover GPUs of the more numerous class.

Pair. A DART configuration is a 2-partition chain over one GPU of each class, one worker each
(MPS 1): order (h, l) or (l, h), a cut 0 < c < N and one batch b, meeting PPipe's latency
constraint (L) (same C_d(b), transfer, batching delay with the same X, and margin; see
`scheduler.pipeline.candidates`). Its rate is R = min(r_0, r_1), each r_d the worker's rate
with its NIC share. All pairs replicate the configuration of the largest R.

Leftovers. Each runs the whole model on one GPU at the batch that meets (L) with the largest
rate R_left = b / T(b) (the NP candidate of that type).

    throughput = p * max_{order, c, b meeting (L)} R  +  N_left * max_{b meeting (L)} R_left

Solved directly, not as an MILP: pairs are identical and one worker per partition is fixed, so
the optimum is the best single chain replicated (p * the best R); a restricted MILP would let
partitions take different worker counts, which DART does not. Exhaustive over
2 * (N - 1) * B chains and B whole-model batches. If no chain meets (L) there is no DART
configuration and every GPU runs the whole model (as leftovers of its own type). Every pipeline
DART-r builds is a candidate of the PPipe MILP with P >= 2 and MPS 1 allowed, at a GPU count per
(partition index, type) within the cluster, so DART-r <= PPipe.
"""

from __future__ import annotations

from scheduler.errors import InputError
from scheduler.pipeline.candidates import (
    Candidate,
    check_inputs,
    estimated_throughput_rps,
    shape_candidates,
)
from scheduler.pipeline.cluster import Cluster
from scheduler.pipeline.plan import Pipeline, PipelinePlan, pipeline_of
from scheduler.pipeline.profiles import ModelProfiles


def gpu_classes(profiles: ModelProfiles, cluster: Cluster) -> tuple[str, str | None]:
    """(high, low) class of the cluster's GPU types with GPUs; low is None for one type.

    Raises InputError for more than two types or a type without MPS-1 profiles.
    """
    types = cluster.types_in_use()
    if len(types) > 2:
        raise InputError(
            "plan", "system", "dart-r on a cluster of at most two GPU types (high and low class)",
            types,
        )  # fmt: skip
    for gpu in types:
        if (gpu, 1) not in profiles.latency_us:
            raise InputError(profiles.model, "gpu", f"MPS-1 block profiles on {gpu} for dart-r")
    ranked = sorted(
        types, key=lambda g: (profiles.partition_latency_ms(g, 1, 0, profiles.num_blocks, 1), g)
    )
    if not ranked:
        raise InputError("plan", "gpus", "at least one GPU for dart-r", dict(cluster.gpus))
    return ranked[0], (ranked[1] if len(ranked) > 1 else None)


def _best(cands: list[Candidate]) -> Candidate | None:
    """The candidate with the largest min_d r_d (the first of equals)."""
    best: Candidate | None = None
    for cand in cands:
        if best is None or min(cand.rates_rps) > min(best.rates_rps):
            best = cand
    return best


def plan_dart_r(
    profiles: ModelProfiles, cluster: Cluster, slo_ms: float, margin: float
) -> PipelinePlan:
    """The DART-r plan (see module): status "optimal", gap 0.0, `solve_s` None.

    Raises InputError like `plan_pipelines` (bad SLO or margin, unknown GPU type, more than two
    types, or an SLO that neither a chain nor a leftover GPU can meet).
    """
    check_inputs(profiles, cluster, slo_ms, margin)
    high, low = gpu_classes(profiles, cluster)
    x_rps = estimated_throughput_rps(profiles, cluster, slo_ms, margin)
    n = profiles.num_blocks
    chains: list[Candidate] = []
    if low is not None and n > 1:
        for order in ((high, low), (low, high)):
            for cut in range(1, n):
                shape = (order, (0, cut, n), (1, 1))
                chains.extend(shape_candidates(profiles, cluster, shape, slo_ms, margin, x_rps))
    chain = _best(chains)
    counts = {gpu: cluster.gpus[gpu].count for gpu in cluster.types_in_use()}
    pipelines: list[Pipeline] = []
    if chain is not None and low is not None:
        pairs = min(counts[high], counts[low])
        pipelines.append(pipeline_of(chain, pairs * min(chain.rates_rps), [pairs, pairs]))
        counts = {gpu: count - pairs for gpu, count in counts.items()}
    examined = len(chains)
    for gpu, left in sorted(counts.items()):
        whole = shape_candidates(profiles, cluster, ((gpu,), (0, n), (1,)), slo_ms, margin, x_rps)
        examined += len(whole)
        best = _best(whole)
        if best is not None and left > 0:
            pipelines.append(pipeline_of(best, left * best.rates_rps[0], [left]))
    if not pipelines:
        raise InputError(
            f"plan {profiles.model}",
            "slo_ms",
            "an SLO that a dart-r chain or a whole model on one GPU meets",
            slo_ms,
        )
    total = sum(p.throughput_rps for p in pipelines)
    return PipelinePlan(total, "optimal", 0.0, None, tuple(pipelines), examined)

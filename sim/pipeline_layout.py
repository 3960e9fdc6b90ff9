"""Where a pipeline plan's workers run: virtual GPUs on physical GPUs on servers (paper 004, 5.3).

A plan gives, per pipeline and partition d, `workers` virtual GPUs of type k at MPS level m. As in
the MILP (A.2 eq. 23), partition index d of type k owns n_{d,k} = ceil(sum of workers / m over
the partitions at index d on type k) whole GPUs, and sum_d n_{d,k} <= N_k (checked by
`check_fits`). Placement: the GPUs of type k are numbered 0..N_k-1, server = number // per_server
(every type has its own servers); index d takes the next n_{d,k} GPUs; its virtual GPUs, the
largest share 1/m first (pipelines in plan order), go first-fit onto them with exact fractions.
When first fit finds no room (shares of different levels that fractional counting lets share a
GPU, e.g. 1/2 + 1/3 + 1/3 + 1/3 + 1/4 + 1/4 on two GPUs) the virtual GPU joins the GPU with the
most room left: the simulator gives each virtual GPU its profiled speed whatever shares its GPU.

Resources: workers are 0..W-1 in plan order (pipeline, partition, worker); server s's uplink is
W + 2s and its downlink W + 2s + 1. Utilisation counts a virtual GPU at level m as 1/m of a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster, PipelinePlan
from sim.reservation import Worker


@dataclass(frozen=True)
class PoolLayout:
    """Partition `partition` of pipeline `pipeline`: blocks [start, stop) on its workers."""

    pipeline: int
    partition: int
    gpu: str
    mps: int
    blocks: tuple[int, int]
    workers: tuple[Worker, ...]


@dataclass(frozen=True)
class Layout:
    """All pools, `pools[i][d]`, and the number of resources (workers, then NIC links)."""

    pools: tuple[tuple[PoolLayout, ...], ...]
    resources: int
    servers: int

    def workers(self) -> list[tuple[Worker, PoolLayout]]:
        """Every worker with its pool, in resource order."""
        return [(w, pool) for pipe in self.pools for pool in pipe for w in pool.workers]


def gpus_needed(plan: PipelinePlan) -> dict[str, int]:
    """Physical GPUs per type the plan needs: sum over partition indices d of n_{d,k}."""
    shares: dict[tuple[int, str], Fraction] = {}
    for pipe in plan.pipelines:
        for d, part in enumerate(pipe.partitions):
            key = (d, part.gpu)
            shares[key] = shares.get(key, Fraction(0)) + Fraction(part.workers, part.mps)
    need: dict[str, int] = {}
    for (_, gpu), share in shares.items():
        need[gpu] = need.get(gpu, 0) + math.ceil(share)
    return need


def check_fits(plan: PipelinePlan, cluster: Cluster, source: str = "plan") -> None:
    """Raise InputError if a pipeline uses a GPU type the cluster lacks or more GPUs of a type
    than the cluster has (counted as the MILP counts them, see the module docstring)."""
    known = ", ".join(g for g, pool in sorted(cluster.gpus.items()) if pool.count > 0)
    for i, pipe in enumerate(plan.pipelines):
        for d, part in enumerate(pipe.partitions):
            pool = cluster.gpus.get(part.gpu)
            if pool is None or pool.count == 0:
                raise InputError(
                    source,
                    f"pipelines[{i}].partitions[{d}].gpu",
                    f"a GPU type the cluster has ({known})",
                    part.gpu,
                )
    for gpu, need in sorted(gpus_needed(plan).items()):
        have = cluster.gpus[gpu].count
        if need > have:
            raise InputError(
                source,
                "pipelines",
                f"at most {have} {gpu} GPUs, the cluster's count (a partition index's workers "
                "/ mps, rounded up, summed over indices)",
                need,
            )


def place(plan: PipelinePlan, cluster: Cluster) -> Layout:
    """Put every worker of `plan` on a GPU and a server (module docstring); checks fit first."""
    check_fits(plan, cluster)
    server_base: dict[str, int] = {}
    servers = 0
    for gpu, pool in sorted(cluster.gpus.items()):
        server_base[gpu] = servers
        servers += -(-pool.count // pool.per_server)
    # (pipeline, partition) -> list of physical GPU numbers (within its type), one per worker
    gpu_of: dict[tuple[int, int], list[int]] = {}
    depth = max((len(p.partitions) for p in plan.pipelines), default=0)
    for gpu in sorted(cluster.gpus):
        next_gpu = 0
        for d in range(depth):
            members = [
                (i, pipe.partitions[d])
                for i, pipe in enumerate(plan.pipelines)
                if d < len(pipe.partitions) and pipe.partitions[d].gpu == gpu
            ]
            if not members:
                continue
            total = sum((Fraction(q.workers, q.mps) for _, q in members), Fraction(0))
            owned = math.ceil(total)
            room = [Fraction(1)] * owned
            for i, part in sorted(members, key=lambda m: m[1].mps):
                share = Fraction(1, part.mps)
                slots = gpu_of.setdefault((i, d), [])
                for _ in range(part.workers):
                    g = next((g for g, left in enumerate(room) if left >= share), None)
                    if g is None:
                        g = max(range(owned), key=lambda x: room[x])
                    room[g] -= share
                    slots.append(next_gpu + g)
            next_gpu += owned
    pools: list[tuple[PoolLayout, ...]] = []
    n_workers = sum(q.workers for p in plan.pipelines for q in p.partitions)
    resource = 0
    for i, pipe in enumerate(plan.pipelines):
        row = []
        for d, part in enumerate(pipe.partitions):
            per_server = cluster.gpus[part.gpu].per_server
            workers = []
            for number in gpu_of[(i, d)]:
                server = server_base[part.gpu] + number // per_server
                uplink = n_workers + 2 * server
                workers.append(Worker(resource, server, uplink, uplink + 1))
                resource += 1
            row.append(PoolLayout(i, d, part.gpu, part.mps, part.blocks, tuple(workers)))
        pools.append(tuple(row))
    return Layout(tuple(pools), n_workers + 2 * servers, servers)

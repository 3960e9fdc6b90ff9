"""Read a pipeline plan document (`layerbatch pipeline plan --json`, issue 8) for the simulator.

The document is `{"model", "slo_ms", "throughput_rps", "status", "gap", "solve_s", "pipelines":
[{"gpus", "batch", "throughput_rps", "latency_ms", "partitions": [{"blocks": [i, j], "gpu", "mps",
"workers", "gpus_used"}]}]}`. "model" and "slo_ms" (what the plan was made for) are optional, as
files written before they were recorded lack them. A plan whose "model" is not the profiles'
model is refused, naming both. The recorded SLO is not enforced (simulating a plan at another SLO
is a legitimate experiment): the returned plan's `slo_ms` carries it, None if not recorded, for
the caller to compare with the SLO it simulates.

The document does not name the cluster: the caller supplies the model's block profiles and the
cluster, and every partition is checked against them: blocks cover [0, N) in order, the GPU type
is the cluster's and profiled at that MPS level up to the batch, and the GPUs fit the cluster
(`sim.pipeline_layout.check_fits`). Partition latencies are recomputed from the profiles (PPipe
5.1: the sum of the blocks' latencies); the worker rate is the compute rate batch / latency (the
simulator does not use it). A pipeline that carries a "model" key must name the profiles' model.
A multi-model document (`{"models": {name: {"share", "slo_ms", ...plan}}}`) gives the profiles'
model's plan (its recorded SLO that entry's "slo_ms"), simulated alone on the cluster (the other
models' GPUs and NIC traffic are not modelled). A key the document does not name at any level
(PLAN_KEYS, PIPELINE_KEYS, PARTITION_KEYS) is refused, with the nearest one meant, and a cluster
description given as the plan is named so. Anything else raises InputError naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from scheduler.errors import InputError
from scheduler.pipeline.milp import Cluster, Partition, Pipeline, PipelinePlan
from scheduler.pipeline.profiles import ModelProfiles
from scheduler.validate import is_number, known_keys
from sim.pipeline_layout import check_fits

# the keys `PipelinePlan.to_json` writes (and "share", beside them in a multi-model entry)
PLAN_KEYS = ("model", "slo_ms", "share", "throughput_rps", "status", "gap", "solve_s", "pipelines")
PIPELINE_KEYS = ("model", "gpus", "batch", "throughput_rps", "latency_ms", "partitions")
PARTITION_KEYS = ("blocks", "gpu", "mps", "workers", "gpus_used")


def _int(source: str, field: str, value: object, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise InputError(source, field, what, value)
    return value


def _number(source: str, field: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise InputError(source, field, "a non-negative number", value)
    return float(value)


def _partition(
    source: str,
    where: str,
    doc: object,
    start: int,
    batch: int,
    profiles: ModelProfiles,
    cluster: Cluster,
) -> Partition:
    if not isinstance(doc, dict):
        raise InputError(source, where, "an object with blocks, gpu, mps and workers", doc)
    known_keys(doc, PARTITION_KEYS, source, where)
    for key in ("blocks", "gpu", "mps", "workers"):
        if key not in doc:
            raise InputError(source, f"{where}.{key}", f"a {key} entry (missing)")
    blocks = doc["blocks"]
    if (
        not isinstance(blocks, list)
        or len(blocks) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in blocks)
        or blocks[0] != start
        or not start < blocks[1] <= profiles.num_blocks
    ):
        raise InputError(
            source,
            f"{where}.blocks",
            f"[{start}, j] with {start} < j <= {profiles.num_blocks} (partitions cover the "
            f"{profiles.num_blocks} blocks of {profiles.model} in order)",
            blocks,
        )
    gpu = doc["gpu"]
    known = ", ".join(g for g, pool in sorted(cluster.gpus.items()) if pool.count > 0)
    if not isinstance(gpu, str) or gpu not in cluster.gpus or cluster.gpus[gpu].count == 0:
        raise InputError(source, f"{where}.gpu", f"a GPU type the cluster has ({known})", gpu)
    mps = _int(source, f"{where}.mps", doc["mps"], 1)
    if (gpu, mps) not in profiles.latency_us:
        levels = ", ".join(map(str, profiles.mps_levels(gpu))) or "none"
        raise InputError(source, f"{where}.mps", f"an MPS level profiled on {gpu} ({levels})", mps)
    if batch > profiles.max_batch(gpu, mps):
        raise InputError(
            source,
            f"{where}",
            f"a batch of at most {profiles.max_batch(gpu, mps)} on {gpu} at MPS {mps}",
            batch,
        )
    workers = _int(source, f"{where}.workers", doc["workers"], 1)
    latency_ms = profiles.partition_latency_ms(gpu, mps, blocks[0], blocks[1], batch)
    return Partition(
        blocks=(blocks[0], blocks[1]),
        gpu=gpu,
        mps=mps,
        workers=workers,
        latency_ms=latency_ms,
        worker_rate_rps=batch / latency_ms * 1000.0,
    )


def _pipeline(
    source: str, i: int, doc: object, profiles: ModelProfiles, cluster: Cluster
) -> Pipeline:
    where = f"pipelines[{i}]"
    if not isinstance(doc, dict):
        raise InputError(source, where, "an object with batch, throughput_rps and partitions", doc)
    known_keys(doc, PIPELINE_KEYS, source, where)
    for key in ("batch", "throughput_rps", "partitions"):
        if key not in doc:
            raise InputError(source, f"{where}.{key}", f"a {key} entry (missing)")
    model = doc.get("model")
    if model is not None and model != profiles.model:
        raise InputError(source, f"{where}.model", f"the model simulated, {profiles.model}", model)
    batch = _int(source, f"{where}.batch", doc["batch"], 1)
    rate_rps = _number(source, f"{where}.throughput_rps", doc["throughput_rps"])
    parts_doc = doc["partitions"]
    if not isinstance(parts_doc, list) or not parts_doc:
        raise InputError(source, f"{where}.partitions", "a non-empty list", parts_doc)
    parts = []
    start = 0
    for d, part_doc in enumerate(parts_doc):
        part = _partition(
            source, f"{where}.partitions[{d}]", part_doc, start, batch, profiles, cluster
        )
        parts.append(part)
        start = part.blocks[1]
    if start != profiles.num_blocks:
        raise InputError(
            source,
            f"{where}.partitions",
            f"partitions covering all {profiles.num_blocks} blocks of {profiles.model}",
            f"blocks 0-{start}",
        )
    latency = doc.get("latency_ms")
    latency_ms = (
        _number(source, f"{where}.latency_ms", latency)
        if latency is not None
        else sum(p.latency_ms for p in parts)
    )
    gpus = tuple(p.gpu for p in parts)
    return Pipeline(
        gpus=gpus,
        batch=batch,
        throughput_rps=rate_rps,
        latency_ms=latency_ms,
        partitions=tuple(parts),
    )


def plan_from_json(
    doc: Any, profiles: ModelProfiles, cluster: Cluster, source: str = "plan"
) -> PipelinePlan:
    """The plan in `doc`, checked against `profiles` and `cluster` (module docstring)."""
    if not isinstance(doc, dict):
        raise InputError(source, "", "a pipeline plan object with pipelines", doc)
    if isinstance(doc.get("models"), dict):  # a multi-model plan: this model's own plan
        models = doc["models"]
        if profiles.model not in models:
            names = ", ".join(sorted(map(str, models))) or "none"
            raise InputError(
                source, "models", f"a plan for model {profiles.model} (it has {names})"
            )
        doc = models[profiles.model]
        source = f"{source}: models.{profiles.model}"
        if not isinstance(doc, dict):
            raise InputError(source, "", "a pipeline plan object with pipelines", doc)
    if "gpus" in doc and "pipelines" not in doc:
        raise InputError(
            source, "", "a pipeline plan (`pipeline plan --json`), not a cluster's description"
        )
    known_keys(doc, PLAN_KEYS, source, "")
    model = doc.get("model")
    if model is not None:
        if not isinstance(model, str) or not model:
            raise InputError(source, "model", "the name of the model the plan was made for", model)
        if model != profiles.model:
            raise InputError(
                source,
                "model",
                f"a plan for {profiles.model}, the model being simulated (this plan was made "
                f"for {model}; simulate it with --model {model})",
            )
    slo = doc.get("slo_ms")
    if slo is not None and not (is_number(slo) and math.isfinite(slo) and slo > 0):
        raise InputError(source, "slo_ms", "a positive number of ms (the plan's SLO)", slo)
    pipes_doc = doc.get("pipelines")
    if not isinstance(pipes_doc, list) or not pipes_doc:
        raise InputError(
            source,
            "pipelines",
            "a non-empty list of pipelines (the plan serves nothing)",
            pipes_doc,
        )
    pipes = tuple(_pipeline(source, i, p, profiles, cluster) for i, p in enumerate(pipes_doc))
    total = doc.get("throughput_rps")
    total_rps = (
        _number(source, "throughput_rps", total)
        if total is not None
        else sum(p.throughput_rps for p in pipes)
    )
    if not total_rps > 0:
        raise InputError(source, "throughput_rps", "a positive planned throughput", total)
    status = doc.get("status")
    gap = doc.get("gap")
    solve_s = doc.get("solve_s")
    plan = PipelinePlan(
        throughput_rps=total_rps,
        status=str(status) if status is not None else "unknown",
        gap=float(gap) if isinstance(gap, int | float) else None,
        solve_s=float(solve_s) if isinstance(solve_s, int | float) else None,
        pipelines=pipes,
        candidates=0,
        model=profiles.model,
        slo_ms=float(slo) if slo is not None else None,
    )
    check_fits(plan, cluster, source)
    return plan

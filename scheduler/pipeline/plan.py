"""What the pipeline planner answers (PPipe, paper 004, section 3 "Outputs" and Appendix A.2).

A plan is a set of pooled pipelines. Pipeline l runs at throughput x_l (rps) and unified batch
b_l; its partition d covers blocks [c_d, c_{d+1}) on w_{l,d} virtual GPUs of type k_d at MPS
level m_d, so it occupies w_{l,d} / m_d physical GPUs and carries x_l <= w_{l,d} * r_{l,d}
(r: one worker's rate). The JSON document is the one issue 8 names, key for key; a plan for
several models (section 3, "In the presence of multiple DNN models") holds one such document
per model plus the smallest throughput / workload share it maximised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.pipeline.candidates import Candidate

INT_TOL_WORKERS = 1e-6  # HiGHS's integrality tolerance, in workers


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

    def to_json(self) -> dict[str, Any]:
        """One entry of the plan document's "pipelines"."""
        return {
            "gpus": list(self.gpus),
            "batch": self.batch,
            "throughput_rps": self.throughput_rps,
            "latency_ms": self.latency_ms,
            "partitions": [
                {
                    "blocks": list(q.blocks),
                    "gpu": q.gpu,
                    "mps": q.mps,
                    "workers": q.workers,
                    "gpus_used": q.gpus_used,
                }
                for q in self.partitions
            ],
        }


@dataclass(frozen=True)
class PipelinePlan:
    """The planner's answer for one model. `solve_s` is None unless `solve` was given a clock.

    `candidates` counts the pipeline configurations the plan was chosen among: those meeting
    (L) after exact dominance pruning (LP-bound screening may hand HiGHS fewer). `model` and
    `slo_ms` name what the plan was made for (`milp.plan_pipelines` sets both; None: unknown,
    e.g. a plan of several models, whose document records them per model).
    """

    throughput_rps: float
    status: str
    gap: float | None
    solve_s: float | None
    pipelines: tuple[Pipeline, ...]
    candidates: int
    model: str | None = None
    slo_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The issue-8 plan document (keys exactly as the issue names them), preceded by
        "model" and "slo_ms" when the plan knows them (so a simulator can refuse a plan made
        for another model; `sim.pipeline_plan_file` reads both)."""
        known: dict[str, Any] = {}
        if self.model is not None:
            known["model"] = self.model
        if self.slo_ms is not None:
            known["slo_ms"] = self.slo_ms
        return {
            **known,
            "throughput_rps": self.throughput_rps,
            "status": self.status,
            "gap": self.gap,
            "solve_s": self.solve_s,
            "pipelines": [p.to_json() for p in self.pipelines],
        }


@dataclass(frozen=True)
class ModelShare:
    """One model of a multi-model plan: its workload share, its SLO and its own plan."""

    share: float
    slo_ms: float
    plan: PipelinePlan


@dataclass(frozen=True)
class ModelsPlan:
    """The planner's answer for several models sharing one cluster.

    `normalized_rps` is t = min over models of throughput / share, the objective; every model's
    `plan` holds its pipelines (its `status`, `gap` and `solve_s` are the joint solve's).
    """

    normalized_rps: float
    status: str
    gap: float | None
    solve_s: float | None
    models: Mapping[str, ModelShare]

    @property
    def throughput_rps(self) -> float:
        """Total throughput over all models."""
        return sum(entry.plan.throughput_rps for entry in self.models.values())

    def to_json(self) -> dict[str, Any]:
        """`{"normalized_rps", "throughput_rps", "status", "gap", "solve_s", "models": {name:
        {"share", "slo_ms", ...that model's issue-8 plan document}}}`."""
        return {
            "normalized_rps": self.normalized_rps,
            "throughput_rps": self.throughput_rps,
            "status": self.status,
            "gap": self.gap,
            "solve_s": self.solve_s,
            "models": {
                name: {"share": entry.share, "slo_ms": entry.slo_ms, **entry.plan.to_json()}
                for name, entry in self.models.items()
            },
        }


def worker_count(x_rps: float, rate_rps: float) -> int:
    """The fewest workers of rate `rate_rps` carrying `x_rps`, with HiGHS's integrality
    tolerance (1e-6 worker): a pipeline whose x needs no more than that has none."""
    return math.ceil(x_rps / rate_rps - INT_TOL_WORKERS)


def pipeline_of(cand: Candidate, x_rps: float, workers: Sequence[int] | None = None) -> Pipeline:
    """The plan's pipeline for candidate `cand` at throughput `x_rps`: per partition
    `workers` if given, else the fewest workers carrying x_rps (ceil(x / r), up to HiGHS's
    integrality tolerance). Its throughput is min(x_rps, every partition's workers x rate)."""
    parts = tuple(
        Partition(
            blocks=(cand.bounds[d], cand.bounds[d + 1]),
            gpu=gpu,
            mps=m,
            workers=(workers[d] if workers is not None else worker_count(x_rps, cand.rates_rps[d])),
            latency_ms=cand.partition_ms[d],
            worker_rate_rps=cand.rates_rps[d],
        )
        for d, (gpu, m) in enumerate(zip(cand.gpus, cand.mps, strict=True))
    )
    carried = min(q.workers * q.worker_rate_rps for q in parts)
    return Pipeline(cand.gpus, cand.batch, min(x_rps, carried), cand.latency_ms, parts)

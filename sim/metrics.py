"""Numbers from one simulated run: on-time ratio, latency percentiles, batches, planning time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from scheduler.policies.common import QUEUE_FULL_AHEAD
from sim.simulator import Outcome


def summarise(out: Outcome) -> dict[str, Any]:
    """The `layerbatch sim --json` document (keys as in the README)."""
    n = len(out.workload.arrival_ms)
    lat = np.array(sorted(out.latency_ms.values()), dtype=np.float64)
    sizes = [b for bs in out.batches.values() for b in bs]
    per_stage: dict[str, list[float]] = {}
    for (model, k), bs in sorted(out.batches.items()):
        row = per_stage.setdefault(model, [])
        row.extend([0.0] * (k + 1 - len(row)))
        row[k] = _r(float(np.mean(bs)))
    return {
        "policy": out.policy,
        "rate_rps": out.workload.rate_rps,
        "requests": n,
        "completed": len(out.latency_ms),
        "dropped": len(out.dropped),
        # of those, turned away on arrival (`simulate(admission_share=...)`)
        "turned_away": sum(r == QUEUE_FULL_AHEAD for r in out.dropped.values()),
        "late": len(out.latency_ms) - len(out.on_time),
        "on_time_ratio": _r(len(out.on_time) / n),
        "mean_ms": _stat(lat, np.mean),
        "p50_ms": _pct(lat, 50),
        "p95_ms": _pct(lat, 95),
        "p99_ms": _pct(lat, 99),
        "queue_ms_mean": _mean(out.queue_ms, out.latency_ms),
        "in_steps_ms_mean": _mean(out.in_steps_ms, out.latency_ms),
        "mean_batch": _r(float(np.mean(sizes))) if sizes else None,
        "mean_batch_per_stage": per_stage,
        "utilisation": _r(out.busy_ms / out.replicas / out.end_ms) if out.end_ms > 0 else None,
        "plan_us_p50": _pct(np.array(out.plan_us), 50),
        "plan_us_p99": _pct(np.array(out.plan_us), 99),
    }


def _mean(per_request: Mapping[str, float], finished: Mapping[str, float]) -> float | None:
    """Mean over the finished requests of a per-request time."""
    return _stat(np.array([per_request[r] for r in finished], dtype=np.float64), np.mean)


def _r(x: float) -> float:
    return round(x, 4)


def _pct(a: np.ndarray, q: float) -> float | None:
    return _r(float(np.percentile(a, q))) if a.size else None


def _stat(a: np.ndarray, f: Any) -> float | None:
    return _r(float(f(a))) if a.size else None

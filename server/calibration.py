"""How much slower than profiled this machine runs each stage, from the steps it ran.

A step runs stages k0..k1-1 of one model at batch b in `m` ms against the profiled
p = sum_k base_k(b). Its time is shared among its stages in proportion to their profiled times,
and each stage k keeps EWMAs of its measured and profiled milliseconds (weight w per step):

    M_k <- M_k + w (m base_k(b) / p - M_k),    P_k <- P_k + w (base_k(b) - P_k),    f_k = M_k / P_k

so a stage's factor is time-weighted (short steps, dominated by fixed costs, do not outweigh long
ones). A stage no step has run yet takes the factor over every stage run so far,
sum_k M_k / sum_k P_k (1 before any step).

Why per stage and not one factor for the machine: measured on this 2-core CPU while serving
(bench/results/peers-log.md), mobilenet_v2's first layer group ran 1.6-2.0x its profile at every
batch size, its middle groups 1.1-1.3x and its last 1.0x. One factor, an average over the last
steps, climbs when a burst of arrivals runs first groups and then plans every group too slow.
Measured against that one factor: steps took 1.01-1.02x their planned time on average instead of
1.06-1.08x, and 3-4% of them over 1.5x instead of 9-10% (on-time ratios moved within the noise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class StageCalibration:
    """Per-(model, stage) EWMAs of measured and profiled time; `weight` is w above."""

    weight: float = 0.05
    _ewma: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)

    def observe(
        self, model: str, first_stage: int, profiled_ms: Sequence[float], measured_ms: float
    ) -> None:
        """Fold in one step of `model` that ran stages first_stage.. (their base-profile times at
        the step's batch size in `profiled_ms`) in `measured_ms`."""
        total = sum(profiled_ms)
        if total <= 0.0:
            return
        w = self.weight
        for i, p in enumerate(profiled_ms):
            key = (model, first_stage + i)
            m = measured_ms * p / total
            old = self._ewma.get(key)
            self._ewma[key] = (m, p) if old is None else (ewma(old[0], m, w), ewma(old[1], p, w))

    def overall(self) -> float:
        """sum_k M_k / sum_k P_k over every stage run so far; 1 before any step."""
        measured = sum(m for m, _ in self._ewma.values())
        profiled = sum(p for _, p in self._ewma.values())
        return measured / profiled if profiled > 0.0 else 1.0

    def factors(self, model: str, num_stages: int) -> tuple[float, ...]:
        """f_k for stages 0..num_stages-1 of `model` (`overall()` for stages not run yet)."""
        rest = self.overall()
        out = []
        for k in range(num_stages):
            mp = self._ewma.get((model, k))
            out.append(mp[0] / mp[1] if mp is not None and mp[1] > 0.0 else rest)
        return tuple(out)


def ewma(mean: float | None, value: float, weight: float) -> float:
    """`mean` moved towards `value` by `weight` (`value` itself when there is no mean yet)."""
    return value if mean is None else mean + weight * (value - mean)

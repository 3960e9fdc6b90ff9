"""Two steps at once on one device (stacking, paper 002 section 2.2), as the simulator times them.

A lane runs one step; alone, its stages take their profiled (solo) latencies. While the other
lane also runs, a lane's stages take `slowdown` times longer, the slowdown its model's profile
records for running beside the other lane's model (`Profile.stacking_slowdown`, 1 if not
profiled). Whenever the set of running models changes, each lane's remaining stage end times are
recomputed from now: the stage in progress keeps the solo work it has left, later stages their
solo latency, all at the new factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from scheduler.deployment import Deployment
from scheduler.types import Step


@dataclass
class Lane:
    step: Step
    solo_ms: tuple[float, ...]  # per stage, at the step's batch size
    ends_ms: list[float]  # when each stage ends at the current factor
    factor: float = 1.0

    @classmethod
    def start(cls, step: Step, solo_ms: Sequence[float]) -> Lane:
        """`step` from its start, its stages taking `solo_ms` alone (the device's profile, which
        may differ from the one the step was planned with)."""
        ends = list(accumulate(solo_ms, initial=step.start_ms))[1:]
        return cls(step, tuple(solo_ms), ends)

    @property
    def end_ms(self) -> float:
        return self.ends_ms[-1]

    @property
    def model(self) -> str:
        return self.step.action.model

    def stages_done_by(self, t_ms: float) -> int:
        """As `Step.stages_done_by`, on this lane's actual stage times."""
        starts = (self.step.start_ms, *self.ends_ms[:-1])
        return sum(1 for s in starts if s < t_ms)

    def retime(self, now_ms: float, factor: float) -> None:
        """From `now_ms` on, stages run `factor` times slower than solo."""
        if factor == self.factor:
            return
        starts = (self.step.start_ms, *self.ends_ms[:-1])
        t = now_ms
        for i, (s, e) in enumerate(zip(starts, self.ends_ms, strict=True)):
            if e <= now_ms:
                continue
            left_solo = (e - now_ms) / self.factor if s < now_ms else self.solo_ms[i]
            t += left_solo * factor
            self.ends_ms[i] = t
        self.factor = factor


def slowdown(d: Deployment, model: str, beside: str | None) -> float:
    """How much slower `model` runs while `beside` runs too (1 alone or when not profiled)."""
    if beside is None:
        return 1.0
    return d.profiles[model].stacking_slowdown.get(beside, 1.0)

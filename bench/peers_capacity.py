"""The capacity search on the rate (bench/peers.py), and the bounds a capacity is read against:
the compute bound, the batched ceiling, and whether the machine's speed moved during a run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SPEED_CHANGE_WARN = 0.15  # warn when the batched ceiling moved by more than this during a run


def round_rate(rate: float) -> float:
    """Rates are kept to 0.1 req/s (so that runs can be looked up by rate)."""
    return round(max(rate, 0.1), 1)


@dataclass
class RateSearch:
    """The capacity search on the rate: from `start`, grow (x`grow`) while on time, shrink while
    not, then bisect (geometric mean) until hi / lo <= 1 + tol. `lo`/`hi` may be known already
    (rates known on time / not). The capacity is `lo` (0 when no rate >= `min_rate` was).
    With a `floor` the search stops as soon as a rate at or below it is not on time
    (`below_floor`): only a capacity above the floor was asked for. With `then`, an on-time
    `start` is followed by `then` (when higher) instead of start x grow."""

    start: float
    tol: float = 0.1
    grow: float = 1.5
    min_rate: float = 0.5
    max_rate: float = 1000.0
    floor: float | None = None
    then: float | None = None
    lo: float | None = None
    hi: float | None = None
    tried: list[tuple[float, bool]] = field(default_factory=list)

    def record(self, rate: float, ok: bool) -> None:
        self.tried.append((rate, ok))
        if ok and (self.lo is None or rate > self.lo):
            self.lo = rate
        if not ok and (self.hi is None or rate < self.hi):
            self.hi = rate
        if self.lo is not None and self.hi is not None and self.lo >= self.hi:
            # noise: a higher rate was on time, a lower one not; trust the lower failure
            self.lo = max((r for r, k in self.tried if k and r < self.hi), default=None)

    @property
    def below_floor(self) -> bool:
        """Whether a rate at or below `floor` was not on time, which ends the search."""
        return self.floor is not None and self.hi is not None and self.hi <= self.floor

    def next_rate(self) -> float | None:
        lo, hi = self.lo, self.hi
        if self.below_floor:
            return None
        if lo is None and hi is None:
            r = self.start
        elif lo is None:
            assert hi is not None
            if hi <= self.min_rate:
                return None
            r = max(hi / self.grow, self.min_rate)
        elif hi is None:
            if lo >= self.max_rate:
                return None
            r = min(lo * self.grow, self.max_rate)
            if self.then is not None and self.then > lo:
                r = self.then
        else:
            if hi / lo <= 1.0 + self.tol:
                return None
            r = math.sqrt(lo * hi)
        r = round_rate(r)
        if any(r == t for t, _ in self.tried):
            return None  # the rate grid is too coarse to go on
        return r

    @property
    def capacity(self) -> float:
        return self.lo or 0.0


def compute_bound_rps(decode_ms: float, forward_ms: float, batch: int = 1) -> float:
    """The highest rate decodes + one forward of `batch` frames at a time can sustain: with
    batch 1 the compute bound; with full batches the ceiling of any server that batches whole
    models on this machine (with nothing else on its cores)."""
    return 1000.0 * batch / (batch * decode_ms + forward_ms)


def batched_ceiling_rps(bound: dict[str, Any]) -> float:
    """The batched ceiling of one compute-bound measurement (bench/peers_model.py): the best
    `compute_bound_rps` over its full-batch forwards, as the peers run the model or folded, on
    one runtime of every torch thread; or, where it was measured (`lanes_rps`, since session
    73), what lanes of one thread each serve in full batches with their own decodes
    (bench/lane_ceiling.py), if more: their decodes do not leave a core idle."""
    batched = [*bound["batched"].items(), *bound["batched_folded"].items()]
    one = max(compute_bound_rps(bound["decode_ms"], ms, int(b)) for b, ms in batched)
    return max(one, float(bound.get("lanes_rps", 0.0)))


def mean_bound(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The compute bound and batched ceiling measured before and after a model's servers (the
    machine is shared), with their means as `rps` and `batched_rps`, and how much faster the
    machine ran after than before as `speed_change` (the ceilings' ratio)."""
    return {
        "before": before,
        "after": after,
        **{k: round((before[k] + after[k]) / 2, 2) for k in ("rps", "batched_rps")},
        "speed_change": round(after["batched_rps"] / before["batched_rps"], 3),
    }


def speed_warning(bound: dict[str, Any]) -> str | None:
    """One line when the machine's speed (`mean_bound`'s speed_change) moved by more than
    SPEED_CHANGE_WARN during the run, else None (also for runs that did not record it)."""
    change = float(bound.get("speed_change", 1.0))
    if abs(change - 1.0) <= SPEED_CHANGE_WARN:
        return None
    return (
        f"warning: this machine's speed changed during the run (batched ceiling "
        f"{bound['before']['batched_rps']:.1f} req/s before, {bound['after']['batched_rps']:.1f} "
        f"after, x{change:.2f}): only measurements taken close together compare (--interleave "
        "measures the servers back to back at each rate), not capacities against the ceiling"
    )

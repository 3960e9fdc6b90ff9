"""Where a server's on-time ratio crosses the threshold, and how sure a run is of the ratio of
two servers' crossings.

A server's capacity in `bench/peers.py` is the rate where its mean on-time ratio over the
rounds crosses THRESHOLD, interpolated linearly between the two measured rates that bracket it.
The rounds of one rate spread widely on a shared machine (0.1-0.6 apart), so a run also reports
a percentile bootstrap over rounds: each draw resamples, for every server and rate on its own,
as many rounds as were measured there, with replacement; takes each server's crossing of the
resampled means; and keeps layerbatch's crossing over the best peer's. The interval is the
central `level` of those ratios. It shows how far the run's own rounds disagree; with three
rounds a rate it can only recombine those three, so it understates how far another run may land.

A crossing outside the measured rates has no value, so for the ratio a server that never falls
under the threshold counts as crossing at the highest rate (it crosses there or later) and one
under it already at the lowest rate as crossing there (or earlier). Then the ratio is a bound:
at least the value printed when it is layerbatch that never falls under or the best peer that
is under already, at most when it is the other way round (`RatioInterval.bound`).

`capacity_rules` reads the same rounds by two other rules, to show how far the benchmark's rests
on its rule:

- the issue's words: the highest measured rate whose mean on-time ratio is >= THRESHOLD, lower
  failures or not (so a measured rate, never between two);
- a monotone fit: a server's expected on-time ratio does not rise with the rate it is offered,
  so a mean under a later, higher one is noise. The fit f minimises sum_r n_r (m_r - f_r)^2 over
  non-increasing f, where m_r is the mean of the n_r rounds at rate r (pool adjacent violators:
  neighbours out of order are merged into their weighted mean until none are), and the crossing
  is read from f as from the means.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

THRESHOLD = 0.9

Rounds = Mapping[str, Mapping[float, Sequence[float]]]  # server -> rate -> on-time ratio per round


def threshold_crossing(on_time: Mapping[float, float]) -> tuple[float, float | None]:
    """From on-time ratios by rate: the highest rate below which every ratio is >= the
    threshold (it trusts a lower failure, as the capacity search does; 0 if none), and where the
    ratio crosses the threshold by linear interpolation between that rate and the next (None when
    no two measured rates bracket it), to 0.1 req/s."""
    pts = sorted(on_time.items())
    ok = [r for r, _ in itertools.takewhile(lambda p: p[1] >= THRESHOLD, pts)]
    crossing = None
    if ok and len(ok) < len(pts):
        (r0, v0), (r1, v1) = pts[len(ok) - 1], pts[len(ok)]
        crossing = round(r0 + (r1 - r0) * (v0 - THRESHOLD) / (v0 - v1), 1)
    return max(ok, default=0.0), crossing


def edge_crossing(on_time: Mapping[float, float]) -> tuple[float, str]:
    """The crossing, or the measured rate at the edge it lies beyond (module docstring), and
    where the true crossing is from that value: "" (it is the crossing), "above" or "below"."""
    capacity, crossing = threshold_crossing(on_time)
    if crossing is not None:
        return crossing, ""
    rates = sorted(on_time)
    if capacity < rates[0]:
        return rates[0], "below"
    return capacity, "above" if capacity >= rates[-1] else ""


def best_server(at: Mapping[str, tuple[float, str]]) -> str:
    """The server with the highest crossing in `at` (as `edge_crossing` gives them), a measured
    crossing winning a tie with an edge."""
    return max(at, key=lambda s: (at[s][0], at[s][1] == ""))


@dataclass(frozen=True)
class RatioInterval:
    """layerbatch's crossing over the best peer's: from the rounds' means, and the central
    `level` of the bootstrap's ratios. `bound`: "" when both crossings were measured, else
    "at least" or "at most" (module docstring), or "beyond the rates both ways"."""

    ratio: float
    low: float
    high: float
    level: float
    draws: int
    bound: str

    def text(self) -> str:
        spread = f"{self.level:.0%} of {self.draws} resamplings of the rounds"
        prefix = f"{self.bound} " if self.bound in ("at least", "at most") else ""
        text = f"{prefix}{self.ratio:.2f}x ({spread}: {self.low:.2f}-{self.high:.2f}x)"
        return text + (
            "; a crossing beyond the rates both ways" if self.bound.startswith("beyond") else ""
        )


def ratio_interval(
    rounds: Rounds,
    rng: np.random.Generator,
    ours: str = "layerbatch",
    draws: int = 2000,
    level: float = 0.9,
) -> RatioInterval | None:
    """The ratio of `ours`'s crossing to the best other server's, with its bootstrap interval
    (module docstring); None without `ours` and at least one other server."""
    peers = [s for s in rounds if s != ours]
    if ours not in rounds or not peers:
        return None

    def ratio(means: Mapping[str, Mapping[float, float]]) -> tuple[float, str]:
        at = {s: edge_crossing(means[s]) for s in rounds}
        best = best_server({p: at[p] for p in peers})
        sides = {
            {"above": "at least", "below": "at most"}.get(at[ours][1], ""),
            {"below": "at least", "above": "at most"}.get(at[best][1], ""),
        } - {""}
        bound = sides.pop() if len(sides) == 1 else ("beyond the rates both ways" if sides else "")
        return at[ours][0] / at[best][0], bound

    def means(pick: Callable[[np.ndarray], np.ndarray]) -> dict[str, dict[float, float]]:
        return {
            s: {r: float(np.mean(pick(np.asarray(v, dtype=float)))) for r, v in per.items()}
            for s, per in rounds.items()
        }

    point, bound = ratio(means(lambda v: v))
    samples = [ratio(means(lambda v: rng.choice(v, size=len(v))))[0] for _ in range(draws)]
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(samples, [tail, 1.0 - tail])
    return RatioInterval(point, float(low), float(high), level, draws, bound)


def monotone_means(rounds_at: Mapping[float, Sequence[float]]) -> dict[float, float]:
    """The non-increasing fit of the on-time ratio against rate nearest the rounds' means, each
    rate weighted by its number of rounds (module docstring); rates without rounds are left out."""
    blocks: list[tuple[float, int, list[float]]] = []  # (sum of ratios, rounds, rates)
    for rate, values in sorted(rounds_at.items()):
        if not values:
            continue
        block = (float(sum(values)), len(values), [rate])
        while blocks and blocks[-1][0] / blocks[-1][1] < block[0] / block[1]:
            total, n, rates = blocks.pop()
            block = (total + block[0], n + block[1], rates + block[2])
        blocks.append(block)
    return {rate: total / n for total, n, rates in blocks for rate in rates}


def highest_on_time(on_time: Mapping[float, float]) -> tuple[float, str]:
    """The highest measured rate whose ratio is >= the threshold, as `edge_crossing` gives its
    side: "above" when it is the highest rate measured, "below" (the lowest rate) when none is."""
    rates = sorted(on_time)
    ok = [r for r in rates if on_time[r] >= THRESHOLD]
    if not ok:
        return rates[0], "below"
    return ok[-1], "above" if ok[-1] == rates[-1] else ""


RULES = ("first crossing", "highest rate on time", "monotone fit")


@dataclass(frozen=True)
class RuleReading:
    """One rule's capacities of `ours` and of the best other server, with their sides
    (`edge_crossing`), and their ratio."""

    ours: tuple[float, str]
    best_peer: str
    peer: tuple[float, str]

    @property
    def ratio(self) -> float:
        return self.ours[0] / self.peer[0]


def capacity_rules(rounds: Rounds, ours: str = "layerbatch") -> dict[str, RuleReading]:
    """Each rule in RULES applied to every server's rounds (module docstring); empty without
    `ours` and at least one other server."""
    if ours not in rounds or len(rounds) < 2:
        return {}

    def read(per: Mapping[float, Sequence[float]]) -> dict[str, tuple[float, str]]:
        means = {r: float(np.mean(v)) for r, v in per.items() if v}
        return {
            "first crossing": edge_crossing(means),
            "highest rate on time": highest_on_time(means),
            "monotone fit": edge_crossing(monotone_means(per)),
        }

    at = {s: read(per) for s, per in rounds.items()}
    out = {}
    for rule in RULES:
        best = best_server({s: a[rule] for s, a in at.items() if s != ours})
        out[rule] = RuleReading(at[ours][rule], best, at[best][rule])
    return out

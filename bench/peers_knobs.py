"""A server's knobs (max batch, max delay, workers), the grid a peer is tuned over, how the
tuning's pick is chosen and settled against its runner-up, and the knobs on record in saved
tuning runs (bench/peers.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

THREADS = 2


@dataclass(frozen=True)
class Knobs:
    """A server's knobs: at most `max_batch` requests per batch, waiting at most `delay_ms` for
    more (max_batch 0: the server has none to tune, i.e. layerbatch), on `workers` workers
    (TorchServe's workers, Triton's model instances, Ray Serve's replicas, layerbatch's
    `--replicas`) that split the THREADS torch threads between them."""

    max_batch: int = 0
    delay_ms: float = 0.0
    workers: int = 1

    @property
    def threads(self) -> int:
        """Torch threads per worker."""
        return max(1, THREADS // self.workers)

    @property
    def label(self) -> str:
        if self.max_batch == 0:
            return "default" if self.workers == 1 else f"{self.workers} replicas"
        base = "B=1" if self.max_batch == 1 else f"B={self.max_batch},{self.delay_ms:g}ms"
        return base if self.workers == 1 else f"{base},{self.workers}w"


UNTUNED = Knobs(8, 5.0)  # --interleave: a peer's knobs when no tuning run has any


def tuning_grid(
    batches: Sequence[int], delays: Sequence[float], workers: Sequence[int] = (1,)
) -> list[Knobs]:
    """Every (workers, max batch, max delay); with a batch of 1 the delay means nothing, so
    once."""
    out: list[Knobs] = []
    for w in workers:
        for b in batches:
            for d in [delays[0]] if b == 1 else delays:
                out.append(Knobs(int(b), float(d if b > 1 else 0.0), int(w)))
    return list(dict.fromkeys(out))


def knobs_from_label(label: str) -> Knobs:
    """The inverse of Knobs.label: "default", "2 replicas", "B=1", "B=8,5ms", "B=8,5ms,2w"."""
    if label == "default":
        return Knobs()
    if label.endswith(" replicas"):
        return Knobs(workers=int(label.removesuffix(" replicas")))
    parts = label.removeprefix("B=").split(",")
    workers = int(parts.pop().removesuffix("w")) if parts[-1].endswith("w") else 1
    if parts == ["1"]:
        return Knobs(1, 0.0, workers)
    return Knobs(int(parts[0]), float(parts[1].removesuffix("ms")), workers)


def best_knobs(caps: dict[Knobs, tuple[float, float]]) -> Knobs:
    """The tuning winner: the highest capacity, then the highest on-time ratio at the first
    rate it failed (how close it came), then the earlier-listed."""
    return max(caps, key=lambda k: (caps[k][0], caps[k][1]))


def runner_up(caps: dict[Knobs, tuple[float, float]]) -> Knobs | None:
    """The second in `best_knobs`'s order; None where it had one knob or no capacity to go on."""
    ranked = sorted(caps, key=lambda k: caps[k], reverse=True)  # stable: ties keep grid order
    if len(ranked) < 2 or caps[ranked[0]][0] <= 0:
        return None
    return ranked[1]


def settled(pick: Knobs, other: Knobs, on_time: Mapping[Knobs, Sequence[float]]) -> Knobs:
    """Of the tuning's pick and its runner-up, measured in pairs on the same arrivals, the one
    with the higher mean on-time ratio; the pick where they tie."""
    return other if np.mean(on_time[other]) > np.mean(on_time[pick]) else pick


def tuning_records(
    out: Path, model: str, arrival: str = "poisson"
) -> list[tuple[Path, dict[str, Any]]]:
    """`model`'s results under `arrival` arrivals, at knobs tuned under them, from the runs on
    record beside `out` (`out` itself, then peers-quick.json, then peers-quick-MODEL.json and
    peers-quick-MODEL-*.json, e.g. a tuning run at another deadline), each with its file. Runs
    from before per-arrival tuning (no "tuned_under") were tuned under Poisson arrivals. Under a
    trace each record also carries `tuned_on_arrivals`, how many of the trace's first arrivals
    its tuning measured (its --min-requests), where the file says."""
    files = [out, out.with_name("peers-quick.json"), out.with_name(f"peers-quick-{model}.json")]
    files += sorted(out.parent.glob(f"peers-quick-{model}-*.json"))
    found: list[tuple[Path, dict[str, Any]]] = []
    for p in (f for f in files if f.exists()):
        doc = json.loads(p.read_text())
        count = doc.get("settings", {}).get("min_requests") if arrival != "poisson" else None
        found += [
            (p, {**r, "tuned_on_arrivals": count} if count else r)
            for r in doc["results"]
            if (r["model"], r["arrival"], r.get("tuned_under") or "poisson")
            == (model, arrival, arrival)
        ]
    return found


def knobs_on_record(
    out: Path, model: str, deadline_ms: float, arrival: str = "poisson", count: int = 0
) -> dict[str, tuple[Knobs, str]]:
    """Each server's best knobs from the tuning runs on record (`tuning_records`), with where
    they came from, the first found of: tuned under `arrival` at `deadline_ms`, under `arrival`
    at another deadline, then the same two under Poisson arrivals (layerbatch's only where it
    was tuned over replica counts). Under a trace, where says on how many of its first arrivals
    the knobs were tuned, and whether that differs from `count`, the run's: more arrivals bring
    other bursts (the Azure trace's arrivals 151-200 are one burst)."""
    found: dict[str, tuple[Knobs, str]] = {}
    for tuned_under in dict.fromkeys(["poisson", arrival]):  # lowest priority first
        exact: dict[str, tuple[Knobs, str]] = {}
        other: dict[str, tuple[Knobs, str]] = {}
        for p, r in tuning_records(out, model, tuned_under):
            if r["server"] == "layerbatch" and not r.get("tuned_under"):
                continue  # a run at one replica count: its knobs were given, not tuned
            into = exact if r["deadline_ms"] == deadline_ms else other
            where = f"tuned under {tuned_under} arrivals at {r['deadline_ms']:g} ms"
            if n := r.get("tuned_on_arrivals"):
                differs = f", not this run's {count}" if count and n != count else ""
                where += f" on its first {n}{differs}"
            where += f", {p.name}"
            into.setdefault(r["server"], (knobs_from_label(r["knobs"]), where))
        found.update({**other, **exact})
    return found

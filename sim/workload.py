"""What the simulator feeds the scheduler: arrival times, the app of each request, deadlines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scheduler.deployment import Deployment
from scheduler.errors import InputError
from traces.arrivals import generate_ms


@dataclass(frozen=True)
class Workload:
    """n requests: `arrival_ms[i]` (sorted), `apps[i]`, and a deadline `deadline_ms` after arrival."""

    arrival_ms: tuple[float, ...]
    apps: tuple[str, ...]
    deadline_ms: float
    rate_rps: float


def parse_mix(text: str | None, deployment: Deployment) -> dict[str, float]:
    """`app=share,...` -> shares normalised to 1; None -> equal shares over all apps."""
    if text is None:  # (an empty --mix is no mix: refused below, not read as the default)
        return {a: 1.0 / len(deployment.apps) for a in deployment.apps}
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in deployment.apps:
            raise InputError(
                "--mix", part, f"app=share with app one of {', '.join(sorted(deployment.apps))}"
            )
        if name in shares:
            raise InputError("--mix", part, "each app once", name)
        try:
            share = float(value)
        except ValueError:
            raise InputError("--mix", part, "a number after '='", value) from None
        if not (math.isfinite(share) and share >= 0):
            raise InputError("--mix", part, "a non-negative finite share", share)
        shares[name] = share
    total = sum(shares.values())
    if total <= 0:
        raise InputError("--mix", text, "at least one positive share")
    return {a: s / total for a, s in shares.items()}


def make_workload(
    deployment: Deployment,
    rate_rps: float,
    n: int,
    arrival: str,
    mix: Mapping[str, float],
    deadline_ms: float,
    rng: np.random.Generator,
    trace_s: np.ndarray | None = None,
) -> Workload:
    """Draw arrivals (see traces.arrivals) and each request's app from `mix`, with one rng."""
    if n < 1:
        raise InputError("--requests", "", "a positive number of requests", n)
    if not (math.isfinite(deadline_ms) and deadline_ms > 0):
        raise InputError("--deadline-ms", "", "a positive finite deadline in ms", deadline_ms)
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise InputError("--rate", "", "a positive finite rate in requests per second", rate_rps)
    times = generate_ms(arrival, rate_rps, n, rng, trace_s)
    names = sorted(mix)
    probs = np.array([mix[a] for a in names])
    picks = rng.choice(len(names), size=n, p=probs / probs.sum())
    return Workload(
        tuple(float(t) for t in times), tuple(names[i] for i in picks), deadline_ms, rate_rps
    )

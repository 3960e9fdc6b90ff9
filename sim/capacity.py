"""Capacity search: on-time ratio against request rate, per policy (paper 003, section 6.1).

capacity(policy) = the highest rate on the grid whose on-time ratio is >= 0.9. Every policy sees
the same arrivals at a given rate (the workload depends only on rate and seed). Runs are spread
over worker processes; the result does not depend on how many.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.deployment import Deployment
from scheduler.errors import InputError
from scheduler.policies import make_policy
from scheduler.profile import Profile
from scheduler.types import App
from sim.metrics import summarise
from sim.simulator import simulate
from sim.workload import make_workload
from traces.arrivals import MAX_RATE_RPS, MIN_RATE_RPS, RATE_RANGE

ON_TIME_TARGET = 0.9


@dataclass(frozen=True)
class Setup:
    """Everything a worker needs to rebuild the deployment and the workload (picklable)."""

    profiles: tuple[Profile, ...]
    apps: tuple[App, ...]
    max_batch: int | None
    groups: int | Mapping[str, int]
    mix: tuple[tuple[str, float], ...]
    arrival: str
    requests: int
    deadline_ms: float
    seed: int
    exact: bool
    trace_s: tuple[float, ...] | None = None
    step_gap_ms: float = 0.0  # the device's idle time after every step (`simulate`)
    replicas: int = 1  # devices, each with its own queue and plans (`simulate`)
    admission_share: float | None = None  # admission on arrival (`simulate`)
    decode_ms: float = 0.0  # each admitted request's decode on its device (`simulate`)

    def deployment(self) -> Deployment:
        return Deployment(self.profiles, self.apps, self.max_batch, self.groups)


MAX_RATES = 1000  # rates in one sweep


def parse_rates(text: str) -> list[float]:
    """`start:stop:step` (inclusive) or a comma list -> rates in requests per second."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if not all(math.isfinite(x) for x in (start, stop, step)):
                raise ValueError
            if step <= 0 or stop < start or not MIN_RATE_RPS <= start <= stop <= MAX_RATE_RPS:
                raise ValueError
            n = int(np.floor((stop - start) / step + 1e-9)) + 1
            if n > MAX_RATES:
                raise ValueError
            return [round(start + i * step, 6) for i in range(n)]
        rates = [float(x) for x in text.split(",")]
        if not rates or not all(MIN_RATE_RPS <= r <= MAX_RATE_RPS for r in rates):
            raise ValueError
        if len(set(rates)) < len(rates) or len(rates) > MAX_RATES:
            raise ValueError
        return sorted(rates)
    except ValueError:
        raise InputError(
            "--rates",
            "",
            f"START:STOP:STEP with START <= STOP and STEP > 0, or a comma list of different "
            f"rates, each {RATE_RANGE} req/s; at most {MAX_RATES} rates",
            text,
        ) from None


def run_one(args: tuple[Setup, str, float]) -> dict[str, Any]:
    """One simulation; the unit of work for the pool."""
    setup, policy, rate = args
    d = setup.deployment()
    rng = np.random.default_rng(setup.seed)
    trace = None if setup.trace_s is None else np.array(setup.trace_s)
    w = make_workload(
        d, rate, setup.requests, setup.arrival, dict(setup.mix), setup.deadline_ms, rng, trace
    )
    scheduler = make_policy(policy, exact=setup.exact)
    out = simulate(
        d, scheduler, w, step_gap_ms=setup.step_gap_ms, replicas=setup.replicas,
        admission_share=setup.admission_share, decode_ms=setup.decode_ms,
    )  # fmt: skip
    return summarise(out)


def sweep(
    setup: Setup,
    policies: Sequence[str],
    rates: Sequence[float],
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Simulate every (policy, rate); results in (policy, rate) order."""
    tasks = [(setup, p, r) for p in policies for r in rates]
    if jobs <= 1:
        results = []
        for t in tasks:
            results.append(run_one(t))
            if progress:
                progress(1)
        return results
    ctx = mp.get_context("fork")
    # Ctrl-C reaches the whole process group: the parent stops the pool, workers stay quiet
    with ctx.Pool(
        jobs, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
    ) as pool:
        results = []
        for res in pool.imap(run_one, tasks):
            results.append(res)
            if progress:
                progress(1)
    return results


def capacities(
    runs: Sequence[dict[str, Any]], target: float = ON_TIME_TARGET
) -> dict[str, float | None]:
    """Per policy, the highest simulated rate whose on-time ratio is >= target (None if none)."""
    out: dict[str, float | None] = {}
    for r in runs:
        out.setdefault(r["policy"], None)
        if r["on_time_ratio"] >= target:
            best = out[r["policy"]]
            out[r["policy"]] = r["rate_rps"] if best is None else max(best, r["rate_rps"])
    return out


def ratios(caps: dict[str, float | None], baseline: str) -> dict[str, float | None]:
    base = caps.get(baseline)
    return {p: (None if c is None or not base else round(c / base, 3)) for p, c in caps.items()}

"""The arrivals bench/peers.py sends every server: open-loop Poisson, or the Azure code trace's
first arrivals rescaled to a mean rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
AZURE_TRACE = ROOT / "traces" / "data" / "request_traces" / "AzureLLMInferenceTrace_code.csv"
FULL_LOAD = {"duration_s": 20.0, "min_requests": 200, "seed": 1}  # a full run's arrivals


def poisson_arrivals_s(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    gaps = rng.exponential(1.0 / rate, int(rate * duration_s * 2) + 20)
    t = np.cumsum(gaps)
    out: np.ndarray = t[t < duration_s]
    return out


def trace_arrivals_s(
    timestamps_s: np.ndarray, rate: float, n: int, max_gap: float = 30.0
) -> np.ndarray:
    """The first `n` arrivals of the trace rescaled so that its mean rate (over the whole trace)
    is `rate` (traces/arrivals.py `recorded_ms`, looped if short), in seconds, with every idle gap
    longer than `max_gap` mean inter-arrivals cut to that (the Azure code trace falls silent for
    minutes; a server is idle either way, and a run should not wait for it). A count, not a
    duration: a run needs requests."""
    from traces.arrivals import recorded_ms

    t = recorded_ms(timestamps_s, rate, n) / 1000.0
    gaps = np.minimum(np.diff(t, prepend=t[:1]), max_gap / rate)
    out: np.ndarray = np.cumsum(gaps)
    return out


def arrivals_for(
    kind: str, rate: float, duration_s: float, seed: int, trace: np.ndarray, count: int
) -> Any:
    """Poisson arrivals for `duration_s`, or the trace's first `count` arrivals rescaled to
    `rate`: the same arrivals at every rate, compressed, so that a higher rate means the same
    bursts closer together (a count that grew with the rate would also bring later, different
    bursts into a run)."""
    if kind == "poisson":
        return poisson_arrivals_s(rate, duration_s, np.random.default_rng([seed, int(rate * 10)]))
    return trace_arrivals_s(trace, rate, max(2, count))

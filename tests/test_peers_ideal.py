"""bench/peers_ideal.py: the ideal server at the batched ceiling, served in arrival order, turning
away what it cannot finish in time, and the rate where it falls to 0.9 on time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.peers_arrivals import AZURE_TRACE, trace_arrivals_s
from bench.peers_ideal import ideal_crossing_rps, ideal_on_time_ratio
from traces.arrivals import load_timestamps


def test_requests_are_served_in_arrival_order_each_taking_the_service_time() -> None:
    # three at once, 0.4 s each, 1 s to spare: ends at 0.4, 0.8, and 1.2 for the third: late
    assert ideal_on_time_ratio(np.array([0.0, 0.0, 0.0]), 1.0, 0.4) == pytest.approx(2 / 3)
    assert ideal_on_time_ratio(np.array([0.0, 0.0, 0.0]), 1.25, 0.4) == 1.0
    assert ideal_on_time_ratio(np.array([]), 1.0, 0.4) == 1.0


def test_a_request_turned_away_costs_the_others_nothing() -> None:
    # the third is turned away at once, so the fourth starts at 0.8 and ends by 1.2 <= 1.5
    arrivals = np.array([0.0, 0.0, 0.0, 0.5])
    assert ideal_on_time_ratio(arrivals, 1.0, 0.4) == pytest.approx(3 / 4)


def test_an_idle_server_starts_a_request_when_it_arrives() -> None:
    # spaced wider than the service time: nobody waits, whatever the deadline above it
    assert ideal_on_time_ratio(np.arange(10) * 0.5, 0.41, 0.4) == 1.0
    assert ideal_on_time_ratio(np.arange(10) * 0.5, 0.39, 0.4) == 0.0


def test_evenly_spaced_arrivals_cross_where_the_ceiling_is_a_tenth_short() -> None:
    # at rate r above a ceiling of 50/s with a short deadline, it serves about 50 of every r
    def even(rate: float) -> np.ndarray:
        return np.arange(5000) / rate

    got = ideal_crossing_rps(even, deadline_ms=40.0, ceiling_rps=50.0)
    assert got == pytest.approx(50.0 / 0.9, rel=0.01)


def test_a_deadline_longer_than_every_arrival_needs_never_crosses() -> None:
    # ten requests, each 0.01 s: at any rate all ten end within 0.1 s of the first arrival
    def ten(rate: float) -> np.ndarray:
        return np.arange(10) / rate

    assert ideal_crossing_rps(ten, deadline_ms=1000.0, ceiling_rps=100.0) == math.inf


def test_the_trace_crosses_below_the_ceiling_and_later_with_a_longer_deadline() -> None:
    trace = load_timestamps(AZURE_TRACE)

    def arrivals_at(rate: float) -> np.ndarray:
        return trace_arrivals_s(trace, rate, 200)

    short = ideal_crossing_rps(arrivals_at, deadline_ms=300.0, ceiling_rps=50.0)
    long = ideal_crossing_rps(arrivals_at, deadline_ms=1000.0, ceiling_rps=50.0)
    assert short < long < 50.0  # its bursts run far above the mean rate
    for rate, expect_ok in ((short * 0.97, True), (short * 1.03, False)):
        ratio = ideal_on_time_ratio(arrivals_at(rate), 0.3, 1 / 50.0)
        assert (ratio >= 0.9) is expect_ok


def test_a_ceiling_that_is_not_a_positive_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        ideal_crossing_rps(lambda r: np.zeros(3), 300.0, 0.0)

"""Arrival processes and trace files (traces/arrivals.py)."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import pytest

from tests.sim_cases import AZURE_TRACE
from traces.arrivals import (
    PARETO_ALPHA,
    TraceError,
    constant_ms,
    generate_ms,
    load_timestamps,
    pareto_ms,
    poisson_ms,
    recorded_ms,
)

N = 50_000


def gaps(arrivals: np.ndarray) -> np.ndarray:
    """Inter-arrival times, counting the first arrival from 0."""
    return np.diff(np.concatenate([[0.0], arrivals]))


@pytest.mark.parametrize("kind", ["poisson", "pareto", "constant"])
def test_generators_return_sorted_arrays_of_the_requested_length(kind: str) -> None:
    out = generate_ms(kind, 80.0, 1234, np.random.default_rng(5))
    assert out.shape == (1234,)
    assert out.dtype == np.float64
    assert np.all(np.diff(out) >= 0)
    assert out[0] >= 0


def test_poisson_mean_rate_and_exponential_gaps() -> None:
    # n = 50 000 exponential gaps: the sample mean has a relative standard error of
    # 1/sqrt(n) = 0.45 %, so 3 % is more than 6 standard errors for any seed.
    rate = 120.0
    g = gaps(poisson_ms(rate, N, np.random.default_rng(11)))
    assert g.mean() == pytest.approx(1000.0 / rate, rel=0.03)
    # Exponential, not merely the right mean: P(gap > mean) = 1/e (binomial s.e. 0.2 %).
    assert np.mean(g > 1000.0 / rate) == pytest.approx(math.exp(-1), abs=0.015)
    # And memoryless-looking: the coefficient of variation is 1 (a constant process has 0).
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.05)


def test_poisson_depends_only_on_the_generator_given() -> None:
    a = poisson_ms(50.0, 100, np.random.default_rng(3))
    b = poisson_ms(50.0, 100, np.random.default_rng(3))
    c = poisson_ms(50.0, 100, np.random.default_rng(4))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_constant_spacing_is_exact() -> None:
    out = constant_ms(40.0, 10)
    assert out.tolist() == [25.0 * i for i in range(1, 11)]
    assert np.array_equal(generate_ms("constant", 40.0, 10, np.random.default_rng(0)), out)


def test_pareto_gaps_are_lomax_with_kappa_giving_mean_one_over_rate() -> None:
    # The heavy tail (alpha = 1.25: infinite variance) makes the sample mean useless, so check
    # quantiles, whose sample error does not depend on the tail: a Lomax(alpha, kappa) gap has
    # quantile q at kappa * ((1 - q)^(-1/alpha) - 1). With n = 50 000 the sample median's
    # relative standard error is about 0.85 % and the 90th percentile's about 1.5 %; a 6 %
    # tolerance is > 4 standard errors. Two quantiles pin down both alpha and kappa.
    rate = 100.0
    alpha = PARETO_ALPHA
    kappa_ms = 1000.0 * (alpha - 1.0) / rate
    assert kappa_ms / (alpha - 1.0) == pytest.approx(1000.0 / rate)  # Lomax mean = 1/rate
    g = gaps(pareto_ms(rate, N, np.random.default_rng(2)))
    assert np.median(g) == pytest.approx(kappa_ms * (2 ** (1 / alpha) - 1), rel=0.06)
    assert np.quantile(g, 0.9) == pytest.approx(kappa_ms * (10 ** (1 / alpha) - 1), rel=0.06)
    # Bursty: far more very long gaps than a Poisson process of the same rate would have.
    long_gap = 10 * 1000.0 / rate
    assert np.mean(g > long_gap) == pytest.approx((1 + long_gap / kappa_ms) ** -alpha, rel=0.2)
    assert np.mean(g > long_gap) > 100 * math.exp(-10)


def test_pareto_scale_follows_the_rate() -> None:
    # Same random draws, twice the rate: every gap is exactly half as long.
    slow = pareto_ms(50.0, 1000, np.random.default_rng(9))
    fast = pareto_ms(100.0, 1000, np.random.default_rng(9))
    assert np.allclose(fast * 2, slow, rtol=1e-12)


def test_recorded_rescales_to_the_target_rate_exactly() -> None:
    ts = np.array([100.0, 100.5, 103.0, 104.0, 110.0])  # 4 gaps over 10 s: 0.4 req/s
    out = recorded_ms(ts, 2.0, 5)
    # (n - 1) gaps over the span: the rescaled mean rate is the target by construction.
    assert out[0] == 0.0
    assert (out.size - 1) / (out[-1] / 1000.0) == pytest.approx(2.0, rel=1e-12)
    # The shape of the trace is kept: relative gaps scale by one factor (0.4 / 2.0).
    assert np.allclose(out, (ts - ts[0]) * 1000.0 * 0.4 / 2.0)


def test_recorded_sorts_its_input() -> None:
    out = recorded_ms(np.array([3.0, 1.0, 2.0, 5.0]), 1.0, 4)
    assert np.all(np.diff(out) >= 0)
    assert out.tolist() == pytest.approx([0.0, 750.0, 1500.0, 3000.0])


def test_recorded_loops_when_more_requests_than_the_trace() -> None:
    ts = np.array([0.0, 1.0, 3.0, 4.0])  # mean gap 4/3 s
    out = recorded_ms(ts, 1.5, 11)
    assert out.size == 11
    assert np.all(np.diff(out) > 0)
    first = out[:4]
    # Each loop is the same pattern shifted by one period: the span plus one mean gap,
    # so the mean rate stays the target across loop seams too.
    period = out[4] - out[0]
    assert np.allclose(out[4:8], first + period)
    assert np.allclose(out[8:11], first[:3] + 2 * period)
    assert period == pytest.approx(4 * 1000.0 / 1.5)
    assert 8 / (out[8] / 1000.0) == pytest.approx(1.5)


def test_recorded_needs_two_distinct_timestamps() -> None:
    with pytest.raises(TraceError):
        recorded_ms(np.array([5.0, 5.0, 5.0]), 1.0, 3)
    with pytest.raises(TraceError):
        recorded_ms(np.array([5.0]), 1.0, 3)


def test_generate_rejects_bad_options() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(TraceError, match="--rate"):
        generate_ms("poisson", 0.0, 10, rng)
    with pytest.raises(TraceError, match="--rate"):
        generate_ms("constant", -5.0, 10, rng)
    with pytest.raises(TraceError, match="--arrival"):
        generate_ms("gamma", 10.0, 10, rng)
    with pytest.raises(TraceError, match="--trace"):
        generate_ms("recorded", 10.0, 10, rng)


def test_load_bundled_azure_trace() -> None:
    ts = load_timestamps(AZURE_TRACE)
    # The file has a header and 8819 data rows (CRLF line ends, no newline after the last).
    rows = [ln for ln in AZURE_TRACE.read_text().splitlines() if ln.strip()]
    assert rows[0].startswith("TIMESTAMP")
    assert ts.size == len(rows) - 1 == 8819
    # "2023-11-16 18:17:03.9799600": the 7-digit fraction cut to microseconds, read as UTC.
    first = dt.datetime(2023, 11, 16, 18, 17, 3, 979960, tzinfo=dt.UTC).timestamp()
    assert ts[0] == pytest.approx(first, abs=1e-6)
    last = dt.datetime(2023, 11, 16, 19, 14, 19, 928016, tzinfo=dt.UTC).timestamp()
    assert ts[-1] == pytest.approx(last, abs=1e-6)
    assert np.all(np.diff(ts) >= 0)
    # Rescaled to 50 req/s, it keeps that rate exactly over the whole trace and over loops.
    out = generate_ms("recorded", 50.0, 2 * ts.size + 7, np.random.default_rng(0), ts)
    n = ts.size
    assert (n - 1) / (out[n - 1] / 1000.0) == pytest.approx(50.0, rel=1e-9)
    assert out[2 * n] == pytest.approx(2 * n * 1000.0 / 50.0, rel=1e-9)
    assert np.all(np.diff(out) >= 0)


def test_load_plain_numbers_file(tmp_path: Path) -> None:
    f = tmp_path / "times.txt"
    f.write_text("0.5\n1.0\n\n2.25\n")
    assert load_timestamps(f).tolist() == [0.5, 1.0, 2.25]


def test_load_csv_with_numeric_time_column(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("id,Time_S\na,3.5\nb,1.5\nc,2\n")
    assert load_timestamps(f).tolist() == [3.5, 1.5, 2.0]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty"),
        ("\n  \n", "empty"),
        ("foo,bar\n1,2\n3,4\n", "header"),
        ("timestamp,x\n1.0,1\nnot-a-time,2\n", "row 3.timestamp"),
        ("1.0\n2.0\nabc\n", "one number"),
        ("7.0\n7.0\n", "two distinct"),
    ],
    ids=["empty", "blank-lines", "no-time-column", "garbage-cell", "garbage-line", "one-value"],
)
def test_bad_trace_files_raise_trace_error_naming_the_file(
    tmp_path: Path, content: str, needle: str
) -> None:
    f = tmp_path / "bad-trace.csv"
    f.write_text(content)
    with pytest.raises(TraceError) as info:
        load_timestamps(f)
    msg = str(info.value)
    assert str(f) in msg
    assert needle in msg
    assert "\n" not in msg


def test_missing_trace_file_raises_trace_error(tmp_path: Path) -> None:
    f = tmp_path / "nope.csv"
    with pytest.raises(TraceError) as info:
        load_timestamps(f)
    assert str(info.value).startswith(f"{f}: expected a readable trace file")

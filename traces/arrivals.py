"""Arrival processes: when requests arrive, in ms from 0 (paper 003, sections 6.1 and 6.2.3).

Every generator takes a seeded `numpy.random.Generator` (or none, when it needs no randomness) and
returns a sorted float64 array of n arrival times in milliseconds.
- poisson:  exponential inter-arrivals with mean 1/rate.
- pareto:   Pareto (Lomax) inter-arrivals with shape alpha = 1.25 and scale kappa = (alpha-1)/rate,
            so the mean inter-arrival is 1/rate and bursts are heavy-tailed (section 6.2.3).
- constant: exactly 1/rate apart (a camera).
- recorded: the timestamps of a real trace, rescaled so that their mean rate is `rate`, looped
            when more requests are asked for than the trace holds.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace file or arrival option that cannot be used; the message names what and why."""

    def __init__(self, source: str, field: str, expected: str, got: object = None) -> None:
        where = f"{source}: {field}" if field else source
        tail = "" if got is None else f", got {got!r}"
        super().__init__(f"{where}: expected {expected}{tail}")


ARRIVALS = ("poisson", "pareto", "constant", "recorded")
PARETO_ALPHA = 1.25
TIME_COLUMNS = ("timestamp", "timestamp_s", "time_s", "time", "arrival_s", "end_timestamp")
# the request rates a run may ask for: below one a week-and-a-half apart, arrival times in ms pass
# float's range (a rate of 1e-308 made every arrival inf, a run that silently served nothing)
MIN_RATE_RPS = 1e-6
MAX_RATE_RPS = 1e9
RATE_RANGE = f"from {MIN_RATE_RPS:g} to {MAX_RATE_RPS:g}"


def poisson_ms(rate_rps: float, n: int, rng: np.random.Generator) -> np.ndarray:
    out: np.ndarray = np.cumsum(rng.exponential(1000.0 / rate_rps, n))
    return out


def pareto_ms(
    rate_rps: float, n: int, rng: np.random.Generator, alpha: float = PARETO_ALPHA
) -> np.ndarray:
    kappa_ms = 1000.0 * (alpha - 1.0) / rate_rps
    out: np.ndarray = np.cumsum(rng.pareto(alpha, n) * kappa_ms)
    return out


def constant_ms(rate_rps: float, n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.float64) * (1000.0 / rate_rps)


def recorded_ms(timestamps_s: np.ndarray, rate_rps: float, n: int) -> np.ndarray:
    """Rescale recorded timestamps (seconds, any origin) to mean rate `rate_rps`; loop if short."""
    ts = np.sort(np.asarray(timestamps_s, dtype=np.float64))
    if ts.size < 2 or ts[-1] <= ts[0]:
        raise TraceError("trace", "", "at least two distinct timestamps")
    rel = ts - ts[0]
    span = rel[-1]
    observed_rate = (ts.size - 1) / span
    scale_ms = 1000.0 * observed_rate / rate_rps
    period = span + span / (ts.size - 1)  # one mean gap between the end and the next loop
    reps = -(-n // ts.size)
    looped = np.concatenate([rel + i * period for i in range(reps)])[:n]
    out: np.ndarray = looped * scale_ms
    return out


def generate_ms(
    kind: str, rate_rps: float, n: int, rng: np.random.Generator, trace: np.ndarray | None = None
) -> np.ndarray:
    """Arrival times for `kind` (one of ARRIVALS); `trace` is required for "recorded"."""
    if not MIN_RATE_RPS <= rate_rps <= MAX_RATE_RPS:
        raise TraceError("--rate", "", f"a request rate {RATE_RANGE} per second", rate_rps)
    if kind == "poisson":
        return poisson_ms(rate_rps, n, rng)
    if kind == "pareto":
        return pareto_ms(rate_rps, n, rng)
    if kind == "constant":
        return constant_ms(rate_rps, n)
    if kind == "recorded":
        if trace is None:
            raise TraceError("--arrival", "", "--trace FILE together with --arrival recorded")
        return recorded_ms(trace, rate_rps, n)
    raise TraceError("--arrival", "", f"one of {', '.join(ARRIVALS)}", kind)


def load_timestamps(path: str | Path) -> np.ndarray:
    """Timestamps in seconds from a trace file.

    Accepted: a CSV whose header has a TIMESTAMP column of dates ("2023-11-16 18:17:03.9799600",
    the Azure LLM inference traces; the 7-digit fraction is cut to 6) or a numeric column named
    one of TIME_COLUMNS (seconds); or a text file with one number (seconds) per line.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM is no part of the header
    except OSError as exc:
        raise TraceError(source, "", "a readable trace file", exc.strerror) from None
    except UnicodeDecodeError as exc:
        raise TraceError(source, "", f"a trace file in UTF-8 ({exc.reason})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise TraceError(source, "", "a trace with at least two timestamps", "an empty file")
    try:
        float(lines[0].split(",")[0])
        has_header = False
    except ValueError:
        has_header = True
    if not has_header:
        try:
            values = [float(ln.split(",")[0]) for ln in lines]
        except ValueError as exc:
            raise TraceError(source, "", "one number (seconds) per line", str(exc)) from None
        return _checked(np.array(values), source)
    reader = csv.DictReader(lines)
    rows = list(reader)
    # the header row's names (a row with more cells than it would add a key None)
    header = {h.strip().lower(): h for h in reader.fieldnames or []}
    col = next((header[c] for c in TIME_COLUMNS if c in header), None)
    if col is None:
        raise TraceError(source, "header", f"a column named one of {', '.join(TIME_COLUMNS)}")
    out = []
    for i, row in enumerate(rows):
        cell = (row.get(col) or "").strip()
        try:
            out.append(float(cell))
        except ValueError:
            try:
                out.append(_parse_datetime_s(cell))
            except ValueError:
                raise TraceError(
                    source, f"row {i + 2}.{col}", "seconds or a date-time", cell
                ) from None
    return _checked(np.array(out), source)


def _parse_datetime_s(cell: str) -> float:
    if "." in cell:
        head, frac = cell.rsplit(".", 1)
        cell = f"{head}.{frac[:6]}"
    return dt.datetime.fromisoformat(cell).replace(tzinfo=dt.UTC).timestamp()


def _checked(ts: np.ndarray, source: str) -> np.ndarray:
    if ts.size < 2 or float(ts.max()) <= float(ts.min()) or not np.all(np.isfinite(ts)):
        raise TraceError(source, "", "at least two distinct finite timestamps")
    return ts

"""Network link traces (Mahimahi format) and a pure, in-process FIFO link emulator.

Mahimahi format (ravinet/mahimahi, `mm-link`): a text file with one line per delivery
opportunity, the integer millisecond at which it occurs, counted from the start of the trace.
Each opportunity lets one packet of up to 1500 bytes cross the link; several lines may repeat a
millisecond (several packets in that millisecond). Timestamps never decrease. The trace loops
with period equal to its last timestamp, as `mm-link` does: the opportunities of loop k are the
file's timestamps plus k * period, so a file holding just "1" is a 12 Mbit/s link.

WiFi capacity series (`*.pitree-trace`, transys-project/zhuge): lines `time_s throughput_Mbit/s`.
They are converted to opportunities: the trace starts at the first sample, each rate holds until
the next sample and the last one for the median gap between samples; within each interval the
bytes the rate carries are cut into 1500-byte packets spread evenly in time, a fractional packet
carrying over into the next interval, so the number of opportunities times 1500 bytes equals the
integral of the series (to under one packet). Each packet's opportunity is the first whole
millisecond at which its last byte has arrived. Files are told apart by content: two numbers on
a line is a series, one integer is Mahimahi.

Delivery model (`Link`): a message of n bytes is cut into ceil(n / 1500) packets, and every
packet takes one opportunity of its own: the first one not before the time the message is handed
to the link and after the opportunity of the packet before it, whichever message that packet
belonged to (a FIFO queue in front of the link; messages never share an opportunity, so the
unused bytes of a message's last opportunity are lost, as with real packets). The message is
delivered at its last packet's opportunity. Link time t reads the trace at (t + offset) mod
period. Because packets of one message take consecutive opportunities, `Link.transmit` costs one
binary search over one period, O(log m) for a trace of m opportunities, whatever the message
size.

Everything here is pure: time is always passed in, nothing reads a clock.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces import DATA_DIR
from traces.arrivals import TraceError

PACKET_BYTES = 1500
# delivery opportunities a scaled trace may hold per period (8 bytes each: 160 MB); a factor of
# 1e300 overflowed the counts into negative ones
MAX_OPPORTUNITIES = 2 * 10**7
NET_TRACES_DIR = DATA_DIR / "net_traces"
SERIES_SUFFIX = ".pitree-trace"
_NAME_PREFIXES = ("mahimahi_", "zhuge_")


class LinkTraceError(TraceError):
    """A network trace file or name that cannot be used; the message names the file, the line
    (where there is one) and what was expected, in one sentence."""


@dataclass(frozen=True, eq=False)
class LinkTrace:
    """A looping schedule of delivery opportunities.

    Guarantees: `opportunities_ms` is a read-only, sorted int64 array of at least one value, each
    in [0, period_ms] and each one 1500-byte delivery opportunity; `period_ms` is a positive
    integer; loop k holds the opportunities plus k * period_ms (for every integer k).
    """

    name: str
    opportunities_ms: np.ndarray
    period_ms: int
    _canonical_ms: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        raw = np.asarray(self.opportunities_ms).reshape(-1)
        whole = raw.dtype.kind in "iu" or (
            raw.dtype.kind == "f" and bool(np.all(np.isfinite(raw) & (raw == np.floor(raw))))
        )
        if not whole:
            raise LinkTraceError(self.name, "opportunities_ms", "whole milliseconds")
        opp = raw.astype(np.int64)
        if isinstance(self.period_ms, bool) or not isinstance(self.period_ms, int | np.integer):
            raise LinkTraceError(self.name, "period_ms", "an integer", self.period_ms)
        period = int(self.period_ms)
        if period <= 0:
            raise LinkTraceError(self.name, "period_ms", "a period above 0 ms", period)
        if opp.size == 0:
            raise LinkTraceError(self.name, "", "at least one delivery opportunity")
        if np.any(np.diff(opp) < 0) or opp[0] < 0 or opp[-1] > period:
            raise LinkTraceError(
                self.name, "opportunities_ms", f"sorted integers from 0 to {period} ms"
            )
        opp.setflags(write=False)
        # the same looped times, folded into [0, period): those at the period move to 0
        at_period = int(np.count_nonzero(opp == period))
        canonical = np.concatenate([np.zeros(at_period, np.int64), opp[: opp.size - at_period]])
        canonical.setflags(write=False)
        object.__setattr__(self, "opportunities_ms", opp)
        object.__setattr__(self, "period_ms", period)
        object.__setattr__(self, "_canonical_ms", canonical)

    def scaled(self, factor: float) -> LinkTrace:
        """The same link with `factor` times its capacity at every moment (the paper scales LTE
        by 10 to stand for 5G): opportunity i becomes floor((i+1)f) - floor(if) opportunities at
        the same millisecond, so the temporal pattern stays and the mean scales by f (to under
        one packet per period)."""
        if not (math.isfinite(factor) and factor > 0):
            raise LinkTraceError(self.name, "scale", "a positive finite factor", factor)
        most = MAX_OPPORTUNITIES / max(1, self.opportunities_ms.size)
        if factor > most:
            expected = f"a factor up to {most:.4g} ({MAX_OPPORTUNITIES} packets per period)"
            raise LinkTraceError(self.name, "scale", expected, factor)
        i = np.arange(self.opportunities_ms.size + 1, dtype=np.float64)
        counts = np.diff(np.floor(i * factor)).astype(np.int64)
        if counts.sum() == 0:
            raise LinkTraceError(self.name, "scale", "a factor that leaves at least one packet")
        name = f"{self.name} x{factor:g}"
        return LinkTrace(name, np.repeat(self.opportunities_ms, counts), self.period_ms)

    def mean_mbps(self) -> float:
        """Mean capacity over one period, Mbit/s (1500-byte opportunities)."""
        bits = self.opportunities_ms.size * PACKET_BYTES * 8
        return bits / (self.period_ms * 1000.0)

    def series_mbps(self, window_ms: float = 1000.0) -> tuple[np.ndarray, np.ndarray]:
        """Capacity per window over one period: (window start times in s, Mbit/s per window).

        Windows are [i * window_ms, (i + 1) * window_ms) of trace time; the last one is cut at
        the period and its rate is taken over its own length.
        """
        if not math.isfinite(window_ms) or window_ms <= 0:
            raise LinkTraceError("window_ms", "", "a finite window above 0 ms", window_ms)
        starts_ms = np.arange(0.0, float(self.period_ms), float(window_ms))
        edges_ms = np.append(starts_ms, float(self.period_ms))
        counts = np.diff(np.searchsorted(self._canonical_ms, edges_ms, side="left"))
        mbps = counts * (PACKET_BYTES * 8) / (np.diff(edges_ms) * 1000.0)
        return starts_ms / 1000.0, mbps

    def throughput_mbps(self, t0_ms: float, t1_ms: float) -> float:
        """Capacity over trace time [t0_ms, t1_ms), any window (the trace loops), Mbit/s."""
        if not (math.isfinite(t0_ms) and math.isfinite(t1_ms)) or t1_ms <= t0_ms:
            raise LinkTraceError(
                "throughput window", "", "finite times with t1_ms above t0_ms", (t0_ms, t1_ms)
            )
        count = _first_index_at_or_after(self, t1_ms) - _first_index_at_or_after(self, t0_ms)
        return count * (PACKET_BYTES * 8) / ((t1_ms - t0_ms) * 1000.0)


def _first_index_at_or_after(trace: LinkTrace, t_ms: float) -> int:
    """Global index of the first looped opportunity at trace time >= t_ms.

    Global index g is opportunity g mod m of loop g // m (m opportunities per loop, folded into
    [0, period)); its trace time is `_time_of_index(trace, g)`, non-decreasing in g.
    """
    canonical = trace._canonical_ms
    period = trace.period_ms
    loop = math.floor(t_ms / period)
    rest = t_ms - loop * period
    if rest < 0:  # rounding in t_ms / period
        loop, rest = loop - 1, rest + period
    elif rest >= period:
        loop, rest = loop + 1, rest - period
    return loop * canonical.size + int(np.searchsorted(canonical, rest, side="left"))


def _time_of_index(trace: LinkTrace, index: int) -> float:
    loop, i = divmod(index, trace._canonical_ms.size)
    return float(trace._canonical_ms[i]) + float(loop * trace.period_ms)


class Link:
    """A FIFO link whose capacity follows a trace; pure (time is passed in), single-threaded.

    `Link(trace, offset_ms, packet_bytes)`: link time t reads the trace at (t + offset_ms) mod
    period; each opportunity carries one packet of `packet_bytes` bytes (1500 in Mahimahi).
    """

    def __init__(
        self, trace: LinkTrace, offset_ms: float = 0.0, packet_bytes: int = PACKET_BYTES
    ) -> None:
        if not math.isfinite(offset_ms):
            raise LinkTraceError(trace.name, "offset_ms", "a finite offset in ms", offset_ms)
        if isinstance(packet_bytes, bool) or not isinstance(packet_bytes, int) or packet_bytes < 1:
            raise LinkTraceError(
                trace.name, "packet_bytes", "an integer of at least 1", packet_bytes
            )
        self.trace = trace
        self.offset_ms = float(offset_ms)
        self.packet_bytes = packet_bytes
        self._next_index: int | None = None  # global index of the first unused opportunity
        self._busy_until_ms = -math.inf

    @property
    def busy_until_ms(self) -> float:
        """Link time at which the last message handed over so far is delivered (the queue has
        drained); -inf before the first message. A sender's backlog at `now_ms` is
        max(0, busy_until_ms - now_ms)."""
        return self._busy_until_ms

    def transmit(self, nbytes: int, now_ms: float) -> float:
        """Queue a message of `nbytes` bytes at link time `now_ms`; return the link time at which
        its last byte is delivered.

        Guarantees: the result is >= now_ms and >= every earlier message's delivery (FIFO), and
        is non-decreasing in nbytes for the same link state; nbytes == 0 returns now_ms and
        leaves the link unchanged. Calls may come with any now_ms, in any order.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 0:
            raise LinkTraceError(self.trace.name, "nbytes", "a whole number of bytes >= 0", nbytes)
        if not math.isfinite(now_ms):
            raise LinkTraceError(self.trace.name, "now_ms", "a finite time in ms", now_ms)
        if nbytes == 0:
            return float(now_ms)
        packets = -(-int(nbytes) // self.packet_bytes)
        first = _first_index_at_or_after(self.trace, now_ms + self.offset_ms)
        if self._next_index is not None:
            first = max(first, self._next_index)
        last = first + packets - 1
        self._next_index = last + 1
        deliver_ms = max(_time_of_index(self.trace, last) - self.offset_ms, float(now_ms))
        self._busy_until_ms = max(self._busy_until_ms, deliver_ms)
        return deliver_ms


def load_trace(path: str | Path) -> LinkTrace:
    """Read a Mahimahi trace or a `time_s throughput_Mbit/s` series (told apart by content).

    The trace is named after the file. Raises LinkTraceError naming the file, the line and what
    was expected for a missing, empty or malformed file.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LinkTraceError(
            source, "", "an existing, readable network trace file", exc.strerror or str(exc)
        ) from None
    lines = text.splitlines()
    first = next((ln.split() for ln in lines if ln.strip()), None)
    if first is None:
        raise LinkTraceError(
            source,
            "",
            "at least one line (Mahimahi: one integer millisecond per line), not an empty file",
        )
    name = Path(path).name
    if len(first) == 2:
        return _parse_series(source, name, lines)
    return _parse_mahimahi(source, name, lines)


def _parse_mahimahi(source: str, name: str, lines: list[str]) -> LinkTrace:
    values: list[int] = []
    previous = 0
    last_line = 0
    for number, line in enumerate(lines, start=1):
        cell = line.strip()
        if not cell:
            continue
        try:
            value = int(cell)
            bound = f" (at least {previous})"
        except ValueError:
            value, bound = -1, ""
        if value < previous:
            raise LinkTraceError(
                f"{source} line {number}", "", f"a non-decreasing integer millisecond{bound}", cell
            )
        values.append(value)
        previous = value
        last_line = number
    if previous <= 0:
        raise LinkTraceError(
            f"{source} line {last_line}",
            "",
            "a last timestamp above 0 ms (it is the period the trace loops with)",
            lines[last_line - 1].strip(),
        )
    return LinkTrace(name, np.array(values, dtype=np.int64), previous)


def _parse_series(source: str, name: str, lines: list[str]) -> LinkTrace:
    times_s: list[float] = []
    rates_mbps: list[float] = []
    for number, line in enumerate(lines, start=1):
        cell = line.strip()
        if not cell:
            continue
        where = f"{source} line {number}"
        parts = cell.split()
        try:
            if len(parts) != 2:
                raise ValueError
            t_s, rate = float(parts[0]), float(parts[1])
        except ValueError:
            raise LinkTraceError(
                where, "", "two numbers, time_s and throughput_Mbit/s", cell
            ) from None
        if not math.isfinite(t_s) or (times_s and t_s <= times_s[-1]):
            after = f" above the previous line's {times_s[-1]:g}" if times_s else ""
            raise LinkTraceError(where, "", f"a finite time_s{after}", cell)
        if not math.isfinite(rate) or rate < 0:
            raise LinkTraceError(where, "", "a finite throughput_Mbit/s of at least 0", cell)
        times_s.append(t_s)
        rates_mbps.append(rate)
    if len(times_s) < 2:
        raise LinkTraceError(source, "", "at least two samples 'time_s throughput_Mbit/s'")
    return series_to_trace(name, np.array(times_s), np.array(rates_mbps), source=source)


def series_to_trace(
    name: str, times_s: np.ndarray, rates_mbps: np.ndarray, source: str | None = None
) -> LinkTrace:
    """Opportunities for a throughput series (see the module docstring for the model).

    `times_s` strictly increasing (at least two), `rates_mbps` >= 0, same length. Sample edges
    are rounded to whole ms; the trace starts at the first sample and its period is the last
    sample plus the median gap between samples.
    """
    where = source or name
    times = np.asarray(times_s, dtype=np.float64)
    rates = np.asarray(rates_mbps, dtype=np.float64)
    if times.shape != rates.shape or times.ndim != 1 or times.size < 2:
        raise LinkTraceError(where, "", "at least two samples of time_s and throughput_Mbit/s")
    rel_ms = (times - times[0]) * 1000.0
    edges_ms = np.rint(np.append(rel_ms, rel_ms[-1] + float(np.median(np.diff(rel_ms)))))
    period_ms = int(edges_ms[-1])
    if period_ms <= 0:
        raise LinkTraceError(where, "", "a series spanning at least 1 ms")
    bytes_per_ms = rates * (1e6 / 8.0 / 1000.0)
    cum_bytes = np.concatenate([[0.0], np.cumsum(bytes_per_ms * np.diff(edges_ms))])
    packets = math.floor(float(cum_bytes[-1]) / PACKET_BYTES + 1e-9)
    if packets == 0:
        raise LinkTraceError(where, "", "a series that carries at least one 1500-byte packet")
    targets = np.arange(1, packets + 1, dtype=np.float64) * PACKET_BYTES
    interval = np.clip(np.searchsorted(cum_bytes, targets, side="left") - 1, 0, rates.size - 1)
    # interval j holds the target: cum_bytes[j] < target <= cum_bytes[j + 1], so its rate is > 0
    done_ms = edges_ms[interval] + (targets - cum_bytes[interval]) / bytes_per_ms[interval]
    opportunities = np.clip(np.ceil(done_ms - 1e-6), 0, period_ms).astype(np.int64)
    return LinkTrace(name, opportunities, period_ms)  # sorted: done_ms never decreases


def _short_name(file_name: str) -> str:
    short = file_name
    for prefix in _NAME_PREFIXES:
        short = short.removeprefix(prefix)
    short = short.removesuffix(SERIES_SUFFIX)
    return short.lower().replace("_", "-")


def bundled_traces() -> dict[str, Path]:
    """Short names (e.g. "verizon-lte-short.up", "office-wifi-0") of the network traces bundled
    in traces/data/net_traces/, mapped to their files; licence and readme files are left out."""
    out: dict[str, Path] = {}
    for path in sorted(NET_TRACES_DIR.glob("*/*")):
        if path.is_file() and path.suffix not in (".txt", ".md"):
            out[_short_name(path.name)] = path
    return out


def resolve_trace(name_or_path: str) -> LinkTrace:
    """Load a trace from a path, or else a bundled trace by its short name (case-insensitive),
    named so. Raises LinkTraceError listing the bundled names when it is neither."""
    path = Path(name_or_path)
    if path.is_file():
        return load_trace(path)
    bundled = bundled_traces()
    key = name_or_path.strip().lower()
    if key in bundled:
        return dataclasses.replace(load_trace(bundled[key]), name=key)
    raise LinkTraceError(
        name_or_path,
        "",
        f"an existing trace file or a bundled trace name ({', '.join(bundled)})",
    )

"""Network traces and the in-process link (traces/network.py), on the bundled files and on
small hand-made traces whose delivery times can be worked out by hand."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.arrivals import TraceError
from traces.network import (
    Link,
    LinkTrace,
    LinkTraceError,
    bundled_traces,
    load_trace,
    resolve_trace,
)

# mean Mbit/s of the bundled Mahimahi traces, from /work/shared/data/README.md (1 s windows)
README_MEAN_MBPS = {
    "verizon-lte-short.up": 5.95,
    "tmobile-lte-short.up": 13.32,
    "att-lte-driving-2016.up": 1.91,
    "verizon-lte-short.down": 5.03,
    "tmobile-lte-short.down": 16.65,
    "att-lte-driving-2016.down": 4.56,
}
SERIES = ("office-wifi-0", "rest-wifi-0")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def hand_trace() -> LinkTrace:
    """Opportunities at 2, 2, 5 and 10 ms; period 10, so loop k has 10k+0, 10k+2, 10k+2, 10k+5
    (the opportunity at 10 is the one at 0 of the next loop)."""
    return LinkTrace("hand", np.array([2, 2, 5, 10]), 10)


# --- bundled files --------------------------------------------------------------------------
def test_bundled_names_cover_every_bundled_trace() -> None:
    names = bundled_traces()
    assert set(names) == set(README_MEAN_MBPS) | set(SERIES)
    for path in names.values():
        assert path.is_file()


@pytest.mark.parametrize("name", sorted(README_MEAN_MBPS))
def test_bundled_mahimahi_means_match_the_readme(name: str) -> None:
    trace = resolve_trace(name)
    assert trace.name == name
    assert trace.opportunities_ms.dtype == np.int64
    assert np.all(np.diff(trace.opportunities_ms) >= 0)
    assert trace.period_ms == int(trace.opportunities_ms[-1])
    assert trace.mean_mbps() == pytest.approx(README_MEAN_MBPS[name], rel=0.10)
    starts_s, mbps = trace.series_mbps(1000.0)
    assert starts_s.shape == mbps.shape == (math.ceil(trace.period_ms / 1000),)
    assert np.allclose(np.diff(starts_s), 1.0)
    assert np.all(mbps >= 0)
    # windows of equal length average to the mean (the last, shorter one weighs less)
    full = mbps[:-1] if trace.period_ms % 1000 else mbps
    assert float(np.mean(full)) == pytest.approx(trace.mean_mbps(), rel=0.02)


@pytest.mark.parametrize("name", SERIES)
def test_series_conversion_keeps_the_bytes(name: str) -> None:
    path = bundled_traces()[name]
    raw = np.loadtxt(path)
    times_s, rates_mbps = raw[:, 0], raw[:, 1]
    gaps_s = np.append(np.diff(times_s), np.median(np.diff(times_s)))
    series_bytes = float(np.sum(rates_mbps * gaps_s)) * 1e6 / 8
    trace = load_trace(path)
    delivered_bytes = trace.opportunities_ms.size * 1500
    assert delivered_bytes == pytest.approx(series_bytes, rel=0.01)
    assert trace.period_ms == pytest.approx((times_s[-1] - times_s[0] + gaps_s[-1]) * 1000, abs=1)
    assert 20 < trace.mean_mbps() < 35  # the README: 26-30 Mbit/s on average


def test_format_is_told_by_content_not_by_extension(tmp_path: Path) -> None:
    series = bundled_traces()["office-wifi-0"]
    renamed = tmp_path / "office.up"
    shutil.copy(series, renamed)
    assert load_trace(renamed).opportunities_ms.size == load_trace(series).opportunities_ms.size
    mahimahi = write(tmp_path, "odd.pitree-trace", "3\n3\n6\n")
    trace = load_trace(mahimahi)
    assert trace.opportunities_ms.tolist() == [3, 3, 6]
    assert trace.period_ms == 6


def test_series_by_hand(tmp_path: Path) -> None:
    # 12 Mbit/s for 1 s (a packet every 1 ms), then 6 Mbit/s for the median gap, 1 s (every 2 ms)
    trace = load_trace(write(tmp_path, "s.txt", "0.5 12\n1.5 6\n"))
    assert trace.period_ms == 2000
    expected = list(range(1, 1001)) + list(range(1002, 2001, 2))
    assert trace.opportunities_ms.tolist() == expected


def test_series_carries_fractional_packets_over(tmp_path: Path) -> None:
    # 1 Mbit/s in 10 ms samples is 1250 bytes per sample: less than a packet in every one
    lines = "".join(f"{i * 0.01:.2f} 1.0\n" for i in range(100))
    trace = load_trace(write(tmp_path, "s.txt", lines))
    assert trace.period_ms == 1000
    assert trace.opportunities_ms.size == 125_000 // 1500  # 83
    assert np.all(np.diff(trace.opportunities_ms) >= 6)  # 1500 bytes take 12 ms, spread evenly


def test_mahimahi_file_by_hand(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "x.up", "2\n2\n\n5\n10\n"))
    assert trace.name == "x.up"
    assert trace.opportunities_ms.tolist() == [2, 2, 5, 10]
    assert trace.period_ms == 10
    assert trace.mean_mbps() == pytest.approx(4 * 12000 / 10 / 1000)


def test_resolve_accepts_paths_and_bundled_names_and_lists_them_otherwise(
    tmp_path: Path,
) -> None:
    assert resolve_trace(str(write(tmp_path, "one.down", "1\n"))).mean_mbps() == 12.0
    assert resolve_trace("Verizon-LTE-short.UP").name == "verizon-lte-short.up"
    with pytest.raises(LinkTraceError) as err:
        resolve_trace("no-such-link")
    message = str(err.value)
    assert "no-such-link" in message
    assert "verizon-lte-short.up" in message and "office-wifi-0" in message


# --- malformed files ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("1\n2\nabc\n", 3, "expected a non-decreasing integer millisecond, got 'abc'"),
        ("5\n3\n", 2, "expected a non-decreasing integer millisecond (at least 5), got '3'"),
        ("-1\n4\n", 1, "(at least 0), got '-1'"),
        ("1\n1.5\n", 2, "got '1.5'"),
        ("0\n0\n", 2, "a last timestamp above 0 ms"),
        ("1 10\n2 x\n", 2, "two numbers, time_s and throughput_Mbit/s, got '2 x'"),
        ("1 10\n2 3 4\n", 2, "two numbers"),
        ("1 10\n1 5\n", 2, "a finite time_s above the previous line's 1"),
        ("1 10\n\n2 -5\n", 3, "a finite throughput_Mbit/s of at least 0"),
        ("1 10\n2 nan\n", 2, "throughput_Mbit/s"),
    ],
)
def test_malformed_lines_are_named(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path, "bad.up", text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path} line {line}: expected ")
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "not an empty file"),
        ("\n  \n", "not an empty file"),
        ("1 10\n", "at least two samples"),
        ("0 0\n1 0\n", "at least one 1500-byte packet"),
    ],
)
def test_unusable_files_are_named(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, "bad.down", text)
    with pytest.raises(LinkTraceError) as err:
        load_trace(path)
    assert str(err.value).startswith(f"{path}: expected ")
    assert words in str(err.value)


def test_missing_file_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "absent.up"
    with pytest.raises(LinkTraceError) as err:
        load_trace(path)
    assert str(err.value) == (
        f"{path}: expected an existing, readable network trace file, "
        "got 'No such file or directory'"
    )


# --- the link -------------------------------------------------------------------------------
def test_link_delivers_at_the_last_packets_opportunity() -> None:
    cases: list[tuple[int, float, float]] = [(1, 1, 2.0), (1500, 1, 2.0), (3000, 1, 2.0)]
    cases += [(3001, 1, 5.0), (4500, 1, 5.0)]
    cases += [(6000, 1, 10.0), (9000, 1, 12.0), (1, 2.5, 5.0), (1, 0, 0.0), (1, 10, 10.0)]
    cases += [(1, 11, 12.0), (12000, 11, 30.0)]  # 12, 12, 15, 20, 22, 22, 25, 30
    for nbytes, now_ms, deliver_ms in cases:
        assert Link(hand_trace()).transmit(nbytes, now_ms) == deliver_ms, (nbytes, now_ms)


def test_link_queues_messages_fifo_and_never_shares_an_opportunity() -> None:
    link = Link(hand_trace())
    assert link.busy_until_ms == -math.inf
    assert link.transmit(4500, 1) == 5.0  # opportunities 2, 2, 5
    assert link.busy_until_ms == 5.0
    assert link.transmit(1500, 3) == 10.0  # queued behind: 5 is taken, next is 10
    assert link.transmit(1, 11) == 12.0  # first of the two at 12
    assert link.transmit(1, 12) == 12.0  # the second one at 12, a message of its own
    assert link.transmit(1, 12) == 15.0
    assert link.transmit(0, 13) == 13.0  # nothing to send: delivered at once, link unchanged
    assert link.busy_until_ms == 15.0
    assert link.transmit(1, 31) == 32.0  # idle link: the first opportunity from now
    assert link.transmit(3000, 31) == 35.0  # 32 (second one), 35


def test_link_offset_shifts_the_trace() -> None:
    # link time t reads trace time t + 3: trace opportunities 5, 10, 12, 12 are link 2, 7, 9, 9
    assert Link(hand_trace(), offset_ms=3).transmit(1, 0) == 2.0
    assert Link(hand_trace(), offset_ms=3).transmit(1500 * 4, 0) == 9.0
    assert Link(hand_trace(), offset_ms=-1).transmit(1, 0) == 1.0  # trace -1 -> 0, link 1
    assert Link(hand_trace(), offset_ms=2.5).transmit(1, 0) == 2.5  # trace 5 at link 2.5
    link = Link(hand_trace(), offset_ms=1000.0)  # whole periods change nothing
    assert [link.transmit(1500, 1) for _ in range(3)] == [2.0, 2.0, 5.0]


def test_link_packet_size_and_large_messages() -> None:
    assert Link(hand_trace(), packet_bytes=100).transmit(250, 1) == 5.0  # 3 packets
    one_per_ms = LinkTrace("12mbps", np.array([1]), 1)
    assert Link(one_per_ms).transmit(10_000_000, 0) == 6666.0  # 6667 packets from 0
    assert Link(one_per_ms).transmit(10_000_000, 0.5) == 6667.0


def test_link_rejects_bad_input() -> None:
    link = Link(hand_trace())
    with pytest.raises(LinkTraceError, match="nbytes"):
        link.transmit(-1, 0)
    with pytest.raises(LinkTraceError, match="now_ms"):
        link.transmit(1, math.nan)
    with pytest.raises(LinkTraceError, match="packet_bytes"):
        Link(hand_trace(), packet_bytes=0)


def test_trace_windows_by_hand() -> None:
    trace = hand_trace()
    starts_s, mbps = trace.series_mbps(5.0)
    assert starts_s.tolist() == [0.0, 0.005]
    assert mbps.tolist() == pytest.approx([3 * 12000 / 5 / 1000, 1 * 12000 / 5 / 1000])
    assert trace.throughput_mbps(0, 10) == pytest.approx(4.8)
    assert trace.throughput_mbps(3, 13) == pytest.approx(4.8)  # 5, 10, 12, 12
    assert trace.throughput_mbps(3, 4) == 0.0
    assert trace.throughput_mbps(-8, -7) == pytest.approx(24.0)  # -8 is loop -1's 2, 2
    with pytest.raises(LinkTraceError):
        trace.throughput_mbps(5, 5)


# --- properties against a packet-by-packet reference --------------------------------------
def reference_deliveries(
    opportunities: list[int], period: int, offset_ms: float, messages: list[tuple[int, float]]
) -> list[float]:
    """One packet at a time over an explicit list of looped opportunities."""
    xs = [now + offset_ms for _, now in messages]
    loops = range(math.floor(min(xs) / period) - 1, math.ceil(max(xs) / period) + 60)
    times = sorted(o % period + k * period for k in loops for o in opportunities)
    out: list[float] = []
    used = -1
    for nbytes, now_ms in messages:
        if nbytes == 0:
            out.append(now_ms)
            continue
        for _ in range(-(-nbytes // 1500)):
            used = next(i for i in range(used + 1, len(times)) if times[i] >= now_ms + offset_ms)
        out.append(times[used] - offset_ms)
    return out


traces_st = (
    st.lists(st.integers(0, 40), min_size=1, max_size=12)
    .map(sorted)
    .filter(lambda opp: opp[-1] > 0)
)
messages_st = st.lists(
    st.tuples(st.integers(0, 9000), st.floats(0, 60, allow_nan=False)), min_size=1, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(traces_st, st.sampled_from([0.0, 0.5, 3.0, -7.25, 100.0]), messages_st)
def test_link_matches_packet_by_packet_reference(
    opportunities: list[int], offset_ms: float, messages: list[tuple[int, float]]
) -> None:
    link = Link(LinkTrace("t", np.array(opportunities), opportunities[-1]), offset_ms)
    got = [link.transmit(n, now) for n, now in messages]
    want = reference_deliveries(opportunities, opportunities[-1], offset_ms, messages)
    assert got == pytest.approx(want, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(traces_st, messages_st, st.integers(0, 9000), st.integers(0, 9000))
def test_delivery_is_monotone_in_size_and_fifo(
    opportunities: list[int], messages: list[tuple[int, float]], a: int, b: int
) -> None:
    trace = LinkTrace("t", np.array(opportunities), opportunities[-1])
    link = Link(trace)
    nows = sorted(now for _, now in messages)
    deliveries = [link.transmit(n, now) for (n, _), now in zip(messages, nows, strict=True)]
    sent = [d for d, (n, _) in zip(deliveries, messages, strict=True) if n > 0]
    assert sent == sorted(sent)  # FIFO: a later message is never delivered earlier
    assert all(d >= now for d, now in zip(deliveries, nows, strict=True))
    small, large = sorted((a, b))
    before = Link(trace)
    after = Link(trace)
    for (n, _), now in zip(messages, nows, strict=True):
        before.transmit(n, now)
        after.transmit(n, now)
    assert before.transmit(small, nows[-1]) <= after.transmit(large, nows[-1])

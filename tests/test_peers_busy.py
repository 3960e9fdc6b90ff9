"""bench/peers_busy.py: layerbatch's time shares over one run, read from the /metrics page the
server itself renders."""

from __future__ import annotations

import pytest

from bench.peers_busy import busy_counters, busy_line, busy_shares
from server.metrics import Metrics


def page(step_ms: float, decode_ms: float, gaps_ms: list[float], plans_us: list[float]) -> str:
    m = Metrics()
    m.busy_ms["step"] += step_ms
    m.busy_ms["decode"] += decode_ms
    for g in gaps_ms:
        m.step_gap.observe(g)
    for us in plans_us:
        m.plan.observe(us)
    return m.render({})


def test_counters_are_read_from_the_servers_own_page_in_ms() -> None:
    got = busy_counters(page(750.5, 120.25, [1.0, 2.5], [300.0, 700.0]))
    assert got == {"steps": 750.5, "decodes": 120.25, "stacked": 0.0, "gaps": 3.5, "plans": 1.0}


def test_a_fresh_server_counts_nothing_yet() -> None:
    assert set(busy_counters(Metrics().render({})).values()) == {0.0}


def test_shares_are_each_counters_growth_over_the_wall_time() -> None:
    before = busy_counters(page(100.0, 10.0, [1.0], [500.0]))
    after = busy_counters(page(900.0, 130.0, [1.0, 40.0], [500.0, 79_500.0]))
    shares = busy_shares(before, after, 1000.0)
    assert shares == {"steps": 0.8, "decodes": 0.12, "stacked": 0.0, "gaps": 0.04, "plans": 0.08}
    assert busy_line(shares) == "steps 80% decodes 12% gaps 4% plans 8%"


def test_a_run_without_duration_is_refused() -> None:
    zero = busy_counters(Metrics().render({}))
    with pytest.raises(ValueError, match="wall_ms"):
        busy_shares(zero, zero, 0.0)


def test_counters_keep_full_precision_on_a_long_running_server() -> None:
    """A day of work is about 1e8 ms; a 20 s window must still read to the microsecond."""
    before = busy_counters(page(86_400_000.125, 0.0, [], []))
    after = busy_counters(page(86_420_000.625, 0.0, [], []))
    assert after["steps"] - before["steps"] == 20_000.5

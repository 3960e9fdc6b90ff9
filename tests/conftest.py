"""Shared pytest hooks."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """How far dp-time (--exact, Theorem 1: best over FIFO segmentations) is from the best over
    all schedules, on the random cases of tests/test_dp_optimality.py."""
    from tests.sched_cases import DP_GAP_KEY, HEURISTIC_KEY

    heuristic = config.stash.get(HEURISTIC_KEY, [])
    if heuristic:
        terminalreporter.section("dp-time app order above 6 apps: heuristic vs exact search")
        terminalreporter.write_line(
            f"{len(heuristic)} cases of 8 apps; objective / exact: "
            f"mean {sum(heuristic) / len(heuristic):.4f}, max {max(heuristic):.4f}"
        )
    ratios = config.stash.get(DP_GAP_KEY, [])
    if not ratios:
        return
    strict = sum(1 for r in ratios if r > 1 + 1e-9)
    terminalreporter.section("dp-time exact vs best over all schedules")
    terminalreporter.write_line(
        f"{len(ratios)} cases; the best schedule is strictly better in {strict} "
        f"({100 * strict / len(ratios):.1f}%); dp-time / best: "
        f"mean {sum(ratios) / len(ratios):.4f}, max {max(ratios):.4f}"
    )

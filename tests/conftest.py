"""Shared pytest hooks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

# pytest stash key: the lines tests report through the `report` fixture ("figures" section)
FIGURES_KEY = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """`report(line)` keeps one line of measured figures; pytest prints them all at the end of
    the run, in the terminal summary under the heading "figures"."""
    lines = pytestconfig.stash.setdefault(FIGURES_KEY, [])
    return lines.append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """The figures tests reported through `report`; how far dp-time (--exact, Theorem 1: best
    over FIFO segmentations) is from the best over all schedules, on the random cases of
    tests/test_dp_optimality.py."""
    from scheduler.search import EXACT_APPS
    from tests.sched_cases import DP_GAP_KEY, HEURISTIC_KEY

    figures = config.stash.get(FIGURES_KEY, [])
    if figures:
        terminalreporter.section("figures")
        for line in figures:
            terminalreporter.write_line(line)
    heuristic = config.stash.get(HEURISTIC_KEY, [])
    if heuristic:
        terminalreporter.section(
            f"dp-time app order above {EXACT_APPS} apps: heuristic vs exact search"
        )
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

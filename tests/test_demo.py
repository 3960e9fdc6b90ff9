"""`layerbatch demo`, the first command of the README: the real server on this machine under the
built-in load, one policy after another at each offered rate (client/demo.py), run as a user
runs it; and the two summaries the demo draws from its rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from client.demo import ON_TIME_TARGET, capacities, parting_rate
from tests.test_cli import run_cli


def test_demo_serves_every_policy_at_every_rate_and_draws_the_comparison(
    tmp_path: Path,
) -> None:
    plot = tmp_path / "demo.png"
    done = run_cli(tmp_path, "demo", "--rate", "12,6", "--duration", "1", "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = {}
    row = r"\s*([\d.]+) (\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)$"
    for line in done.stdout.splitlines():
        m = re.match(row, line)
        if m:
            rows[(float(m[1]), m[2])] = (float(m[3]), float(m[6]), int(m[7]), int(m[8]))
    # rates ascending, and at each every policy the demo compares, switched on one server
    policies = ["dp-tardy", "dynamic", "nobatch"]
    assert list(rows) == [(r, p) for r in (6.0, 12.0) for p in policies]
    for rate in (6.0, 12.0):  # the same arrivals for every policy at one rate
        counts = {rows[(rate, p)][3] for p in policies}
        assert len(counts) == 1 and counts.pop() > 0
    for on_time, served_per_s, dropped, requests in rows.values():
        assert 0.0 <= on_time <= 1.0 and served_per_s > 0 and 0 <= dropped <= requests
    # each policy's capacity line agrees with its rows
    for p in policies:
        m = re.search(rf"^  {p}\s+(.+)$", done.stdout, re.M)
        assert m, done.stdout
        ok = [r for r in (6.0, 12.0) if rows[(r, p)][0] >= ON_TIME_TARGET]
        assert m[1] == (f"{max(ok):g} req/s" if ok else "under the lowest rate")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {plot}" in done.stdout
    # the rows kept beside the plot, as printed
    saved = json.loads(plot.with_suffix(".json").read_text())
    assert [(r["rate_rps"], r["policy"]) for r in saved] == list(rows)
    for r in saved:
        on_time, _, dropped, requests = rows[(r["rate_rps"], r["policy"])]
        assert (round(r["on_time_ratio"], 3), r["dropped"], r["requests"]) == (
            on_time,
            dropped,
            requests,
        )


def _row(rate: float, policy: str, on_time: float) -> dict[str, Any]:
    return {"rate_rps": rate, "policy": policy, "on_time_ratio": on_time}


def test_capacity_is_the_highest_rate_on_time_and_none_when_no_rate_is() -> None:
    rows = [
        _row(30, "a", 1.0), _row(30, "b", 0.95), _row(30, "c", 0.5),
        _row(60, "a", 0.91), _row(60, "b", 0.7), _row(60, "c", 0.4),
        _row(90, "a", 0.89), _row(90, "b", 0.92), _row(90, "c", 0.3),
    ]  # fmt: skip
    assert capacities(rows) == {"a": 60, "b": 90, "c": None}


def test_the_plot_shows_the_highest_rate_some_policy_still_serves_on_time() -> None:
    rows = [_row(30, "a", 1.0), _row(60, "a", 0.92), _row(60, "b", 0.5), _row(90, "a", 0.6)]
    assert parting_rate(rows) == 60
    assert parting_rate([_row(30, "a", 0.5), _row(60, "a", 0.2)]) == 30

"""`layerbatch demo`, the first command of the README: the real server on this machine under the
built-in load, one policy after another (client/demo.py), run as a user runs it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_cli import run_cli


def test_demo_serves_every_request_under_each_policy_and_draws_the_comparison(
    tmp_path: Path,
) -> None:
    plot = tmp_path / "demo.png"
    done = run_cli(tmp_path, "demo", "--rate", "10", "--duration", "1", "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        m = re.match(r"(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)$", line)
        if m:
            rows[m[1]] = (float(m[2]), float(m[5]), int(m[6]), int(m[7]))
    # every policy the demo compares, switched in turn on one server, on the same arrivals
    assert list(rows) == ["dp-tardy", "dynamic", "nobatch"]
    counts = {requests for _, _, _, requests in rows.values()}
    assert len(counts) == 1 and counts.pop() > 0
    for on_time, served_per_s, dropped, requests in rows.values():
        assert 0.0 <= on_time <= 1.0 and served_per_s > 0 and 0 <= dropped <= requests
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {plot}" in done.stdout

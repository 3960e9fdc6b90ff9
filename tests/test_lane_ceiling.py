"""bench/lane_ceiling.py: both ways of running full batches serve, in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

from bench.lane_ceiling import ROOT, samples_per_s


def test_one_runtime_and_two_lanes_each_serve_full_batches() -> None:
    for lanes, threads in ((1, 2), (2, 1)):
        # each lane runs at least one batch: a positive rate, however slow the machine
        assert samples_per_s("mobilenet_v2", lanes, threads, batch=2, seconds=0.05) > 0


def test_bad_flags_are_refused_in_one_sentence() -> None:
    out = subprocess.run(
        [sys.executable, "bench/lane_ceiling.py", "--batch", "0"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode != 0
    assert "expected a positive batch, time and count, got 0" in out.stderr
    assert "Traceback" not in out.stderr

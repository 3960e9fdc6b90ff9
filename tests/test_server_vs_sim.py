"""bench/server_vs_sim.py: what the simulator takes from the server's /v1/status."""

from __future__ import annotations

from typing import Any

import pytest

from bench.server_vs_sim import calibration


def runtime_status(scale: float, decode_ms: float | None, gap_ms: float) -> dict[str, Any]:
    return {
        "stage_scales": {"m": [scale, 2 * scale]},
        "decode_ms": decode_ms,
        "step_gap_ms": gap_ms,
        "time_scale": scale,
        "admission_share": 2 / 3,
    }


def test_one_runtime_is_taken_as_it_is() -> None:
    cal = calibration(runtime_status(1.2, 1.5, 0.5))
    assert cal == {
        "stage_scales": {"m": [1.2, 2.4]},
        "decode_ms": 1.5,
        "step_gap_ms": 0.5,
        "time_scale": 1.2,
        "admission_share": 2 / 3,
        "replicas": 1,
    }


def test_replicas_are_averaged_and_counted() -> None:
    """Replicas' own calibrations (under "replicas") are averaged; a replica that has not yet
    measured a decode (None) is left out of the decode's mean."""
    status = {"replicas": [runtime_status(1.0, None, 0.4), runtime_status(2.0, 1.0, 0.6)]}
    cal = calibration(status)
    assert cal["stage_scales"] == {"m": pytest.approx([1.5, 3.0])}
    assert cal["decode_ms"] == 1.0
    assert cal["step_gap_ms"] == pytest.approx(0.5)
    assert cal["time_scale"] == pytest.approx(1.5)
    assert cal["replicas"] == 2

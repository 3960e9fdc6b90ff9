"""The per-stage calibration factors (server/calibration.py): what each stage's measured time
is against its profile, from the steps that ran it."""

from __future__ import annotations

import pytest

from server.calibration import StageCalibration


def test_before_any_step_every_factor_is_one() -> None:
    c = StageCalibration()
    assert c.overall() == 1.0
    assert c.factors("m", 3) == (1.0, 1.0, 1.0)


def test_each_step_sets_the_factor_of_the_stages_it_ran() -> None:
    """A group measured 2x its profile and another 1x keep those factors apart; the stages of one
    step share its factor."""
    c = StageCalibration(weight=0.1)
    for _ in range(50):
        c.observe("m", 0, [3.0, 1.0], measured_ms=8.0)  # stages 0-1: 2x
        c.observe("m", 2, [5.0], measured_ms=5.0)  # stage 2: as profiled
    assert c.factors("m", 3) == pytest.approx((2.0, 2.0, 1.0))


def test_the_overall_factor_is_time_weighted_and_stands_in_for_stages_not_run() -> None:
    c = StageCalibration()
    c.observe("m", 0, [1.0], measured_ms=3.0)  # short stage, 3x
    c.observe("m", 1, [9.0], measured_ms=9.0)  # long stage, 1x
    assert c.overall() == pytest.approx(12.0 / 10.0)  # not the mean of 3 and 1
    assert c.factors("m", 3)[2] == pytest.approx(1.2)
    assert c.factors("other", 1) == pytest.approx((1.2,))


def test_a_factor_follows_a_change_at_the_ewma_weight() -> None:
    w = 0.05
    c = StageCalibration(weight=w)
    c.observe("m", 0, [10.0], measured_ms=10.0)
    c.observe("m", 0, [10.0], measured_ms=20.0)
    assert c.factors("m", 1)[0] == pytest.approx((10.0 + w * 10.0) / 10.0)
    for _ in range(200):
        c.observe("m", 0, [10.0], measured_ms=20.0)
    assert c.factors("m", 1)[0] == pytest.approx(2.0, rel=1e-3)


def test_batch_size_changes_do_not_bias_a_factor() -> None:
    """Steps at different batch sizes (different profiled times) all at 1.5x give 1.5."""
    c = StageCalibration(weight=0.2)
    for profiled in (2.0, 8.0, 4.0, 16.0, 1.0) * 10:
        c.observe("m", 0, [profiled], measured_ms=1.5 * profiled)
    assert c.factors("m", 1)[0] == pytest.approx(1.5)


def test_a_step_with_no_profiled_time_is_ignored() -> None:
    c = StageCalibration()
    c.observe("m", 0, [0.0], measured_ms=5.0)
    c.observe("m", 0, [], measured_ms=5.0)
    assert c.factors("m", 1) == (1.0,)

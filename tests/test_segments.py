"""`walk`'s two ways through a segment: stage by stage (riders board one stage at a time) and,
without riders, one stretch between two members' positions at a time. Both price each stretch of
equal batch with one `Deployment.run_ms` and add them in order, so they agree to the last bit (the
planners compare the sums they give), and they cut the same actions."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import Deployment, load_profile
from scheduler.segments import Walk, _alone, _by_stage
from tests.sched_cases import cases

PROFILES = Path(__file__).resolve().parent.parent / "traces" / "data" / "profiles"


def _both(d: Deployment, app: str, positions: list[int]) -> tuple[Walk, Walk]:
    members = [(p, f"r{n}") for n, p in enumerate(sorted(positions))]
    return _alone(d, app, members, build=True), _by_stage(d, app, members, (), build=True)


@settings(max_examples=300, deadline=None)
@given(case=cases(), data=st.data())
def test_a_segment_without_riders_costs_and_runs_the_same_either_way(case: Any, data: Any) -> None:
    d = case.deployment
    app = data.draw(st.sampled_from(sorted(d.apps)))
    top = d.app_length(app) - 1
    positions = data.draw(st.lists(st.integers(0, top), min_size=1, max_size=20))
    alone, by_stage = _both(d, app, positions)
    assert alone == by_stage
    assert not alone.riders and not by_stage.riders


@pytest.mark.parametrize("model", ["mobilenet_v2", "resnet18", "googlenet"])
def test_the_bundled_profiles_price_and_cut_a_segment_the_same_either_way(model: str) -> None:
    d = Deployment([load_profile(PROFILES / f"{model}-cpu.json")])
    rng = random.Random(model)
    top = d.app_length(model) - 1
    for _ in range(2000):
        positions = [rng.randint(0, top) for _ in range(rng.randint(1, 12))]
        alone, by_stage = _both(d, model, positions)
        assert alone == by_stage, positions

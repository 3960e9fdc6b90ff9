"""Stacking on the real server: with `irina`, a request for a second model runs beside a step of
another model that is still executing (its own executor thread), and both are answered."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from scheduler.profile import scaled
from tests.server_cases import (
    CIFAR,
    FACES,
    GATE_LIMIT_S,
    StageGate,
    build,
    infer,
    infer_doc,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    small_jpeg,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("restore_process_globals")]


def with_stacking(runtime: Any, slowdown: float, slower: str, factor: float) -> None:
    """Give every pair of served models a profiled stacking slowdown (the shipped CPU profiles
    carry none, and irina does not stack a pair it cannot predict), and make `slower`'s profile
    `factor` times slower, so that what a test holds at a gate is also long by the profile."""
    d = runtime.deployment
    models = list(d.profiles)
    profiles = [
        dataclasses.replace(
            scaled(p, factor) if p.model == slower else p,
            stacking_slowdown={m: slowdown for m in models if m != p.model},
        )
        for p in runtime.base_profiles.values()
    ]
    runtime.base_profiles = {p.model: p for p in profiles}
    runtime.deployment = d.with_profiles(profiles)
    runtime.engine.rebase(runtime.deployment)


async def test_a_second_model_runs_beside_a_held_step(aiohttp_client: Any) -> None:
    runtime = build([FACES, CIFAR], policy="irina")
    with_stacking(runtime, 1.0, FACES, 200.0)
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, FACES, stage=1) as gate:
        gate.close()
        faces = asyncio.create_task(
            infer(client, infer_doc(small_jpeg(1), app=FACES, request_id="long"))
        )
        await gate.held()
        # the face detector is stuck inside its stage 1; the classifier must not wait for it
        short = asyncio.create_task(
            infer(client, infer_doc(small_jpeg(2), app=CIFAR, request_id="short"))
        )
        status, answer = await asyncio.wait_for(short, GATE_LIMIT_S)
        assert gate.closed
        assert status == 200 and answer["status"] == "ok", answer
        assert len(answer["result"]["top5"]) == 5
        assert runtime.metrics.stacked == 1
        gate.open()
        status, answer = await asyncio.wait_for(faces, GATE_LIMIT_S)
    assert status == 200 and answer["status"] == "ok", answer
    assert "boxes" in answer["result"]
    assert runtime.pending == {}
    assert len(runtime.engine.state) == 0 and len(runtime.executor.store) == 0


async def test_without_a_profiled_slowdown_irina_does_not_stack(aiohttp_client: Any) -> None:
    runtime = build([FACES, CIFAR], policy="irina")
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, FACES, stage=1) as gate:
        gate.close()
        faces = asyncio.create_task(
            infer(client, infer_doc(small_jpeg(1), app=FACES, request_id="long"))
        )
        await gate.held()
        short = asyncio.create_task(
            infer(client, infer_doc(small_jpeg(2), app=CIFAR, request_id="short"))
        )
        await asyncio.sleep(0.2)
        assert not short.done()  # it waits for the held step's stage boundary
        gate.open()
        for task in (faces, short):
            status, answer = await asyncio.wait_for(task, GATE_LIMIT_S)
            assert status == 200 and answer["status"] == "ok", answer
    assert runtime.metrics.stacked == 0

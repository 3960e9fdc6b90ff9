"""A server of several replicas (`layerbatch serve --replicas N`, server/replicas.py) and the rule
that dispatches requests to them (scheduler/dispatch.py), through real sockets.

The replicas share the models' weights, so a `StageGate` on a stage holds every replica's executor
thread that enters it: two calls waiting there at once are two replicas running at once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.dispatch import choose_replica
from server.build import build_runtime
from server.replicas import Replicas
from tests.server_cases import (
    CIFAR,
    GATE_LIMIT_S,
    StageGate,
    get_json,
    infer,
    infer_doc,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    small_jpeg,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("restore_process_globals")


def build_replicas(n: int = 2, max_queued: int = 1000, step_log: Path | None = None) -> Replicas:
    """`n` replicas of one torch thread each, as `tests.server_cases.build` makes one runtime
    (eager stages, for the `StageGate`s)."""
    served = build_runtime(
        [CIFAR], threads=1, max_queued=max_queued, decode_threads=1, min_group_ms=0.0,
        replicas=n, step_log=step_log, script=False,
    )  # fmt: skip
    assert isinstance(served, Replicas)
    for r in served.runtimes:
        r.calibrate = False
    return served


async def held(gate: StageGate, calls: int) -> None:
    """Until `calls` calls in all have reached the closed gate (and wait there)."""
    await wait_for(lambda: len(gate.batches) >= calls, f"{calls} calls at the gate")


def test_a_request_joins_the_replica_with_the_least_work_left() -> None:
    assert choose_replica([30.0, 10.0, 20.0]) == 1
    assert choose_replica([5.0, 5.0, 5.0]) == 0  # ties: the lowest
    assert choose_replica([0.0]) == 0
    with pytest.raises(ValueError, match="work_left_ms: expected one entry per replica"):
        choose_replica([])


@pytest.mark.asyncio
async def test_replicas_run_at_once_and_each_request_is_answered_once(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    steps = tmp_path / "steps.jsonl"
    served = build_replicas(step_log=steps)
    client = await serve(aiohttp_client, served)
    with StageGate(served.runtimes[0], CIFAR, 0) as gate:
        gate.close()
        first = asyncio.create_task(infer(client, infer_doc(small_jpeg(0))))
        await held(gate, 1)
        # replica 0 now holds work: the next request goes to replica 1, which runs it at once
        second = asyncio.create_task(infer(client, infer_doc(small_jpeg(1))))
        await held(gate, 2)
        _, status = await get_json(client, "/v1/status")
        assert [r["running"] is not None for r in status["replicas"]] == [True, True]
        assert [r["admission_share"] for r in status["replicas"]] == [1.0, 1.0]  # each its own
        assert "admission_share" not in status
        assert status["queued"] == 2
        gate.open()
        answers = await asyncio.wait_for(asyncio.gather(first, second), GATE_LIMIT_S)
    assert [code for code, _ in answers] == [200, 200]
    assert all(a["status"] == "ok" and len(a["result"]["top5"]) == 5 for _, a in answers)
    assert len({a["request_id"] for _, a in answers}) == 2  # ids unique across replicas
    await client.close()
    ran = [json.loads(line) for line in steps.read_text().splitlines()]
    assert {line["replica"] for line in ran} == {0, 1}
    assert all(r.pending == {} and len(r.engine.state) == 0 for r in served.runtimes)


@pytest.mark.asyncio
async def test_requests_alternate_between_idle_equal_replicas(aiohttp_client: Any) -> None:
    served = build_replicas()
    client = await serve(aiohttp_client, served)
    with StageGate(served.runtimes[0], CIFAR, 0) as gate:
        gate.close()
        tasks = []
        for i in range(4):  # each one's work makes the other replica the lighter one
            tasks.append(asyncio.create_task(infer(client, infer_doc(small_jpeg(i)))))
            await wait_for(
                lambda n=i + 1: sum(len(r.pending) for r in served.runtimes) == n,
                f"request {i} to be queued",
            )
        assert [len(r.pending) for r in served.runtimes] == [2, 2]
        gate.open()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), GATE_LIMIT_S)
    assert [a["status"] for _, a in answers] == ["ok"] * 4
    _, status = await get_json(client, "/v1/status")
    assert status["counters"]["answered"] == {f"{CIFAR}/ok": 4}  # one set of counters for all


@pytest.mark.asyncio
async def test_a_request_id_in_use_in_any_replica_is_refused(aiohttp_client: Any) -> None:
    served = build_replicas()
    client = await serve(aiohttp_client, served)
    with StageGate(served.runtimes[0], CIFAR, 0) as gate:
        gate.close()
        first = asyncio.create_task(infer(client, infer_doc(small_jpeg(0), request_id="same")))
        await held(gate, 1)
        code, answer = await infer(client, infer_doc(small_jpeg(1), request_id="same"))
        assert code == 409
        assert answer["error"] == "request_id: 'same' is already in use by a queued request"
        gate.open()
        code, answer = await asyncio.wait_for(first, GATE_LIMIT_S)
    assert code == 200 and answer["request_id"] == "same" and answer["status"] == "ok"


@pytest.mark.asyncio
async def test_the_queue_bound_counts_every_replica(aiohttp_client: Any) -> None:
    served = build_replicas(max_queued=2)
    client = await serve(aiohttp_client, served)
    with StageGate(served.runtimes[0], CIFAR, 0) as gate:
        gate.close()
        held_tasks = [
            asyncio.create_task(infer(client, infer_doc(small_jpeg(i)))) for i in range(2)
        ]
        await held(gate, 2)  # one in each replica, neither full on its own
        code, answer = await infer(client, infer_doc(small_jpeg(2)))
        assert code == 503
        assert answer["error"] == "the queue is full (2 requests); try again shortly"
        gate.open()
        answers = await asyncio.wait_for(asyncio.gather(*held_tasks), GATE_LIMIT_S)
    assert [a["status"] for _, a in answers] == ["ok", "ok"]


@pytest.mark.asyncio
async def test_ready_until_drained_then_refusing(aiohttp_client: Any) -> None:
    served = build_replicas()
    client = await serve(aiohttp_client, served)
    code, doc = await get_json(client, "/readyz")
    assert (code, doc) == (200, {"ready": True})
    await served.drain()
    code, doc = await get_json(client, "/readyz")
    assert (code, doc) == (503, {"ready": False})
    code, answer = await infer(client, infer_doc(small_jpeg(0)))
    assert code == 503
    assert answer["error"] == "the server is shutting down and accepts no new requests"


def test_replicas_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--replicas: expected a positive number of replicas"):
        build_runtime([CIFAR], threads=1, replicas=0)

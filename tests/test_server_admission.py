"""Admission through real sockets (server/runtime.py, "Admission"): under dp-tardy a request
whose deadline the queue ahead already fills is answered dropped at once, before its decode,
while without admission, or under a policy that never drops for lateness, it is decoded and
queued. The rule itself, case by case: tests/test_admission.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler.admission import ADMISSION_SHARE
from scheduler.policies.common import QUEUE_FULL_AHEAD
from server.runtime import Runtime
from tests.server_cases import (
    CIFAR,
    StageGate,
    assert_nothing_left,
    build,
    counters,
    infer,
    infer_doc,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    small_jpeg,
    wait_for,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("restore_process_globals")]
QUEUED = 12


def count_decodes(runtime: Runtime) -> list[str]:
    """The request ids the runtime decodes from now on (its own decode, wrapped to record)."""
    seen: list[str] = []
    decode = runtime._decode

    def recording(req: Any) -> Any:
        seen.append(req.request_id)
        return decode(req)

    runtime._decode = recording  # type: ignore[method-assign]
    return seen


def tight_deadline_ms(runtime: Runtime) -> float:
    """A deadline with room for one request alone within the admission share (three saturated
    per-sample costs) but none behind QUEUED requests at the first stage."""
    tail = runtime.deployment.tail_ms(CIFAR, 0)
    deadline = 3 * tail / ADMISSION_SHARE
    assert ADMISSION_SHARE * deadline < (QUEUED + 1) * tail
    return deadline


async def queue_behind_gate(client: Any, runtime: Runtime, gate: StageGate) -> list[Any]:
    """QUEUED requests with long deadlines, the executor held at the gate with one of them."""
    gate.close()
    tasks = [
        asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"q{i}")))
        for i in range(QUEUED)
    ]
    await gate.held()
    await wait_for(lambda: len(runtime.pending) == QUEUED, f"{QUEUED} queued requests")
    return tasks


async def test_a_request_the_queue_leaves_no_room_is_dropped_before_its_decode(
    aiohttp_client: Any,
) -> None:
    runtime = build()
    assert runtime.policy_name == "dp-tardy"
    client = await serve(aiohttp_client, runtime)
    deadline = tight_deadline_ms(runtime)
    decoded = count_decodes(runtime)
    assert runtime.status()["admission_share"] == 1.0  # no drop yet: admits to the deadline
    with StageGate(runtime, CIFAR, 1) as gate:
        tasks = await queue_behind_gate(client, runtime, gate)
        status, answer = await infer(
            client, infer_doc(small_jpeg(99), deadline_ms=deadline, request_id="behind")
        )
        assert runtime.status()["admission_share"] == round(ADMISSION_SHARE, 3)
        assert gate.closed  # answered while the queue still waits
        assert status == 200
        assert answer["status"] == "dropped" and answer["request_id"] == "behind"
        assert answer["reason"] == QUEUE_FULL_AHEAD
        assert answer["batch_sizes"] == [] and answer["timing"]["exec_ms"] == 0
        assert "behind" not in decoded
        assert "behind" not in runtime.engine.state and "behind" not in runtime.executor.store
        gate.open()
        results = await asyncio.gather(*tasks)
    assert all(s == 200 and a["status"] == "ok" for s, a in results)
    assert counters(runtime) == {f"{CIFAR}/ok": QUEUED, f"{CIFAR}/dropped": 1}
    assert runtime.status()["counters"]["dropped"] == {QUEUE_FULL_AHEAD: 1}
    assert_nothing_left(runtime)
    # an arrival that finds the queue empty ends the overload
    status, answer = await infer(client, infer_doc(small_jpeg(7), request_id="after"))
    assert status == 200 and answer["status"] == "ok"
    assert runtime.status()["admission_share"] == 1.0


@pytest.mark.parametrize("policy", ["dp-tardy-without-admission", "dp-time"])
async def test_without_admission_the_request_is_decoded_and_queued(
    aiohttp_client: Any, policy: str
) -> None:
    if policy == "dp-tardy-without-admission":
        runtime = build()
        runtime.admission = None
    else:
        runtime = build(policy=policy)
    client = await serve(aiohttp_client, runtime)
    deadline = tight_deadline_ms(runtime)
    decoded = count_decodes(runtime)
    with StageGate(runtime, CIFAR, 1) as gate:
        tasks = await queue_behind_gate(client, runtime, gate)
        behind = asyncio.create_task(
            infer(client, infer_doc(small_jpeg(99), deadline_ms=deadline, request_id="behind"))
        )
        await wait_for(lambda: "behind" in decoded, "its decode")
        gate.open()
        status, answer = await behind
        results = await asyncio.gather(*tasks)
    assert all(s == 200 and a["status"] == "ok" for s, a in results)
    assert status == 200 and answer["request_id"] == "behind"
    # decoded and queued, it is dropped later, for the plan's own reasons (its deadline passed
    # while the queue was held, or the plan would finish it late)
    assert answer["status"] == "dropped" and answer["reason"] != QUEUE_FULL_AHEAD
    assert_nothing_left(runtime)

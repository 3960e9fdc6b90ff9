"""Bad input, overload and faults (issue 4, "Bad input, overload, faults: a clear answer, nothing
lost"), through real sockets.

Every refusal is checked for its exact status and for a message naming the field; and in every
test a valid request is held inside the executor while the bad ones arrive (`good_request_in_flight`)
and must still be answered 200 ok afterwards: a bad request never affects another one. The four
regressions the issue names (Triton #7512, Ray Serve #50046, TorchServe #2333, Ray Serve #43288)
have a test each, and SIGTERM is tested on a real `layerbatch serve` process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import torch

from server.app import ServerConfig
from server.runtime import Runtime
from tests.server_cases import (
    CIFAR,
    FACES,
    GATE_LIMIT_S,
    MSGPACK,
    ROOT,
    Client,
    StageGate,
    assert_nothing_left,
    build,
    counters,
    features_payload,
    free_port,
    get_json,
    good_request_in_flight,
    infer,
    infer_doc,
    jpeg,
    packb,
    post,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    small_jpeg,
    stage_input,
    synthetic_rgb,
    wait_for,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("restore_process_globals")]

ONLY_GOOD = {f"{CIFAR}/ok": 1}


async def refused(
    client: Client, body: bytes, content_type: str = "application/msgpack"
) -> tuple[int, str]:
    """POST to /v1/infer; the status and the error sentence of a refusal."""
    status, doc, _ = await post(client, body, content_type)
    assert isinstance(doc, dict) and set(doc) == {"status", "error"}, doc
    assert doc["status"] == status
    assert isinstance(doc["error"], str) and doc["error"]
    return status, doc["error"]


async def setup(aiohttp_client: Any, **config: Any) -> tuple[Runtime, Client, StageGate]:
    runtime = build()
    client = await serve(aiohttp_client, runtime, ServerConfig(**config))
    return runtime, client, StageGate(runtime, CIFAR, 1)


def cifar_features(runtime: Runtime, k: int, codec: str = "h264") -> dict[str, Any]:
    return features_payload(stage_input(runtime, CIFAR, synthetic_rgb(32, 32, 4), k), k, codec)


# --- bad input -----------------------------------------------------------------------------------
async def test_body_over_the_size_limit_is_413(aiohttp_client: Any) -> None:
    good = packb(infer_doc(small_jpeg(0), request_id="good"))
    runtime, client, gate = await setup(aiohttp_client, max_body_bytes=len(good) + 512)
    big = packb(infer_doc(jpeg(synthetic_rgb(256, 256, 1)), request_id="big"))
    assert len(big) > len(good) + 512
    with gate:
        async with good_request_in_flight(client, gate):
            status, error = await refused(client, big)
            assert status == 413
            assert error.startswith("body:") and f"at most {len(good) + 512} bytes" in error
            body = json.dumps({"app": CIFAR, "pad": "x" * 4096}).encode()
            assert (await refused(client, body, "application/json"))[0] == 413
            assert list(runtime.pending) == ["good"]
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


@pytest.mark.parametrize(
    ("body", "content_type", "kind"),
    [
        (b"\xc1", "application/msgpack", "msgpack"),  # a byte msgpack never uses
        (b"\x82\xa3app", "application/msgpack", "msgpack"),  # truncated map
        (packb({"app": CIFAR}) + b"\x01", "application/msgpack", "msgpack"),  # trailing data
        (b"", "application/msgpack", "msgpack"),
        (b'{"app": "resnet20_cifar10", ', "application/json", "JSON"),
        (b"\xff\xfe{}", "application/json; charset=utf-8", "JSON"),
    ],
)
async def test_malformed_body_is_400_naming_body(
    aiohttp_client: Any, body: bytes, content_type: str, kind: str
) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate):
            status, error = await refused(client, body, content_type)
            assert status == 400
            assert error.startswith(f"body: expected a {kind} document")
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


FIELD_CASES: list[tuple[dict[str, Any], str]] = [
    ({"payload": {"jpeg": b"x"}}, "app:"),
    ({"app": 7, "payload": {"jpeg": b"x"}}, "app:"),
    ({"app": "", "payload": {"jpeg": b"x"}}, "app:"),
    ({"app": CIFAR}, "payload:"),
    ({"app": CIFAR, "payload": b"x"}, "payload:"),
    ({"app": CIFAR, "payload": {}}, "payload:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x", "features": {}}}, "payload:"),
    ({"app": CIFAR, "payload": {"jpeg": "not bytes"}}, "payload.jpeg:"),
    ({"app": CIFAR, "payload": {"features": [1, 2]}}, "payload.features:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x"}, "request_id": 5}, "request_id:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x"}, "request_id": ""}, "request_id:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x"}, "client_id": ["a"]}, "client_id:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x"}, "deadline_ms": "100"}, "deadline_ms:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x"}, "deadline_ms": "NaN"}, "deadline_ms:"),
    ({"app": CIFAR, "payload": {"jpeg": b"x"}, "deadline_ms": None}, "deadline_ms:"),
    ([CIFAR, b"x"], "body:"),
]


async def test_missing_or_mistyped_fields_are_400_naming_the_field(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    features: dict[str, Any] = {
        "position": 2, "shape": [16, 32, 32], "scale": 0.1, "zero_point": 3,
        "codec": "h264", "data": b"\x00",
    }  # fmt: skip
    cases = list(FIELD_CASES)
    for key, bad in [
        ("position", "2"),
        ("position", 2.5),
        ("shape", "16x32x32"),
        ("shape", [16, 0, 32]),
        ("scale", -1.0),
        ("scale", "0.1"),
        ("zero_point", 256),
        ("zero_point", -1),
        ("codec", 264),
        ("data", "text"),
    ]:
        cases.append(
            (
                {"app": CIFAR, "payload": {"features": {**features, key: bad}}},
                f"payload.features.{key}:",
            )
        )
    without_position = {k: v for k, v in features.items() if k != "position"}
    cases.append(
        ({"app": CIFAR, "payload": {"features": without_position}}, "payload.features.position:")
    )
    with gate:
        async with good_request_in_flight(client, gate):
            for doc, field in cases:
                status, error = await refused(client, packb(doc))
                assert status == 400, (doc, error)
                assert error.startswith(field), (doc, error)
            # JSON carries bytes as base64 text and names the field when it is not
            doc = {"app": CIFAR, "payload": {"jpeg": 12}}
            status, error = await refused(client, json.dumps(doc).encode(), "application/json")
            assert status == 400 and error.startswith("payload.jpeg:") and "base64" in error
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


async def test_undecodable_jpeg_is_422(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    truncated = small_jpeg(1)[:40]
    with gate:
        async with good_request_in_flight(client, gate):
            for data in (b"definitely not a jpeg", truncated, b"\xff\xd8\xff"):
                status, error = await refused(client, packb(infer_doc(data, request_id="bad")))
                assert status == 422
                assert error.startswith("payload.jpeg:") and "decode" in error
            assert list(runtime.pending) == ["good"]
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


async def test_undecodable_h264_and_raw_features_are_422(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    good = cifar_features(runtime, 2, "h264")
    wrong_frame = features_payload(torch.rand(8, 32, 32), 2, "h264")  # too few planes
    raw = cifar_features(runtime, 2, "raw")
    cases = [
        {**good, "data": os.urandom(300)},
        {**good, "data": b"\x00\x00\x00\x01" + os.urandom(200)},
        {**good, "data": b""},
        {**good, "data": wrong_frame["data"]},
        {**raw, "data": raw["data"][:-1]},
        {**good, "codec": "png"},
    ]
    with gate:
        async with good_request_in_flight(client, gate):
            for i, features in enumerate(cases):
                status, error = await refused(client, packb(infer_doc(features)))
                assert status == 422, (i, error)
                field = "payload.features.codec:" if i == 5 else "payload.features.data:"
                assert error.startswith(field), (i, error)
    # the same well-formed map is served
    status, answer = await infer(client, infer_doc(good, request_id="features"))
    assert status == 200 and answer["status"] == "ok"
    assert counters(runtime) == {f"{CIFAR}/ok": 2}
    assert_nothing_left(runtime)


async def test_unknown_app_is_404_listing_the_apps(aiohttp_client: Any) -> None:
    runtime = build([CIFAR, FACES])
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, CIFAR, 1) as gate:
        async with good_request_in_flight(client, gate):
            status, error = await refused(client, packb(infer_doc(small_jpeg(), app="resnet999")))
            assert status == 404
            assert error == (
                f"app: unknown app 'resnet999'; served apps: {CIFAR}, {FACES}"
            )  # fmt: skip
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


async def test_position_out_of_range_is_422_with_the_range(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    features = cifar_features(runtime, 2)
    with gate:
        async with good_request_in_flight(client, gate):
            for position in (0, 11, 12, -1):
                doc = infer_doc({**features, "position": position})
                status, error = await refused(client, packb(doc))
                assert status == 422
                assert error == (
                    f"payload.features.position: expected 1..10 for app {CIFAR}, got {position}"
                )
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


async def test_feature_shape_not_matching_the_stage_is_422(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    at2 = cifar_features(runtime, 2)  # stage 2 takes [16, 32, 32]
    at5 = cifar_features(runtime, 5)  # stage 5 takes [32, 16, 16]
    with gate:
        async with good_request_in_flight(client, gate):
            status, error = await refused(client, packb(infer_doc({**at5, "position": 2})))
            assert status == 422
            assert error == (
                "payload.features.shape: expected [16, 32, 32] for stage 2, got [32, 16, 16]"
            )
            status, error = await refused(client, packb(infer_doc({**at2, "position": 10})))
            assert status == 422
            assert "expected [64]" in error and "got [16, 32, 32]" in error
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


@pytest.mark.parametrize("deadline", [-5.0, 0, 0.0, math.nan, math.inf, 600_001, 1e12])
async def test_unusable_deadline_is_422(aiohttp_client: Any, deadline: float) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate):
            doc = infer_doc(small_jpeg(), deadline_ms=deadline)
            status, error = await refused(client, packb(doc))
            assert status == 422
            assert error.startswith("deadline_ms: expected a number in (0, 600000]")
            # the same through JSON (Python's json writes NaN and Infinity literals)
            doc["payload"] = {"jpeg": base64.b64encode(small_jpeg()).decode()}
            status, error = await refused(client, json.dumps(doc).encode(), "application/json")
            assert status == 422 and error.startswith("deadline_ms:")
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


async def test_largest_deadline_is_accepted(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    status, answer = await infer(client, infer_doc(small_jpeg(), deadline_ms=600_000))
    assert status == 200 and answer["status"] == "ok"


async def test_duplicate_request_id_while_queued_is_409(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate, request_id="same"):
            status, error = await refused(
                client, packb(infer_doc(small_jpeg(2), request_id="same"))
            )
            assert status == 409
            assert error == "request_id: 'same' is already in use by a queued request"
            assert list(runtime.pending) == ["same"]
    # once answered, the id is free again
    status, answer = await infer(client, infer_doc(small_jpeg(2), request_id="same"))
    assert status == 200 and answer["status"] == "ok" and answer["request_id"] == "same"
    assert counters(runtime) == {f"{CIFAR}/ok": 2}
    assert_nothing_left(runtime)


async def test_wrong_content_type_is_415(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    body = packb(infer_doc(small_jpeg()))
    with gate:
        async with good_request_in_flight(client, gate):
            for ctype in ("text/plain", "image/jpeg", "application/x-www-form-urlencoded"):
                status, error = await refused(client, body, ctype)
                assert status == 415
                assert error.startswith("Content-Type: expected application/msgpack or")
                assert repr(ctype) in error
    assert counters(runtime) == ONLY_GOOD
    assert_nothing_left(runtime)


# --- clients that go away ---------------------------------------------------------------------
async def test_client_disconnect_forgets_the_queued_request(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate):
            async with aiohttp.ClientSession() as session:
                body = packb(infer_doc(small_jpeg(3), request_id="gone"))

                async def send() -> int:
                    async with session.post(
                        client.make_url("/v1/infer"), data=body, headers=MSGPACK
                    ) as resp:
                        return resp.status

                task = asyncio.create_task(send())
                await wait_for(lambda: "gone" in runtime.executor.store, "'gone' to be queued")
                assert "gone" in runtime.pending and "gone" in runtime.engine.state
                task.cancel()  # the client gives up: its connection closes
                with pytest.raises(asyncio.CancelledError):
                    await task
            await wait_for(lambda: "gone" not in runtime.pending, "'gone' to be forgotten")
            assert "gone" not in runtime.engine.state
            assert "gone" not in runtime.executor.store
            assert list(runtime.pending) == ["good"]
            assert counters(runtime) == {f"{CIFAR}/cancelled": 1}
    assert counters(runtime) == {f"{CIFAR}/cancelled": 1, f"{CIFAR}/ok": 1}
    assert_nothing_left(runtime)


async def test_closing_a_stream_forgets_its_requests(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate):
            ws = await client.ws_connect("/v1/stream")
            for i in range(3):
                await ws.send_bytes(packb(infer_doc(small_jpeg(i), request_id=f"s{i}")))
            await wait_for(lambda: len(runtime.pending) == 4, "3 streamed requests")
            await ws.close()
            await wait_for(lambda: list(runtime.pending) == ["good"], "the stream to be forgotten")
            assert [r.id for r in runtime.engine.state] == ["good"]
            assert len(runtime.executor.store) == 1
    assert counters(runtime) == {f"{CIFAR}/cancelled": 3, f"{CIFAR}/ok": 1}
    assert_nothing_left(runtime)


# --- overload -------------------------------------------------------------------------------------
async def test_hopeless_deadline_is_dropped_at_once_with_dp_tardy(aiohttp_client: Any) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    assert runtime.policy_name == "dp-tardy"
    with gate:
        async with good_request_in_flight(client, gate):
            status, answer = await infer(
                client, infer_doc(small_jpeg(), deadline_ms=1, request_id="late")
            )
            # answered while the executor is still held: nobody waited for a batch to finish
            assert gate.closed
            assert status == 200
            assert answer["status"] == "dropped" and answer["request_id"] == "late"
            assert isinstance(answer["reason"], str) and answer["reason"]
            assert "result" not in answer
            assert answer["batch_sizes"] == [] and answer["timing"]["exec_ms"] == 0
            assert "late" not in runtime.executor.store
    status, doc = await get_json(client, "/v1/status")
    assert doc["counters"]["answered"] == {f"{CIFAR}/dropped": 1, f"{CIFAR}/ok": 1}
    assert doc["counters"]["dropped"] == {answer["reason"]: 1}
    assert_nothing_left(runtime)


async def test_torchserve_2333_full_queue_rejects_at_once(aiohttp_client: Any) -> None:
    """TorchServe #2333: a full queue must answer 503 at once, not block the client."""
    runtime = build(max_queued=3)
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, CIFAR, 1) as gate:
        gate.close()
        queued = [
            asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"q{i}")))
            for i in range(3)
        ]
        await gate.held()
        await wait_for(lambda: len(runtime.pending) == 3, "3 queued requests")
        started = time.monotonic()
        status, doc, headers = await post(client, packb(infer_doc(small_jpeg(), request_id="x")))
        elapsed = time.monotonic() - started
        assert gate.closed  # answered while the queued work cannot progress at all
        assert status == 503
        assert headers["Retry-After"] == "1"
        assert doc["status"] == 503 and "queue is full (3 requests)" in doc["error"]
        assert elapsed < GATE_LIMIT_S / 3
        assert "x" not in runtime.pending and "x" not in runtime.executor.store
        gate.open()
        results = await asyncio.gather(*queued)
    assert [(s, a["status"]) for s, a in results] == [(200, "ok")] * 3
    # with room again, requests are accepted
    status, answer = await infer(client, infer_doc(small_jpeg(), request_id="x"))
    assert status == 200 and answer["status"] == "ok"
    assert_nothing_left(runtime)


async def test_queue_cap_holds_for_concurrent_arrivals(aiohttp_client: Any) -> None:
    runtime = build(max_queued=3)
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, CIFAR, 1) as gate:
        gate.close()
        first = asyncio.create_task(infer(client, infer_doc(small_jpeg(0), request_id="q0")))
        await gate.held()
        burst = [
            asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"q{i}")))
            for i in range(1, 6)
        ]
        # each of the burst is admitted (pending) or answered (refused) by now
        await wait_for(
            lambda: len(runtime.pending) - 1 + sum(t.done() for t in burst) == 5,
            "every request of the burst to be admitted or refused",
        )
        peak = len(runtime.pending)
        gate.open()
        results = await asyncio.gather(first, *burst)
    statuses = sorted(s for s, _ in results)
    assert peak <= 3
    assert statuses == [200, 200, 200, 503, 503, 503]


# --- faults while executing ---------------------------------------------------------------------
async def test_exception_in_one_action_fails_only_its_requests(aiohttp_client: Any) -> None:
    runtime = build([CIFAR, FACES])
    client = await serve(aiohttp_client, runtime)
    running: list[Any] = []
    real_run = runtime.executor.run

    def run(action: Any, cancel: Any = None, **kw: Any) -> Any:
        running[:] = [action]
        return real_run(action, cancel, **kw)

    def fault(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if any(rid.startswith("poison") for rid in running[0].request_ids):
            raise RuntimeError("injected fault in stage 3")

    runtime.executor.run = run  # type: ignore[method-assign]
    hook = runtime.models[FACES].stages[3].register_forward_pre_hook(fault)
    face = jpeg(synthetic_rgb(240, 320, 3))
    try:
        with StageGate(runtime, CIFAR, 1) as gate:
            async with good_request_in_flight(client, gate):
                poison = asyncio.create_task(
                    infer(client, infer_doc(face, app=FACES, request_id="poison"))
                )
                await wait_for(lambda: "poison" in runtime.pending, "the poisoned request")
            status, answer = await poison
        assert status == 500
        assert answer["status"] == "error" and answer["request_id"] == "poison"
        assert FACES in answer["reason"] and "injected fault in stage 3" in answer["reason"]
        assert "result" not in answer
        # the server keeps serving both apps, the failing model included
        status, answer = await infer(client, infer_doc(face, app=FACES, request_id="after"))
        assert status == 200 and answer["status"] == "ok"
        status, answer = await infer(client, infer_doc(small_jpeg(), request_id="cifar"))
        assert status == 200 and answer["status"] == "ok"
    finally:
        hook.remove()
    assert counters(runtime) == {f"{CIFAR}/ok": 2, f"{FACES}/error": 1, f"{FACES}/ok": 1}
    assert_nothing_left(runtime)


async def test_exception_fails_every_request_of_the_action_with_a_message(
    aiohttp_client: Any,
) -> None:
    """Several requests batched into the failing action each get a 500 with the message."""
    runtime = build([CIFAR, FACES], policy="batch")
    client = await serve(aiohttp_client, runtime)

    def fault(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        raise RuntimeError("stage 5 is broken")

    hook = runtime.models[CIFAR].stages[5].register_forward_pre_hook(fault)
    try:
        with StageGate(runtime, FACES, 0) as gate:
            gate.close()
            blocker = asyncio.create_task(
                infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES))
            )
            await gate.held()
            tasks = [
                asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"b{i}")))
                for i in range(4)
            ]
            await wait_for(lambda: len(runtime.pending) == 5, "4 queued requests")
            gate.open()
            results = await asyncio.gather(*tasks)
            status, answer = await blocker
        assert status == 200 and answer["status"] == "ok"
    finally:
        hook.remove()
    for i, (status, answer) in enumerate(results):
        assert status == 500
        assert answer["status"] == "error" and answer["request_id"] == f"b{i}"
        assert answer["reason"] == f"running {CIFAR} stages 4..5 failed: stage 5 is broken"
        assert answer["batch_sizes"] == [4, 4]  # the two groups that ran, as one batch
    status, answer = await infer(client, infer_doc(small_jpeg(), request_id="after"))
    assert status == 200 and answer["status"] == "ok"
    assert_nothing_left(runtime)


# --- regressions other servers had ------------------------------------------------------------
@pytest.mark.parametrize("policy", ["dynamic", "batch", "dp-tardy"])
async def test_triton_7512_deadline_enforced_while_waiting(
    aiohttp_client: Any, policy: str
) -> None:
    """Triton #7512: a request whose deadline passes while it waits behind long work is answered
    "dropped" at its deadline, not when the long work ends and a batch forms."""
    runtime = build([CIFAR, FACES], policy=policy)
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, FACES, 0) as gate:
        gate.close()  # long work: held until the test opens the gate
        blocker = asyncio.create_task(
            infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES, request_id="long"))
        )
        await gate.held()
        started = time.monotonic()
        status, answer = await infer(
            client, infer_doc(small_jpeg(), deadline_ms=300.0, request_id="short")
        )
        elapsed = time.monotonic() - started
        assert gate.closed  # the long work has not ended
        assert status == 200
        assert answer["status"] == "dropped" and answer["request_id"] == "short"
        assert answer["reason"]
        assert elapsed >= 0.3  # not before its deadline
        assert elapsed < GATE_LIMIT_S / 3
        assert answer["timing"]["total_ms"] >= 300.0
        assert "short" not in runtime.executor.store
        assert "short" not in runtime.engine.state
        gate.open()
        status, answer = await blocker
    assert status == 200 and answer["request_id"] == "long"
    assert_nothing_left(runtime)


async def test_each_waiting_request_is_dropped_at_its_own_deadline(aiohttp_client: Any) -> None:
    """Two requests wait behind long work with different deadlines: the server wakes at the
    first, answers it, and sets its next wake-up for the second."""
    runtime = build([CIFAR, FACES], policy="dp-tardy")
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, FACES, 0) as gate:
        gate.close()
        blocker = asyncio.create_task(
            infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES, request_id="long"))
        )
        await gate.held()
        started = time.monotonic()

        async def timed(deadline_ms: float, rid: str) -> tuple[float, dict[str, Any]]:
            doc = infer_doc(small_jpeg(), deadline_ms=deadline_ms, request_id=rid)
            _, answer = await infer(client, doc)
            return time.monotonic() - started, answer

        (t_first, first), (t_second, second) = await asyncio.gather(
            timed(300.0, "first"), timed(700.0, "second")
        )
        assert gate.closed
        assert first["status"] == second["status"] == "dropped"
        assert 0.3 <= t_first < 0.7 <= t_second < GATE_LIMIT_S / 3
        assert first["timing"]["total_ms"] >= 300.0 and second["timing"]["total_ms"] >= 700.0
        gate.open()
        status, answer = await blocker
    assert status == 200 and answer["request_id"] == "long"
    assert_nothing_left(runtime)


async def test_ray_serve_50046_cancelling_one_request_never_stalls_its_batch(
    aiohttp_client: Any,
) -> None:
    """Ray Serve #50046: a client cancelling a request that is part of a running batch; the
    batch goes on and the others get their results."""
    runtime = build([CIFAR, FACES], policy="batch")
    client = await serve(aiohttp_client, runtime)
    n = 6
    reference = {}
    for i in range(n):
        status, answer = await infer(client, infer_doc(small_jpeg(i), request_id=f"ref{i}"))
        reference[f"c{i}"] = answer["result"]
    with StageGate(runtime, FACES, 0) as face_gate, StageGate(runtime, CIFAR, 1) as gate:
        face_gate.close()
        blocker = asyncio.create_task(
            infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES))
        )
        await face_gate.held()
        tasks = {
            f"c{i}": asyncio.create_task(
                infer(client, infer_doc(small_jpeg(i), request_id=f"c{i}"))
            )
            for i in range(n)
        }
        await wait_for(lambda: len(runtime.pending) == n + 1, f"{n} queued requests")
        gate.close()
        face_gate.open()
        await gate.held()  # the batch of n ran stage 0 and is inside stage 1
        assert gate.batches[-1] == n
        tasks["c0"].cancel()  # one client gives up mid-batch
        await wait_for(lambda: "c0" not in runtime.pending, "c0 to be forgotten")
        assert "c0" not in runtime.executor.store and "c0" not in runtime.engine.state
        gate.open()
        done = await asyncio.wait_for(
            asyncio.gather(*(tasks[f"c{i}"] for i in range(1, n))), GATE_LIMIT_S
        )
        await blocker
    for i, (status, answer) in enumerate(done, start=1):
        assert status == 200 and answer["status"] == "ok", answer
        assert answer["request_id"] == f"c{i}"
        assert answer["result"] == reference[f"c{i}"]
        assert answer["batch_sizes"][0] == n  # it was in the batch with c0
        assert answer["batch_sizes"][1:] == [n - 1] * 4  # and went on without it
    assert counters(runtime)[f"{CIFAR}/cancelled"] == 1
    assert_nothing_left(runtime)


async def test_a_client_leaving_before_its_planned_batch_starts_costs_the_others_nothing(
    aiohttp_client: Any,
) -> None:
    """A batch is planned on the event loop and starts on the executor thread a little later
    (after the work queued there). A client that goes away in between takes its request out of
    the store; the batch runs without it and its other requests are answered ok (they once
    failed with a KeyError from the store, answered "error"). Here the client leaves exactly
    then: the executor thread cancels it before running the batch."""
    runtime = build([CIFAR, FACES], policy="batch")
    client = await serve(aiohttp_client, runtime)
    loop = asyncio.get_running_loop()
    tasks: dict[str, asyncio.Task[tuple[int, Any]]] = {}
    real_run = runtime.executor.run

    def run(action: Any, cancel: Any = None, **kw: Any) -> Any:
        if "leaves" in action.request_ids and "stays" in action.request_ids:
            loop.call_soon_threadsafe(tasks["leaves"].cancel)
            deadline = time.monotonic() + GATE_LIMIT_S
            while "leaves" in runtime.executor.store and time.monotonic() < deadline:
                time.sleep(0.001)
        return real_run(action, cancel, **kw)

    runtime.executor.run = run  # type: ignore[method-assign]
    with StageGate(runtime, FACES, 0) as face_gate:
        face_gate.close()  # the executor is busy with another app while both arrive
        blocker = asyncio.create_task(
            infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES))
        )
        await face_gate.held()
        for i, rid in enumerate(("leaves", "stays")):
            tasks[rid] = asyncio.create_task(
                infer(client, infer_doc(small_jpeg(i), request_id=rid))
            )
        await wait_for(lambda: len(runtime.pending) == 3, "both queued")
        face_gate.open()
        status, answer = await asyncio.wait_for(tasks["stays"], GATE_LIMIT_S)
        await blocker
    with pytest.raises(asyncio.CancelledError):
        await tasks["leaves"]
    assert status == 200 and answer["status"] == "ok", answer
    assert answer["batch_sizes"][0] == 1  # it ran without the request that left
    assert counters(runtime) == {f"{CIFAR}/cancelled": 1, f"{CIFAR}/ok": 1, f"{FACES}/ok": 1}
    assert_nothing_left(runtime)


@pytest.mark.parametrize("policy", ["batch", "dynamic"])
async def test_ray_serve_43288_batch_is_never_capped_below_the_plan(
    aiohttp_client: Any, policy: str
) -> None:
    """Ray Serve #43288: N requests waiting together, B >= N: executed as one batch of N."""
    runtime = build([CIFAR, FACES], policy=policy)
    n = 12
    assert runtime.deployment.batch_limit(CIFAR) >= n
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, FACES, 0) as face_gate, StageGate(runtime, CIFAR, 0) as gate:
        face_gate.close()
        blocker = asyncio.create_task(
            infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES))
        )
        await face_gate.held()
        tasks = [
            asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"n{i}")))
            for i in range(n)
        ]
        await wait_for(lambda: len(runtime.pending) == n + 1, f"{n} queued requests")
        face_gate.open()
        results = await asyncio.gather(*tasks)
        await blocker
        assert gate.batches == [n]  # stage 0 ran once, for all of them
    for status, answer in results:
        assert status == 200 and answer["status"] == "ok"
        assert answer["batch_sizes"] == [n] * 5
    assert_nothing_left(runtime)


# --- SIGTERM --------------------------------------------------------------------------------------
def _start_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "layerbatch", "serve", "--apps", CIFAR, "--port", str(port),
           "--threads", "1", "--policy", "nexus"]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


async def _wait_ready(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    end = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            assert proc.poll() is None, log.read_text()
            try:
                async with session.get(f"{base}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("layerbatch serve did not become ready within 60 s")


async def test_sigterm_answers_every_accepted_request_then_exits(tmp_path: Path) -> None:
    """`layerbatch serve` under SIGTERM: stops accepting, answers every accepted request, exits 0.

    The server runs `nexus`, which holds requests back to fill a batch until the oldest one's
    budget is nearly spent: the requests are deterministically queued (accepted, unanswered)
    when the signal arrives, whatever the speed of this machine."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = _start_server(port, log)
    try:
        await _wait_ready(proc, base, log)
        n = 6
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            answered_at: dict[str, float] = {}

            async def one(i: int) -> tuple[int, Any]:
                body = packb(infer_doc(small_jpeg(i), request_id=f"t{i}", deadline_ms=2500.0))
                async with session.post(f"{base}/v1/infer", data=body, headers=MSGPACK) as r:
                    doc = msgpack.unpackb(await r.read(), raw=False)
                    answered_at[f"t{i}"] = time.monotonic()
                    return r.status, doc

            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            end = time.monotonic() + 10
            while True:  # until the server holds all of them
                async with session.get(f"{base}/v1/status") as resp:
                    if (await resp.json())["queued"] == n:
                        break
                assert time.monotonic() < end and not answered_at, "requests were not queued"
                await asyncio.sleep(0.01)
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            # no new requests afterwards: refused once the listener closes, or 503 while the
            # accepted ones drain (one sent before the signal is handled may still be served)
            refused = False
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                while not refused and time.monotonic() - signalled < 10:
                    try:
                        async with s.post(
                            f"{base}/v1/infer",
                            data=packb(infer_doc(small_jpeg(), deadline_ms=50.0)),
                            headers=MSGPACK,
                        ) as resp:
                            assert resp.status in (200, 503), resp.status
                    except aiohttp.ClientConnectionError:
                        refused = True
                    await asyncio.sleep(0.01)
            assert refused, "the server still accepted connections 10 s after SIGTERM"
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        # every accepted request was answered: with its result, or dropped
        for status, doc in results:
            assert status == 200, doc
            assert doc["status"] in ("ok", "dropped"), doc
        assert all(t > signalled for t in answered_at.values())
        assert proc.wait(timeout=15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

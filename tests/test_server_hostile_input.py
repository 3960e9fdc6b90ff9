"""Input past the ordinary mistakes, through real sockets: numbers JSON or a float cannot hold,
nesting too deep to parse, empty and oversized images, inputs that overflow the model, ids a
client chose that the server would also give, paths and methods the API does not have, and a
KServe batch larger than the queue's room. Each gets one sentence naming what was wrong (never a
500, never silence on a WebSocket), and a valid request in flight beside it is still served."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
from typing import Any

import aiohttp
import cv2
import msgpack
import numpy as np
import pytest

from server.app import ServerConfig
from server.inputs import encoded_size
from server.runtime import NOT_FINITE, Runtime
from server.wire import MAX_FEATURE_SCALE, MAX_ITEMS, fresh_id
from tests.server_cases import (
    CIFAR,
    Client,
    StageGate,
    build,
    counters,
    good_request_in_flight,
    infer,
    infer_doc,
    jpeg,
    json_doc,
    packb,
    post,
    raw_answer,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    small_jpeg,
    start_upload,
    synthetic_rgb,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("restore_process_globals")

ONLY_GOOD = {f"{CIFAR}/ok": 1}
JSON_TYPE = "application/json"
HUGE_INT = "1" + "0" * 400  # a JSON integer no float holds
DEEP = b"[" * 100_000 + b"]" * 100_000  # deeper than Python's parser recurses
# 6 MB of empty arrays: parsed, they held the event loop 0.4 s here (16 MB: 1.0 s)
WIDE = b"[" + b"[]," * 2_000_000 + b"[]]"


async def setup(aiohttp_client: Any, **build_kwargs: Any) -> tuple[Runtime, Client, StageGate]:
    runtime = build(**build_kwargs)
    client = await serve(aiohttp_client, runtime, ServerConfig())
    return runtime, client, StageGate(runtime, CIFAR, 1)


def with_size(frame: bytes, width: int, height: int) -> bytes:
    """`frame` (a baseline JPEG) with its start-of-frame header saying width x height."""
    i = frame.index(b"\xff\xc0")
    return frame[: i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + frame[i + 9 :]


# --- /v1/infer ------------------------------------------------------------------------------
BAD_BODIES: list[tuple[bytes, str, int, str]] = [
    (packb(infer_doc(b"")), "application/msgpack", 422, "payload.jpeg: expected an encoded image"),
    (
        json.dumps({"app": CIFAR, "payload": {"jpeg": ""}}).encode(),
        "application/json",
        422,
        "payload.jpeg: expected an encoded image (JPEG), got 0 bytes",
    ),
    (
        f'{{"app": "{CIFAR}", "deadline_ms": {HUGE_INT}, "payload": {{"jpeg": ""}}}}'.encode(),
        "application/json",
        422,
        "deadline_ms: expected a number in (0, 600000]",
    ),
    (
        f'{{"app": "{CIFAR}", "deadline_ms": {"9" * 5000}}}'.encode(),
        "application/json",
        400,
        "body: expected a JSON document",
    ),
    (DEEP, "application/json", 400, "body: expected a JSON document"),
    (
        WIDE,
        "application/json",
        400,
        f"body: expected a JSON document of at most {MAX_ITEMS} values, got 2000000 commas",
    ),
    (
        packb(infer_doc(with_size(small_jpeg(0), 10_000, 10_000))),
        "application/msgpack",
        422,
        "payload.jpeg: expected at most 40 megapixels, got 10000x10000",
    ),
]


@pytest.mark.parametrize(("body", "content_type", "status", "message"), BAD_BODIES)
@pytest.mark.asyncio
async def test_hostile_bodies_get_one_sentence_and_spare_the_request_in_flight(
    aiohttp_client: Any, body: bytes, content_type: str, status: int, message: str
) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate):
            got, doc, _ = await post(client, body, content_type)
            assert (got, doc["status"]) == (status, status), doc
            assert doc["error"].startswith(message), doc
            assert len(doc["error"]) < 400  # a sentence, not the input echoed back
    assert counters(runtime) == ONLY_GOOD


@pytest.mark.asyncio
async def test_an_image_of_another_format_is_refused_before_decoding(aiohttp_client: Any) -> None:
    """Only a JPEG's or PNG's size is read before decoding: a TIFF or BMP could be 400
    megapixels in a few MB (a 20000 x 20000 TIFF of 1.8 MB held the decode thread for 7 s)."""
    runtime, client, gate = await setup(aiohttp_client)
    rgb = synthetic_rgb(32, 32, 3)
    with gate:
        async with good_request_in_flight(client, gate):
            for ext in (".bmp", ".tiff"):
                frame = cv2.imencode(ext, rgb)[1].tobytes()
                status, doc = await infer(client, infer_doc(frame))
                assert status == 422, doc
                assert doc["error"] == (
                    "payload.jpeg: expected a JPEG or PNG image, could not decode a header of either"
                )
    status, doc = await infer(client, infer_doc(cv2.imencode(".png", rgb)[1].tobytes()))
    assert status == 200 and doc["status"] == "ok"
    assert counters(runtime) == {f"{CIFAR}/ok": 2}


def test_encoded_size_reads_jpeg_and_png_headers() -> None:
    rgb = synthetic_rgb(37, 53, 1)
    progressive = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes()
    for frame in (jpeg(rgb), progressive, cv2.imencode(".png", rgb)[1].tobytes()):
        assert encoded_size(frame) == (53, 37)
    assert encoded_size(with_size(jpeg(rgb), 7000, 9)) == (7000, 9)
    for other in (b"", b"\xff\xd8", b"\xff\xd8\xff\xda\x00\x02", b"GIF89a", jpeg(rgb)[:20]):
        assert encoded_size(other) is None


@pytest.mark.asyncio
async def test_features_whose_scale_would_overflow_the_model_are_400(
    aiohttp_client: Any,
) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    features = {"position": 1, "shape": [16, 32, 32], "scale": 1e300, "zero_point": 0,
                "codec": "raw", "data": b"\xff" * (16 * 32 * 32)}  # fmt: skip
    with gate:
        async with good_request_in_flight(client, gate):
            status, doc = await infer(client, infer_doc(features))
            assert status == 400
            assert doc["error"] == (
                f"payload.features.scale: expected a positive number up to {MAX_FEATURE_SCALE:g}"
            )
    assert counters(runtime) == ONLY_GOOD


# --- automatic request ids ------------------------------------------------------------------
def test_fresh_id_skips_the_ids_in_flight() -> None:
    counter = itertools.count()
    assert fresh_id(counter, {"r1", "r2"}.__contains__) == "r0"
    assert fresh_id(counter, {"r1", "r2"}.__contains__) == "r3"


@pytest.mark.asyncio
async def test_a_request_without_an_id_never_collides_with_a_clients_own(
    aiohttp_client: Any,
) -> None:
    """Clients chose "r0" and "r1", the ids the server would give next: a request that sends no
    id is served under another, not refused 409."""
    runtime, client, gate = await setup(aiohttp_client)
    with gate:
        async with good_request_in_flight(client, gate, request_id="r0"):
            held = asyncio.create_task(infer(client, infer_doc(small_jpeg(1), request_id="r1")))
            await wait_for(lambda: "r1" in runtime.pending, "r1 queued")
            auto = asyncio.create_task(infer(client, infer_doc(small_jpeg(2))))
            await wait_for(lambda: len(runtime.pending) == 3, "the request without an id queued")
            assert set(runtime.pending) == {"r0", "r1", "r2"}
        status, doc = await auto
        assert (status, doc["status"], doc["request_id"]) == (200, "ok", "r2")
        assert (await held)[1]["request_id"] == "r1"


# --- outputs --------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_an_input_that_overflows_the_model_is_422_not_nan(aiohttp_client: Any) -> None:
    """Finite float32 inputs near float32's largest value overflow the first layers: the answer
    says so (a NaN would make the JSON answer invalid)."""
    runtime, client, _ = await setup(aiohttp_client)
    x = {"name": "INPUT", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [3e38] * 3072}
    async with client.post(f"/v2/models/{CIFAR}/infer", json={"inputs": [x]}) as resp:
        assert resp.status == 422
        assert NOT_FINITE in (await resp.json())["error"]
    x["data"] = [0.5] * 3072
    async with client.post(f"/v2/models/{CIFAR}/infer", json={"inputs": [x]}) as resp:
        assert resp.status == 200
        assert np.isfinite((await resp.json())["outputs"][0]["data"]).all()
    assert counters(runtime) == {f"{CIFAR}/error": 1, f"{CIFAR}/ok": 1}


# --- KServe v2 ------------------------------------------------------------------------------
KSERVE_CASES: list[tuple[dict[str, Any], int, str]] = [
    ({"data": ["0.5"] * 3072}, 400, "inputs[0].data: expected 3072 numbers"),
    ({"data": [True] * 3072}, 400, "inputs[0].data: expected 3072 numbers"),
    ({"data": [10**400] + [0] * 3071}, 400, "inputs[0].data: expected 3072 numbers"),
    ({"data": [1e300] * 3072}, 422, "inputs[0].data: expected finite numbers"),
    ({"datatype": "INT8"}, 400, "inputs[0].datatype: expected FP32, got 'INT8'"),
    ({"shape": [10**400, 3, 32, 32]}, 422, "inputs[0].shape: expected at most 1000 samples"),
]


@pytest.mark.parametrize(("change", "status", "message"), KSERVE_CASES)
@pytest.mark.asyncio
async def test_kserve_inputs_that_are_not_fp32_numbers_are_refused(
    aiohttp_client: Any, change: dict[str, Any], status: int, message: str
) -> None:
    runtime, client, _ = await setup(aiohttp_client)
    x = {"name": "INPUT", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}
    body = json.dumps({"inputs": [{**x, **change}]})
    async with client.post(
        f"/v2/models/{CIFAR}/infer", data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        doc = await resp.json()
        assert resp.status == status, doc
        assert doc["error"].startswith(message) and len(doc["error"]) < 400, doc
    assert counters(runtime) == {}


@pytest.mark.asyncio
async def test_a_kserve_body_of_more_numbers_than_the_queue_holds_is_refused_unparsed(
    aiohttp_client: Any,
) -> None:
    """KServe's JSON tensors may hold a batch the queue has room for (`--max-queued` samples of
    3072 numbers here), and no more: counted as commas, before the parser holds the loop."""
    runtime = build(max_queued=10)
    client = await serve(aiohttp_client, runtime)
    room = 10 * 3072 + MAX_ITEMS
    data = b"[" + b"0," * room + b"0]"
    body = b'{"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": '
    async with client.post(
        f"/v2/models/{CIFAR}/infer", data=body + data + b"}]}", headers={"Content-Type": JSON_TYPE}
    ) as resp:
        doc = await resp.json()
        assert resp.status == 400, doc
        assert doc["error"].startswith(f"body: expected a JSON document of at most {room} values")
    x = {"name": "INPUT", "datatype": "FP32", "shape": [10, 3, 32, 32], "data": [0.5] * 30720}
    async with client.post(  # a batch that fits is served
        f"/v2/models/{CIFAR}/infer", json={"inputs": [x], "parameters": {"deadline_ms": 60000}}
    ) as resp:
        assert resp.status == 200, await resp.text()
    assert counters(runtime) == {f"{CIFAR}/ok": 10}


@pytest.mark.asyncio
async def test_a_kserve_batch_refused_for_room_leaves_none_of_its_samples_queued(
    aiohttp_client: Any,
) -> None:
    """Three samples where the queue has room for one: the request gets 503, and the sample
    admitted before the others were refused is withdrawn, not run for nobody."""
    runtime, client, gate = await setup(aiohttp_client, max_queued=3)
    x = {"name": "INPUT", "datatype": "FP32", "shape": [3, 3, 32, 32], "data": [0.0] * 3 * 3072}
    with gate:
        async with good_request_in_flight(client, gate):
            held = asyncio.create_task(infer(client, infer_doc(small_jpeg(1), request_id="held")))
            await wait_for(lambda: len(runtime.pending) == 2, "two requests queued")
            async with client.post(f"/v2/models/{CIFAR}/infer", json={"inputs": [x]}) as resp:
                assert resp.status == 503
                assert "the queue is full (3 requests)" in (await resp.json())["error"]
            await wait_for(lambda: len(runtime.pending) == 2, "the batch's samples withdrawn")
            assert set(runtime.pending) == {"good", "held"}
        assert (await held)[0] == 200
    # the sample admitted was still being decoded: withdrawn before it joined the queue
    assert counters(runtime) == {f"{CIFAR}/ok": 2, f"{CIFAR}/cancelled": 1}


# --- the WebSocket stream -------------------------------------------------------------------
@pytest.mark.asyncio
async def test_every_stream_message_is_answered_whatever_it_holds(aiohttp_client: Any) -> None:
    runtime, client, _ = await setup(aiohttp_client)
    ws = await client.ws_connect("/v1/stream")
    await ws.send_bytes(packb(infer_doc(b"", request_id="empty")))
    await ws.send_str(f'{{"app": "{CIFAR}", "request_id": "huge", "deadline_ms": {HUGE_INT}}}')
    await ws.send_str(DEEP.decode())
    await ws.send_str(WIDE.decode())
    frame = base64.b64encode(small_jpeg(0)).decode()
    await ws.send_str(json.dumps({"app": CIFAR, "request_id": "good", "payload": {"jpeg": frame}}))
    answers = {}
    for _ in range(5):
        msg = await asyncio.wait_for(ws.receive(), 30)
        doc = json.loads(msg.data) if isinstance(msg.data, str) else msgpack.unpackb(msg.data)
        answers[doc["request_id"]] = doc
    await ws.close()
    assert answers["good"]["status"] == "ok"
    assert (answers["empty"]["code"], answers["huge"]["code"]) == (422, 422)
    unnamed = [a for rid, a in answers.items() if rid not in ("good", "empty", "huge")]
    assert [(a["status"], a["code"]) for a in unnamed] == [("error", 400)] * 2
    assert all(a["error"].startswith("body: expected a JSON document") for a in unnamed)
    assert any(f"at most {MAX_ITEMS} values" in a["error"] for a in unnamed)
    assert counters(runtime) == {f"{CIFAR}/ok": 1}


# --- paths, methods, Content-Types ----------------------------------------------------------
@pytest.mark.asyncio
async def test_unknown_paths_and_methods_are_one_json_sentence(aiohttp_client: Any) -> None:
    _, client, _ = await setup(aiohttp_client)
    cases = [
        ("GET", "/v1/nope", 404, "path: expected one of /healthz, /metrics, /readyz, /v1/estimate"),
        ("GET", "/v1/infer", 405, "method: expected POST for /v1/infer, got GET"),
        ("DELETE", "/v1/status", 405, "method: expected GET, HEAD for /v1/status, got DELETE"),
        ("GET", "/v1/stream", 400, "GET /v1/stream: No WebSocket UPGRADE hdr"),
    ]
    for method, path, status, message in cases:
        async with client.request(method, path) as resp:
            assert (resp.status, resp.content_type) == (status, "application/json"), path
            doc = await resp.json()
            assert doc["status"] == status and doc["error"].startswith(message), doc


@pytest.mark.asyncio
async def test_a_body_of_another_content_type_is_refused_in_json(aiohttp_client: Any) -> None:
    _, client, _ = await setup(aiohttp_client)
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):
        status, doc, _ = await post(client, b'{"app": "x"}', ctype)
        assert status == 415 and isinstance(doc, dict), doc
        assert doc["error"].startswith("Content-Type: expected application/msgpack or")


# --- second sweep -----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_an_automatic_id_skips_an_id_whose_request_is_still_decoding(
    aiohttp_client: Any,
) -> None:
    """The decode thread is held, so "r0" (a client's own id) waits there, not yet queued: the
    request that sends no id must not be given "r0" too."""
    runtime, client, _ = await setup(aiohttp_client)
    release = threading.Event()
    held = runtime._decode_pool.submit(release.wait, 30)
    try:
        own = asyncio.create_task(infer(client, infer_doc(small_jpeg(0), request_id="r0")))
        await wait_for(lambda: "r0" in runtime._decoding, "r0 waiting for its decode")
        auto = asyncio.create_task(infer(client, infer_doc(small_jpeg(1))))
        await wait_for(lambda: len(runtime._decoding) == 2, "the second waiting for its decode")
    finally:
        release.set()
    held.result(30)
    answers = [await own, await auto]
    assert [(s, a["status"], a["request_id"]) for s, a in answers] == [
        (200, "ok", "r0"),
        (200, "ok", "r1"),
    ]


@pytest.mark.asyncio
async def test_an_id_no_answer_could_carry_is_400(aiohttp_client: Any) -> None:
    _, client, _ = await setup(aiohttp_client)
    frame = base64.b64encode(small_jpeg(0)).decode()
    body = f'{{"app": "{CIFAR}", "request_id": "\\ud800", "payload": {{"jpeg": "{frame}"}}}}'
    status, doc, _ = await post(
        client, body.encode(), "application/json", headers={"Accept": "application/msgpack"}
    )
    assert status == 400
    assert doc["error"] == "request_id: expected a string of 1 to 200 characters (Unicode text)"


@pytest.mark.asyncio
async def test_a_body_that_stops_arriving_is_408(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime, ServerConfig(body_timeout_s=0.2))
    got = await raw_exchange(
        client.port,
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{",
    )
    assert got == (408, {"status": 408, "error": "body: expected all 1000 bytes within 0.2 s"})
    status, answer = await infer(client, infer_doc(small_jpeg(0)))  # and the server serves on
    assert (status, answer["status"]) == (200, "ok")


@pytest.mark.asyncio
async def test_shutdown_answers_a_streams_messages_then_closes_it_going_away(
    aiohttp_client: Any,
) -> None:
    runtime, client, gate = await setup(aiohttp_client)
    ws = await client.ws_connect("/v1/stream")
    with gate:
        gate.close()
        await ws.send_bytes(packb(infer_doc(small_jpeg(0), request_id="w0")))
        await gate.held()
        shutdown = asyncio.create_task(client.server.app.shutdown())
        await wait_for(lambda: not runtime.accepting, "the drain to begin")
        gate.open()
        answer = msgpack.unpackb((await asyncio.wait_for(ws.receive(), 30)).data)
        closing = await asyncio.wait_for(ws.receive(), 30)
        await asyncio.wait_for(shutdown, 30)
    assert (answer["request_id"], answer["status"]) == ("w0", "ok")
    assert closing.type == aiohttp.WSMsgType.CLOSE
    assert (closing.data, closing.extra) == (1001, "the server is shutting down")


async def raw_exchange(port: int, head: bytes) -> tuple[int, Any]:
    """Send a request head (no body) on a raw socket; the response's status and JSON document."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    got = await raw_answer(reader)
    writer.close()
    assert got is not None, "the connection closed unanswered"
    return got


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/infer", f"/v2/models/{CIFAR}/infer"])
@pytest.mark.parametrize("expect", [True, False])
async def test_a_body_declared_over_the_limit_is_413_before_it_is_sent(
    aiohttp_client: Any, path: str, expect: bool
) -> None:
    """With or without `Expect: 100-continue`, a Content-Length over the limit is answered 413
    at once: no 100 Continue, and the server does not wait for (or read) the body."""
    runtime = build()
    client = await serve(aiohttp_client, runtime, ServerConfig(max_body_bytes=100_000))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 5000000000\r\n" + ("Expect: 100-continue\r\n" if expect else "") + "\r\n"
    ).encode()
    status, doc = await raw_exchange(client.port, head)
    assert status == doc["status"] == 413
    assert doc["error"].startswith("body: expected at most 100000 bytes (")
    assert "5000000000" in doc["error"]
    status, answer = await infer(client, infer_doc(small_jpeg(0)))  # and the server serves on
    assert (status, answer["status"]) == (200, "ok")


@pytest.mark.asyncio
async def test_expect_continue_within_the_limit_is_served_and_another_expect_is_417(
    aiohttp_client: Any,
) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime, ServerConfig())
    body = json.dumps(json_doc(small_jpeg(0))).encode()
    reader, writer = await start_upload(client.port, body)  # 100 Continue, then half the body
    writer.write(body[len(body) // 2 :])
    await writer.drain()
    got = await raw_answer(reader)
    writer.close()
    assert got is not None and got[0] == 200 and got[1]["status"] == "ok"
    status, doc = await raw_exchange(
        client.port,
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: teapot\r\n\r\n",
    )
    assert status == 417
    assert doc == {
        "status": 417,
        "error": "Expect: expected 100-continue or no Expect header, got 'teapot'",
    }

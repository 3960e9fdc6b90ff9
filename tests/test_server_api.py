"""The edge server's API through real sockets (issue 4, "API"): /v1/infer in msgpack and JSON,
feature maps in H.264 and raw, the WebSocket stream, estimates, models, status, metrics, health,
run-time policy switches, 200 concurrent requests, and plans identical to the simulator's."""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import json
import re
from typing import Any

import aiohttp
import msgpack
import pytest
import torch
from aiohttp import WSMsgType

from layerexec.features import decode_features
from layerexec.script import scripted_count
from scheduler.engine import Engine
from scheduler.policies import make_policy
from scheduler.state import SchedulerState
from scheduler.types import Plan, Request, Step
from server.app import ServerConfig
from tests.server_cases import (
    CIFAR,
    FACES,
    MSGPACK,
    StageGate,
    build,
    counters,
    features_payload,
    get_json,
    infer,
    infer_doc,
    jpeg,
    json_doc,
    packb,
    post,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    shared_rgb,
    small_jpeg,
    stage_input,
    synthetic_rgb,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("restore_process_globals")

CIFAR_GROUPS = 5  # resnet20's 11 stages in the deployment's 5 layer groups: one step each
TIMING = ("received_ms", "queue_ms", "exec_ms", "total_ms")


def check_ok_answer(answer: dict[str, Any], request_id: str | None = None) -> None:
    """The fields every served answer carries, with consistent values."""
    assert answer["status"] == "ok", answer
    if request_id is not None:
        assert answer["request_id"] == request_id
    assert isinstance(answer["request_id"], str) and answer["request_id"]
    assert "reason" not in answer
    timing = answer["timing"]
    assert set(timing) == set(TIMING)
    assert all(isinstance(timing[k], float | int) and timing[k] >= 0 for k in TIMING)
    # a request is queued, then executed; planning between steps only adds to the total
    assert timing["total_ms"] >= timing["queue_ms"] + timing["exec_ms"] - 0.01
    assert timing["exec_ms"] > 0
    assert answer["on_time"] is True
    assert answer["batch_sizes"] and all(b >= 1 for b in answer["batch_sizes"])
    assert isinstance(answer["estimate_ms"], float | int) and answer["estimate_ms"] > 0


def top5(answer: dict[str, Any]) -> list[dict[str, Any]]:
    result = answer["result"]["top5"]
    assert len(result) == 5
    scores = [c["score"] for c in result]
    assert scores == sorted(scores, reverse=True)
    assert all(0 <= v <= 1 for v in scores) and sum(scores) <= 1.0 + 1e-4
    return result


# --- /v1/infer ----------------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("script", [False, True], ids=["eager", "scripted"])
async def test_infer_msgpack_classifies_a_real_photo_as_cat(
    aiohttp_client: Any, script: bool
) -> None:
    rgb = shared_rgb("skimage_chelsea.png")
    runtime = build(script=script)
    assert scripted_count(runtime.models[CIFAR]) == (
        len(runtime.models[CIFAR].stages) if script else 0
    )
    client = await serve(aiohttp_client, runtime)
    status, answer, headers = await post(
        client, packb(infer_doc(jpeg(rgb), request_id="chelsea", client_id="phone-1"))
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/msgpack")
    check_ok_answer(answer, "chelsea")
    best = top5(answer)[0]
    assert best["label"] == "cat" and best["class"] == 3
    assert best["score"] > 0.5
    # an idle server runs one request alone through every layer group
    assert answer["batch_sizes"] == [1] * CIFAR_GROUPS


@pytest.mark.asyncio
async def test_infer_msgpack_and_json_give_the_same_answer(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    frame = small_jpeg(seed=3)
    status_m, by_msgpack = await infer(client, infer_doc(frame, request_id="m"))
    doc = json_doc(frame, request_id="j")
    status_j, by_json, headers = await post(client, json.dumps(doc).encode(), "application/json")
    assert (status_m, status_j) == (200, 200)
    assert headers["Content-Type"].startswith("application/json")
    check_ok_answer(by_msgpack, "m")
    check_ok_answer(by_json, "j")
    assert by_json["result"] == by_msgpack["result"]
    # without a request_id the server names the request itself
    status, anonymous = await infer(client, infer_doc(frame))
    assert status == 200
    check_ok_answer(anonymous)
    assert anonymous["request_id"] not in ("m", "j")
    assert anonymous["result"] == by_msgpack["result"]
    assert counters(runtime) == {f"{CIFAR}/ok": 3}


@pytest.mark.asyncio
async def test_infer_json_base64_errors_name_the_field(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    doc = {"app": CIFAR, "payload": {"jpeg": "@@not base64@@"}}
    status, answer, _ = await post(client, json.dumps(doc).encode(), "application/json")
    assert status == 400
    assert answer["error"].startswith("payload.jpeg:") and "base64" in answer["error"]


@pytest.mark.asyncio
async def test_ultraface_finds_the_astronauts_face(aiohttp_client: Any) -> None:
    rgb = shared_rgb("skimage_astronaut.png")
    runtime = build([FACES])
    client = await serve(aiohttp_client, runtime)
    status, answer = await infer(client, infer_doc(jpeg(rgb), app=FACES, request_id="face"))
    assert status == 200
    check_ok_answer(answer, "face")
    boxes = answer["result"]["boxes"]
    assert len(boxes) == 1, boxes  # one person in the photo
    (x0, y0, x1, y1), score = boxes[0]["box"], boxes[0]["score"]
    assert score > 0.9
    # boxes are in the model's 320 x 240 input pixels; the face is in the upper middle
    assert 0 <= x0 < x1 <= 320 and 0 <= y0 < y1 <= 240
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    assert 100 < cx < 190 and 20 < cy < 100
    assert 20 < x1 - x0 < 120


@pytest.mark.asyncio
async def test_face_detector_on_a_gradient_finds_no_face(aiohttp_client: Any) -> None:
    runtime = build([FACES])
    client = await serve(aiohttp_client, runtime)
    status, answer = await infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES))
    assert status == 200
    check_ok_answer(answer)
    assert answer["result"] == {"boxes": []}


# --- feature maps -----------------------------------------------------------------------------
@functools.cache
def _encoded(key: tuple[int, str], blob: bytes, shape: tuple[int, ...]) -> dict[str, Any]:
    x = torch.frombuffer(bytearray(blob), dtype=torch.float32).reshape(shape)
    return features_payload(x, key[0], key[1])


def payload_of(x: torch.Tensor, k: int, codec: str) -> dict[str, Any]:
    """features_payload, encoded once per (tensor, k, codec)."""
    return _encoded((k, codec), x.numpy().tobytes(), tuple(x.shape))


def local_scores(runtime: Any, payload: dict[str, Any], k: int) -> list[float]:
    """Softmax scores of the model's stages k.. on the dequantised feature map."""
    x = decode_features(
        payload["shape"], payload["scale"], payload["zero_point"], payload["codec"], payload["data"]
    )
    logits = runtime.models[CIFAR].run(x.unsqueeze(0), k)
    return [float(v) for v in torch.softmax(logits[0].float(), 0)]


@pytest.mark.asyncio
async def test_feature_maps_continue_from_their_stage(aiohttp_client: Any) -> None:
    """A client that ran stages 0..k-1 itself sends the stage-k input (INT8, H.264 or raw): the
    answer matches the JPEG path's within quantisation error."""
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    rgb = synthetic_rgb(32, 32, seed=7)
    status, reference = await infer(client, infer_doc(jpeg(rgb), request_id="jpeg"))
    assert status == 200
    want = top5(reference)
    for k in (1, 4, 9, 10):
        x = stage_input(runtime, CIFAR, rgb, k)
        assert list(x.shape) == list(runtime.models[CIFAR].in_shapes[k])
        for codec in ("h264", "raw"):
            rid = f"k{k}-{codec}"
            status, answer = await infer(client, infer_doc(payload_of(x, k, codec), request_id=rid))
            assert status == 200, answer
            check_ok_answer(answer, rid)
            got = top5(answer)
            # within quantisation error of the JPEG path: the same class, a close score
            assert got[0]["class"] == want[0]["class"], (rid, got, want)
            assert abs(got[0]["score"] - want[0]["score"]) < 0.15, (rid, got, want)
            # and exactly what the model gives for the dequantised map the client sent
            local = local_scores(runtime, payload_of(x, k, codec), k)
            for c in got:
                assert c["score"] == pytest.approx(local[c["class"]], abs=2e-3), (rid, c)
            # a request entering at stage k runs only the groups from k on
            bounds = runtime.deployment.group_bounds(CIFAR)
            assert len(answer["batch_sizes"]) == 1 + sum(b > k for b in bounds)
    # the same feature map as JSON with base64 bytes
    payload = features_payload(stage_input(runtime, CIFAR, rgb, 5), 5, "h264")
    payload["data"] = base64.b64encode(payload["data"]).decode()
    body = json.dumps(infer_doc(payload, request_id="json-features")).encode()
    status, answer, _ = await post(client, body, "application/json")
    assert status == 200, answer
    assert top5(answer)[0]["class"] == want[0]["class"]
    assert runtime.executor.store.nbytes() == 0


@pytest.mark.asyncio
async def test_models_lists_apps_and_stage_input_shapes(aiohttp_client: Any) -> None:
    runtime = build([CIFAR, FACES])
    client = await serve(aiohttp_client, runtime)
    status, doc = await get_json(client, "/v1/models")
    assert status == 200
    assert doc["policy"] == "dp-tardy"
    assert set(doc["apps"]) == {CIFAR, FACES}
    cifar = doc["apps"][CIFAR]
    assert cifar["models"] == [CIFAR]
    assert cifar["stages"] == 11
    assert cifar["input_shape"] == [3, 32, 32]
    assert cifar["kind"] == "classifier"
    assert cifar["stage_input_shapes"] == [list(s) for s in runtime.models[CIFAR].in_shapes]
    assert cifar["stage_input_shapes"][1] == [16, 32, 32]
    assert cifar["stage_input_shapes"][10] == [64]
    assert cifar["max_batch"] == {CIFAR: 32}
    faces = doc["apps"][FACES]
    assert faces["kind"] == "face-detector"
    assert faces["input_shape"] == [3, 240, 320]
    assert len(faces["stage_input_shapes"]) == faces["stages"] == 16


# --- WebSocket ----------------------------------------------------------------------------------
async def _ws_answers(ws: Any, n: int) -> list[tuple[str, dict[str, Any]]]:
    """n answers, each as ("binary"|"text", decoded document)."""
    out = []
    for _ in range(n):
        msg = await asyncio.wait_for(ws.receive(), 30)
        if msg.type == WSMsgType.BINARY:
            out.append(("binary", msgpack.unpackb(msg.data, raw=False)))
        elif msg.type == WSMsgType.TEXT:
            out.append(("text", json.loads(msg.data)))
        else:
            raise AssertionError(f"unexpected WebSocket message {msg.type}: {msg.data!r}")
    return out


@pytest.mark.asyncio
async def test_stream_answers_many_messages_matched_by_request_id(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    ws = await client.ws_connect("/v1/stream")
    frames = {f"w{i}": small_jpeg(seed=i % 4) for i in range(20)}
    for rid, frame in frames.items():  # all sent before any answer is read
        await ws.send_bytes(packb(infer_doc(frame, request_id=rid)))
    await ws.send_str(json.dumps(json_doc(small_jpeg(seed=1), request_id="text")))
    await ws.send_bytes(packb({"app": CIFAR, "request_id": "bad"}))  # no payload
    answers = await _ws_answers(ws, 22)
    await ws.close()

    errors = [doc for _, doc in answers if doc["status"] == "error"]
    assert len(errors) == 1
    assert errors[0]["code"] == 400 and errors[0]["error"].startswith("payload:")
    served = {doc["request_id"]: (kind, doc) for kind, doc in answers if doc["status"] != "error"}
    assert set(served) == {*frames, "text"}
    for rid, (kind, doc) in served.items():
        check_ok_answer(doc, rid)
        assert kind == ("text" if rid == "text" else "binary")
    # the same frame gives the same classification however it came
    assert served["text"][1]["result"] == served["w1"][1]["result"]
    assert counters(runtime) == {f"{CIFAR}/ok": 21}
    await wait_for(lambda: not runtime.pending, "the stream's requests to finish")


@pytest.mark.asyncio
async def test_stream_error_answer_carries_the_messages_request_id(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    ws = await client.ws_connect("/v1/stream")
    await ws.send_bytes(packb({"app": CIFAR, "request_id": "bad"}))  # no payload
    [(_, answer)] = await _ws_answers(ws, 1)
    await ws.close()
    assert answer["status"] == "error" and answer["code"] == 400
    assert answer["request_id"] == "bad"


# --- estimates ----------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_estimate_is_a_number_that_grows_with_the_queue(aiohttp_client: Any) -> None:
    runtime = build()
    runtime.estimate_ttl_ms = 0.0  # every query plans afresh
    client = await serve(aiohttp_client, runtime)
    idle = {}
    for k in (0, 5, 10):
        status, doc = await get_json(client, f"/v1/estimate?app={CIFAR}&position={k}")
        assert status == 200
        assert doc["app"] == CIFAR and doc["position"] == k
        assert isinstance(doc["completion_ms"], float | int) and doc["completion_ms"] > 0
        idle[k] = doc["completion_ms"]
    # fewer stages left, sooner done; idle, the estimate is the profile's solo time
    assert idle[0] > idle[5] > idle[10]
    solo = runtime.deployment.solo_ms(CIFAR, 0)
    assert idle[0] == pytest.approx(solo, abs=0.01)

    with StageGate(runtime, CIFAR, 1) as gate:
        gate.close()
        tasks = [
            asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"q{i}")))
            for i in range(12)
        ]
        await gate.held()
        await wait_for(lambda: len(runtime.pending) == 12, "12 queued requests")
        status, doc = await get_json(client, f"/v1/estimate?app={CIFAR}&position=0")
        assert status == 200
        assert doc["completion_ms"] > idle[0]
        gate.open()
        results = await asyncio.gather(*tasks)
    assert all(s == 200 and a["status"] == "ok" for s, a in results)


@pytest.mark.asyncio
async def test_estimate_refuses_unknown_apps_and_bad_positions(aiohttp_client: Any) -> None:
    runtime = build([CIFAR, FACES])
    client = await serve(aiohttp_client, runtime)
    status, doc = await get_json(client, "/v1/estimate?app=nope&position=0")
    assert status == 404
    assert doc["status"] == 404
    assert f"{CIFAR}, {FACES}" in doc["error"] and "'nope'" in doc["error"]
    for position in ("11", "-1", "99"):
        status, doc = await get_json(client, f"/v1/estimate?app={CIFAR}&position={position}")
        assert status == 422, position
        assert doc["error"].startswith("position:") and "0..10" in doc["error"]
        assert f"got {int(position)}" in doc["error"]
    status, doc = await get_json(client, f"/v1/estimate?app={CIFAR}&position=two")
    assert status == 400 and doc["error"].startswith("position:")
    status, doc = await get_json(client, f"/v1/estimate?app={FACES}&position=15")
    assert status == 200 and doc["completion_ms"] > 0


# --- status, metrics, health ------------------------------------------------------------------
@pytest.mark.asyncio
async def test_status_shows_policy_queue_per_stage_and_counters(aiohttp_client: Any) -> None:
    runtime = build([CIFAR, FACES])
    client = await serve(aiohttp_client, runtime)
    status, doc = await get_json(client, "/v1/status")
    assert status == 200
    assert doc["policy"] == "dp-tardy"
    assert doc["accepting"] is True
    assert doc["queued"] == 0 and doc["queue"] == {} and doc["running"] is None
    assert doc["time_scale"] == 1.0
    assert doc["stage_scales"] == {
        m: [1.0] * runtime.base_profiles[m].num_stages for m in (CIFAR, FACES)
    }
    assert doc["decode_threads"] == 1 and doc["decode_ms"] is None  # no decode yet
    assert doc["step_gap_ms"] is None  # no two steps yet
    assert doc["counters"] == {
        "answered": {},
        "on_time": {},
        "dropped": {},
        "preempted": 0,
        "stacked": 0,
    }

    with StageGate(runtime, FACES, 0) as gate:
        gate.close()
        face = asyncio.create_task(
            infer(client, infer_doc(jpeg(synthetic_rgb(240, 320)), app=FACES, request_id="f"))
        )
        await gate.held()
        tasks = [
            asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"c{i}")))
            for i in range(3)
        ]
        await wait_for(lambda: len(runtime.pending) == 4, "4 pending requests")
        status, doc = await get_json(client, "/v1/status")
        assert doc["queued"] == 4
        # the running step's request still counts where it started
        assert doc["queue"] == {f"{CIFAR}[0]": 3, f"{FACES}[0]": 1}
        assert doc["running"] == {"model": FACES, "stages": [0, 2], "batch": 1}
        gate.open()
        answers = await asyncio.gather(face, *tasks)
    assert all(s == 200 and a["status"] == "ok" for s, a in answers)
    status, doc = await get_json(client, "/v1/status")
    assert doc["queued"] == 0 and doc["queue"] == {} and doc["running"] is None
    assert doc["counters"]["answered"] == {f"{CIFAR}/ok": 3, f"{FACES}/ok": 1}
    assert doc["counters"]["on_time"] == {CIFAR: 3, FACES: 1}
    assert doc["store_bytes"] == 0


METRIC_LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*)?\})? -?[0-9.e+]+$')


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the one sample `name{labels}` in Prometheus text."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    lines = [line.replace("{} ", " ", 1) for line in text.splitlines()]  # `name{} v` is `name v`
    hits = [line for line in lines if line.startswith(prefix)]
    assert len(hits) == 1, (prefix, hits)
    return float(hits[0][len(prefix) :])


@pytest.mark.asyncio
async def test_metrics_prometheus_text(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    for i in range(3):
        status, answer = await infer(client, infer_doc(small_jpeg(i)))
        assert status == 200 and answer["status"] == "ok"
    async with client.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        text = await resp.text()
    for line in text.splitlines():
        assert line.startswith("# TYPE ") or METRIC_LINE.match(line), line
    assert metric(text, "layerbatch_requests_total", app=CIFAR, status="ok") == 3
    assert metric(text, "layerbatch_on_time_total", app=CIFAR) == 3
    assert metric(text, "layerbatch_completion_ms_count", app=CIFAR) == 3
    assert metric(text, "layerbatch_completion_ms_bucket", app=CIFAR, le="+Inf") == 3
    assert metric(text, "layerbatch_completion_ms_sum", app=CIFAR) > 0
    # one batch-size histogram per stage; each request ran every stage once, alone
    for k in range(11):
        assert metric(text, "layerbatch_batch_size_count", model=CIFAR, stage=str(k)) == 3
        assert metric(text, "layerbatch_batch_size_bucket", model=CIFAR, stage=str(k), le="1") == 3
    assert "layerbatch_plan_us_count{} " in text
    plans = float(text.split("layerbatch_plan_us_count{} ")[1].split()[0])
    assert plans >= 3
    assert metric(text, "layerbatch_preempted_total") == 0
    buckets = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('layerbatch_completion_ms_bucket{app="resnet20_cifar10"')
    ]
    assert buckets == sorted(buckets)  # cumulative


@pytest.mark.asyncio
async def test_health_and_readiness(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    assert await get_json(client, "/healthz") == (200, {"status": "ok"})
    assert await get_json(client, "/readyz") == (200, {"ready": True})
    runtime.accepting = False  # what a drain does first
    assert await get_json(client, "/readyz") == (503, {"ready": False})
    runtime.accepting = True


# --- policy switches ----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_put_policy_switches_the_policy(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    async with client.put("/v1/policy", json={"policy": "dp-time"}) as resp:
        assert resp.status == 200
        assert await resp.json() == {"policy": "dp-time"}
    assert (await get_json(client, "/v1/status"))[1]["policy"] == "dp-time"
    assert (await get_json(client, "/v1/models"))[1]["policy"] == "dp-time"
    assert runtime.engine.policy.name == "dp-time"
    status, answer = await infer(client, infer_doc(small_jpeg()))
    assert status == 200 and answer["status"] == "ok"
    # msgpack bodies work as well
    async with client.put("/v1/policy", data=packb({"policy": "edf"}), headers={
        "Content-Type": "application/msgpack"
    }) as resp:  # fmt: skip
        assert resp.status == 200
    assert runtime.engine.policy.name == "edf"


@pytest.mark.asyncio
async def test_put_policy_requires_the_admin_token(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime, ServerConfig(admin_token="s3cret"))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        async with client.put("/v1/policy", json={"policy": "edf"}, headers=headers) as resp:
            assert resp.status == 401, headers
            doc = await resp.json()
            assert doc["error"].startswith("Authorization:")
    assert (await get_json(client, "/v1/status"))[1]["policy"] == "dp-tardy"
    assert runtime.engine.policy.name == "dp-tardy"
    auth = {"Authorization": "Bearer s3cret"}
    async with client.put("/v1/policy", json={"policy": "fifo"}, headers=auth) as resp:
        assert resp.status == 400
        doc = await resp.json()
        assert doc["error"].startswith("policy:") and "dp-tardy" in doc["error"]
    async with client.put("/v1/policy", json={"policy": "nexus"}, headers=auth) as resp:
        assert resp.status == 200
    assert (await get_json(client, "/v1/status"))[1]["policy"] == "nexus"


# --- load -------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_200_concurrent_requests_are_all_served_in_batches(aiohttp_client: Any) -> None:
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    n = 200
    frames = [small_jpeg(i) for i in range(8)]
    # a session without the default limit of 100 connections: all 200 are in flight at once
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> tuple[int, Any]:
            body = packb(infer_doc(frames[i % 8], request_id=f"r{i}"))
            async with session.post(client.make_url("/v1/infer"), data=body, headers=MSGPACK) as r:
                return r.status, msgpack.unpackb(await r.read())

        with StageGate(runtime, CIFAR, 0) as gate:
            gate.close()  # the first arrival holds the executor until all 200 are queued
            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            await gate.held()
            await wait_for(lambda: len(runtime.pending) == n, "200 pending requests")
            gate.open()
            results = await asyncio.gather(*tasks)
            stage0_batches = list(gate.batches)
    assert [s for s, _ in results] == [200] * n
    assert sorted(a["request_id"] for _, a in results) == sorted(f"r{i}" for i in range(n))
    for _, answer in results:
        check_ok_answer(answer)
    # every request ran stage 0 exactly once, most of them in batches
    assert sum(stage0_batches) == n
    assert max(stage0_batches) > 1
    assert max(max(a["batch_sizes"]) for _, a in results) > 1
    async with client.get("/metrics") as resp:
        text = await resp.text()
    assert metric(text, "layerbatch_requests_total", app=CIFAR, status="ok") == n
    assert metric(text, "layerbatch_batch_size_sum", model=CIFAR, stage="0") == n
    assert metric(text, "layerbatch_batch_size_bucket", model=CIFAR, stage="0", le="1") < len(
        stage0_batches
    )
    assert runtime.executor.store.nbytes() == 0 and not runtime.pending


# --- plans: server == simulator ---------------------------------------------------------------
class RecordingPolicy:
    """Passes every plan call through to `inner` and keeps its exact inputs and output."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[Any, list[Request], float, Step | None, Plan]] = []

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        snapshot = state.requests()
        plan = self.inner.plan(state, now_ms)
        self.calls.append((state.deployment, snapshot, now_ms, state.running, plan))
        return plan


def sim_plan(
    deployment: Any,
    requests: list[Request],
    now_ms: float,
    policy: str,
    running: Step | None = None,
) -> Plan:
    """The plan the simulator's engine makes for the same requests at the same time, with the
    same step running."""
    engine = Engine(deployment, make_policy(policy))
    for r in requests:
        engine.add(r)
    engine.state.running = running
    engine.replan(now_ms)
    assert engine.plan is not None
    return engine.plan


@pytest.mark.parametrize(
    "policy", ["dp-tardy", "dp-time", "edf", "batch", "dynamic", "nexus", "nobatch"]
)
@pytest.mark.asyncio
async def test_server_plans_equal_simulator_plans(aiohttp_client: Any, policy: str) -> None:
    runtime = build([CIFAR, FACES], policy=policy)
    recorder = RecordingPolicy(runtime.engine.policy)
    runtime.engine.set_policy(recorder)
    client = await serve(aiohttp_client, runtime)
    face = jpeg(synthetic_rgb(240, 320, seed=2))
    rgb = synthetic_rgb(32, 32, seed=5)
    with StageGate(runtime, FACES, 0) as gate:
        gate.close()
        # deadlines short enough that nexus (which waits to fill a batch until the oldest
        # request's budget runs out) starts the first batch within two seconds, and long enough
        # that a stall of the test process drops none of the ten before all are queued (at
        # 150 ms the first once never reached the gate in a full run, and at 500-1000 ms one
        # of the ten was once dropped before the tenth came)
        first = infer_doc(face, app=FACES, request_id="f0", deadline_ms=2000.0)
        tasks = [asyncio.create_task(infer(client, first))]
        await gate.held()
        for i in range(6):
            tasks.append(
                asyncio.create_task(
                    infer(client, infer_doc(small_jpeg(i), request_id=f"c{i}", deadline_ms=2000.0 + 100 * i))
                )
            )  # fmt: skip
        for k in (3, 7):
            x = stage_input(runtime, CIFAR, rgb, k)
            tasks.append(
                asyncio.create_task(
                    infer(
                        client,
                        infer_doc(
                            features_payload(x, k, "raw"), request_id=f"k{k}", deadline_ms=2300.0
                        ),
                    )
                )
            )
        tasks.append(
            asyncio.create_task(
                infer(client, infer_doc(face, app=FACES, request_id="f1", deadline_ms=2000.0))
            )
        )
        await wait_for(lambda: len(runtime.pending) == 10, "10 queued requests")
        # a snapshot of the server's state while requests queue, planned by the server's own
        # policy object (with its memo tables) and by a fresh simulator engine
        now = runtime.clock()
        requests = runtime.engine.state.requests()
        assert {r.position for r in requests} == {0, 3, 7}
        running = runtime.engine.state.running
        assert running is not None and running.action.model == FACES  # held by the gate
        server_side = runtime.engine.policy.plan(runtime.engine.state, now)
        assert server_side == sim_plan(runtime.deployment, requests, now, policy, running)
        fresh = SchedulerState(runtime.deployment, requests)
        fresh.running = running
        assert server_side == make_policy(policy).plan(fresh, now)
        gate.open()
        results = await asyncio.gather(*tasks)
    assert all(s == 200 and a["status"] in ("ok", "dropped") for s, a in results), results
    # every plan the server made during the run, replayed in the simulator's engine
    assert len(recorder.calls) >= 10
    for deployment, requests, now_ms, running, plan in recorder.calls:
        assert plan.policy == policy
        assert sim_plan(deployment, requests, now_ms, policy, running) == plan


@pytest.mark.parametrize("policy", ["dp-tardy", "dp-time", "nobatch"])
def test_plan_of_an_unstarted_runtime_equals_the_simulators(policy: str) -> None:
    """Requests added straight to the engine of a runtime that is not running."""
    runtime = build([CIFAR, FACES], policy=policy)
    requests = [
        Request(f"r{i}", CIFAR if i % 3 else FACES, (i * 3) % 9 if i % 3 else 0, 10.0 * i,
                10.0 * i + 20.0 + 15 * (i % 4))
        for i in range(12)
    ]  # fmt: skip
    for r in requests:
        runtime.engine.add(r)
    now = 115.0
    runtime.engine.replan(now)
    assert runtime.engine.plan == sim_plan(runtime.deployment, requests, now, policy)
    assert runtime.engine.plan is not None and runtime.engine.plan.dropped  # some expired


# --- decoding ---------------------------------------------------------------------------------
def test_decode_threads_are_the_cores_torch_leaves_free() -> None:
    from server.runtime import spare_cores

    assert spare_cores(2, cores=2) == 0  # torch takes every core: decode between steps
    assert spare_cores(1, cores=2) == 1
    assert spare_cores(2, cores=16) == 2  # at most 2 by default
    assert spare_cores(4, cores=16, most=8) == 8
    assert spare_cores(8, cores=4) == 0


@pytest.mark.asyncio
async def test_decoding_on_the_executor_thread_serves_every_request(aiohttp_client: Any) -> None:
    """With no decode thread (torch on every core) inputs are decoded on the executor thread in
    turn with the steps: concurrent requests are all answered, a bad JPEG among them gets its
    422 and the others their results."""
    runtime = build([CIFAR], decode_threads=0)
    assert runtime.decode_threads == 0
    client = await serve(aiohttp_client, runtime)
    status, doc = await get_json(client, "/v1/status")
    assert doc["decode_threads"] == 0
    good = [
        asyncio.create_task(infer(client, infer_doc(small_jpeg(i), request_id=f"g{i}")))
        for i in range(12)
    ]
    bad = asyncio.create_task(infer(client, infer_doc(b"not a jpeg", request_id="bad")))
    results = await asyncio.gather(*good)
    for i, (status, answer) in enumerate(results):
        assert status == 200
        check_ok_answer(answer, f"g{i}")
    status, answer = await bad
    assert status == 422 and answer["error"].startswith("payload.jpeg:")
    assert not runtime.pending
    # each decode's time on the executor thread is measured: device time per request
    status, doc = await get_json(client, "/v1/status")
    assert doc["decode_ms"] is not None and doc["decode_ms"] > 0


@pytest.mark.asyncio
async def test_a_deadline_counts_from_receipt_not_from_the_end_of_a_decode_that_waited(
    aiohttp_client: Any,
) -> None:
    """A decode on the executor thread waits behind the running step; the request's deadline and
    times count from when the server received it, so a request whose deadline passed while it
    waited is judged late (dropped), not given its whole deadline again after the decode."""
    import threading

    runtime = build([CIFAR], decode_threads=0)
    client = await serve(aiohttp_client, runtime)
    held_ms = 300.0
    gate = threading.Event()
    runtime._exec_pool.submit(gate.wait)  # the executor thread busy (a long step, say)
    late = asyncio.create_task(infer(client, infer_doc(small_jpeg(0), deadline_ms=100.0)))
    roomy = asyncio.create_task(infer(client, infer_doc(small_jpeg(1), deadline_ms=5000.0)))
    await wait_for(lambda: len(runtime._decoding) == 2, "both requests to reach the decode queue")
    await asyncio.sleep(held_ms / 1000.0)
    gate.set()
    (s1, a1), (s2, a2) = await asyncio.gather(late, roomy)
    assert s1 == 200 and a1["status"] == "dropped" and a1["on_time"] is False, a1
    assert s2 == 200 and a2["status"] == "ok" and a2["on_time"] is True, a2
    assert a2["timing"]["total_ms"] >= held_ms and a2["timing"]["queue_ms"] >= held_ms


def test_a_steps_measured_time_excludes_what_queued_before_it_on_the_executor_thread() -> None:
    """Decodes queue on the executor thread before a step; the time the step is calibrated
    with starts when the step itself starts, so they do not inflate `time_scale`."""
    import threading
    import time as wall

    from scheduler.types import Action

    runtime = build([CIFAR], decode_threads=0)
    model = runtime.models[CIFAR]
    runtime.executor.admit("r", CIFAR, 0, torch.zeros(model.in_shapes[0]))
    gate = threading.Event()
    runtime._exec_pool.submit(gate.wait)  # what queued first (a decode, say)
    never = lambda: False  # noqa: E731  exit checks on, never firing
    step = runtime._exec_pool.submit(runtime._run_timed, Action(CIFAR, (0, 1), ("r",)), never)
    wall.sleep(0.05)
    released_ms = runtime.clock()
    gate.set()
    started, ended, progress = step.result(timeout=30)
    assert started >= released_ms and ended >= started
    assert progress.stages_done == 1


@pytest.mark.asyncio
async def test_each_step_starts_before_the_loop_settles_the_one_before(
    aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device does not wait for the loop's bookkeeping: of a request's steps, each after the
    first has started on the executor thread before the loop settles the step before it
    (answers, metrics, calibration, and the re-plan that follows)."""
    runtime = build()
    started: dict[tuple[int, int], float] = {}
    ended: dict[tuple[int, int], float] = {}
    settled: dict[tuple[int, int], float] = {}
    run_timed, settle = runtime._run_timed, runtime._settle

    def timed(action: Any, *args: Any) -> Any:
        out = run_timed(action, *args)
        started[action.stages], ended[action.stages] = out[0], out[1]
        return out

    def settling(progress: Any, *args: Any) -> None:
        settled[progress.action.stages] = runtime.clock()
        settle(progress, *args)

    monkeypatch.setattr(runtime, "_run_timed", timed)
    monkeypatch.setattr(runtime, "_settle", settling)
    client = await serve(aiohttp_client, runtime)
    status, answer, _ = await post(client, packb(infer_doc(small_jpeg())))
    assert status == 200
    check_ok_answer(answer)
    steps = sorted(started)
    assert len(steps) == CIFAR_GROUPS and sorted(settled) == steps
    for before, after in itertools.pairwise(steps):
        assert settled[before] >= started[after], (before, after)
    # the hand-offs between them are what /metrics and /v1/status report as the step gap
    gaps = [started[after] - ended[before] for before, after in itertools.pairwise(steps)]
    async with client.get("/metrics") as resp:
        text = await resp.text()
    assert metric(text, "layerbatch_step_gap_ms_count") == len(gaps)
    assert metric(text, "layerbatch_step_gap_ms_sum") == pytest.approx(sum(gaps), abs=1e-3)
    assert all(g >= 0 for g in gaps)
    # the executor thread's busy time is its steps' own times, and the one decode's
    steps_ms = sum(ended[k] - started[k] for k in steps)
    assert metric(text, "layerbatch_busy_ms_total", work="step") == pytest.approx(
        steps_ms, abs=1e-3
    )
    assert metric(text, "layerbatch_busy_ms_total", work="decode") == pytest.approx(
        runtime.decode_ms, abs=1e-3
    )
    # an EWMA of them, rounded to the microsecond in /v1/status
    assert min(gaps) - 5e-4 <= runtime.status()["step_gap_ms"] <= max(gaps) + 5e-4


def test_decode_time_on_the_executor_thread_is_planned_as_first_stage_work() -> None:
    """Calibration keeps the measured factor for stages and adds the measured decode time per
    sample to each model's first stage, so plans count the device time decodes take."""
    from server.runtime import CALIBRATION_EVERY

    runtime = build([CIFAR], decode_threads=0)
    runtime.calibrate = True
    base = runtime.base_profiles[CIFAR]
    runtime._observe_decode(2.0)
    runtime._observe_decode(2.0)
    stages_ms = [base.latency_ms(k, 1) for k in range(base.num_stages)]
    for _ in range(CALIBRATION_EVERY):
        runtime._calibrate(CIFAR, 0, stages_ms, sum(stages_ms))  # stages as profiled
    assert runtime.time_scale == pytest.approx(1.0)
    d = runtime.deployment
    for b in (1, 4):
        assert d.latency_ms(CIFAR, 0, b) == pytest.approx(base.latency_ms(0, b) + 2.0 * b)
        assert d.latency_ms(CIFAR, 1, b) == pytest.approx(base.latency_ms(1, b))
    assert runtime.engine.deployment is d


@pytest.mark.asyncio
async def test_decodes_beside_are_timed_but_not_planned_as_device_time(aiohttp_client: Any) -> None:
    """With a decode thread beside torch, decodes are still timed (`decode_ms`: a delay before a
    request reaches the scheduler) but the plans' first stages carry no decode work."""
    from server.runtime import CALIBRATION_EVERY

    runtime = build([CIFAR], decode_threads=1)
    client = await serve(aiohttp_client, runtime)
    status, answer = await infer(client, infer_doc(small_jpeg(0), request_id="a"))
    assert status == 200
    check_ok_answer(answer, "a")
    status, doc = await get_json(client, "/v1/status")
    assert doc["decode_ms"] is not None and doc["decode_ms"] > 0
    runtime.calibrate = True
    base = runtime.base_profiles[CIFAR]
    stages_ms = [base.latency_ms(k, 1) for k in range(base.num_stages)]
    for _ in range(CALIBRATION_EVERY):
        runtime._calibrate(CIFAR, 0, stages_ms, 1.5 * sum(stages_ms))
    for b in (1, 4):  # rescaled by the measured factor, no decode added
        assert runtime.deployment.latency_ms(CIFAR, 0, b) == pytest.approx(
            1.5 * base.latency_ms(0, b)
        )


def test_plans_carry_each_stages_own_measured_factor() -> None:
    """Steps of the first stage measured at twice its profile and of the rest as profiled: the
    plans' first stage doubles at every batch size, the rest stay, and /v1/status says so
    (`time_scale` the time-weighted mean)."""
    from server.runtime import CALIBRATION_EVERY

    runtime = build([CIFAR], decode_threads=0)
    runtime.calibrate = True
    base = runtime.base_profiles[CIFAR]
    n = base.num_stages
    first_ms, rest_ms = base.latency_ms(0, 2), [base.latency_ms(k, 2) for k in range(1, n)]
    runtime._calibrate(CIFAR, 0, [first_ms], 2.0 * first_ms)  # a new server uses its first step
    assert runtime.deployment.latency_ms(CIFAR, 0, 1) == pytest.approx(2.0 * base.latency_ms(0, 1))
    for _ in range(CALIBRATION_EVERY):
        runtime._calibrate(CIFAR, 0, [first_ms], 2.0 * first_ms)
        runtime._calibrate(CIFAR, 1, rest_ms, sum(rest_ms))
    d = runtime.deployment
    assert runtime.engine.deployment is d
    for b in (1, 4):
        assert d.latency_ms(CIFAR, 0, b) == pytest.approx(2.0 * base.latency_ms(0, b))
        for k in range(1, n):
            assert d.latency_ms(CIFAR, k, b) == pytest.approx(base.latency_ms(k, b))
    doc = runtime.status()
    assert doc["stage_scales"] == {CIFAR: [2.0] + [1.0] * (n - 1)}
    whole_ms = first_ms + sum(rest_ms)
    assert doc["time_scale"] == pytest.approx((whole_ms + first_ms) / whole_ms, abs=1e-3)


def test_a_model_shorter_than_the_group_floor_runs_in_one_group_through_rebases() -> None:
    """By default (`DEFAULT_MIN_GROUP_MS`) resnet20 (about 2 ms at batch 1 here) is one layer
    group, so a step runs it whole; a calibration rebase with slower stages keeps its groups."""
    from server.build import build_runtime
    from server.runtime import CALIBRATION_EVERY

    runtime = build_runtime([CIFAR], threads=1, decode_threads=1)
    try:
        assert runtime.deployment.group_bounds(CIFAR) == (0,)
        base = runtime.base_profiles[CIFAR]
        ms = [base.latency_ms(k, 1) for k in range(base.num_stages)]
        for _ in range(CALIBRATION_EVERY + 1):
            runtime._calibrate(CIFAR, 0, ms, 3.0 * sum(ms))
        assert runtime.deployment.latency_ms(CIFAR, 0, 1) == pytest.approx(3.0 * ms[0])
        assert runtime.deployment.group_bounds(CIFAR) == (0,)
    finally:
        runtime.torch_thread.close()


# --- a fault in the scheduler ------------------------------------------------------------------
class FaultyPolicy:
    """A policy with a bug: every plan raises."""

    name = "faulty"

    def plan(self, state: SchedulerState, now_ms: float) -> Plan:
        raise RuntimeError("a bug in the policy")


@pytest.mark.asyncio
async def test_a_scheduler_fault_answers_every_queued_request_and_refuses_new_ones(
    aiohttp_client: Any,
) -> None:
    """A plan that raises is a fault of the server's: the request running and the one whose
    arrival hit the fault are both answered with it (nobody waits for an answer that will never
    come), new requests get 503 saying why, and /readyz and /v1/status show it."""
    runtime = build([CIFAR])
    client = await serve(aiohttp_client, runtime)
    with StageGate(runtime, CIFAR, 0) as gate:
        gate.close()
        first = asyncio.create_task(infer(client, infer_doc(small_jpeg(0), request_id="first")))
        await gate.held()
        runtime.engine.policy = FaultyPolicy()
        second = asyncio.create_task(infer(client, infer_doc(small_jpeg(1), request_id="second")))
        await wait_for(lambda: runtime.failure is not None, "the fault to be noticed")
    for status, answer in await asyncio.gather(first, second):
        assert status == 500 and answer["status"] == "error", answer
        assert "a bug in the policy" in answer["reason"] and "restart it" in answer["reason"]
    status, answer = await infer(client, infer_doc(small_jpeg(2)))
    assert status == 503 and "a bug in the policy" in answer["error"], answer
    assert await get_json(client, "/readyz") == (503, {"ready": False})
    status, doc = await get_json(client, "/v1/status")
    assert "a bug in the policy" in doc["failure"] and doc["queued"] == 0


@pytest.mark.asyncio
async def test_a_request_decoding_when_the_runner_fails_is_refused_not_queued(
    aiohttp_client: Any,
) -> None:
    """A request already past admission, its decode waiting behind a step, when the runner
    fails: it is refused with the failure (503), not queued for a runner that is gone."""
    import threading

    runtime = build([CIFAR], decode_threads=0)
    client = await serve(aiohttp_client, runtime)
    gate = threading.Event()
    runtime._exec_pool.submit(gate.wait)  # the executor thread busy: the decode waits
    waiting = asyncio.create_task(infer(client, infer_doc(small_jpeg(0))))
    await wait_for(lambda: len(runtime._decoding) == 1, "the request to reach the decode queue")
    runtime._fail(RuntimeError("the runner broke"))
    gate.set()
    status, answer = await waiting
    assert status == 503 and "the runner broke" in answer["error"], answer
    assert not runtime.pending

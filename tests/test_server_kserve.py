"""The Open Inference Protocol (KServe v2) endpoints, driven by Triton's own `tritonclient.http`
against the server on a real loopback port (issue 4: "existing clients such as tritonclient talk
to layerbatch unchanged"). tritonclient is synchronous: it runs in a thread while the server runs
on the test's event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from layerexec.zoo import spec as model_spec
from server.app import make_app
from server.inputs import image_tensor, rgb_tensor
from server.runtime import Runtime
from tests.server_cases import (
    CIFAR,
    FACES,
    StageGate,
    build,
    infer,
    infer_doc,
    restore_process_globals,  # noqa: F401 (a fixture)
    shared_rgb,
    small_jpeg,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("restore_process_globals")]

T = TypeVar("T")
Triton = triton.InferenceServerClient


async def start(aiohttp_server: Any, runtime: Runtime) -> tuple[str, Any]:
    """The app on a real port (aiohttp's TestServer cancels handlers of departed clients)."""
    server = await aiohttp_server(make_app(runtime))
    return f"127.0.0.1:{server.port}", server


async def with_triton(url: str, work: Callable[[Triton], T]) -> T:
    """Run `work(client)` with a fresh synchronous tritonclient in a worker thread."""

    def go() -> T:
        client = Triton(url=url, network_timeout=60.0)
        try:
            return work(client)
        finally:
            client.close()

    return await asyncio.to_thread(go)


def input_of(x: np.ndarray, binary: bool = False, name: str = "INPUT") -> triton.InferInput:
    inp = triton.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def output(name: str = "OUTPUT") -> triton.InferRequestedOutput:
    return triton.InferRequestedOutput(name, binary_data=False)


def refusal(work: Callable[[], Any]) -> InferenceServerException:
    """The exception tritonclient raises for a refused request."""
    with pytest.raises(InferenceServerException) as info:
        work()
    return info.value


def cifar_batch(seeds: tuple[int, ...]) -> tuple[list[bytes], np.ndarray]:
    """JPEGs and the normalised [N, 3, 32, 32] tensor the server makes of them."""
    frames = [small_jpeg(s) for s in seeds]
    x = torch.stack([image_tensor(f, model_spec(CIFAR)) for f in frames]).numpy()
    return frames, np.ascontiguousarray(x, dtype=np.float32)


# --- health and metadata ------------------------------------------------------------------------
async def test_health_and_model_metadata(aiohttp_server: Any) -> None:
    runtime = build([CIFAR, FACES])
    url, _ = await start(aiohttp_server, runtime)

    def work(c: Triton) -> dict[str, Any]:
        return {
            "live": c.is_server_live(),
            "ready": c.is_server_ready(),
            "cifar_ready": c.is_model_ready(CIFAR),
            "faces_ready": c.is_model_ready(FACES),
            "unknown_ready": c.is_model_ready("nope"),
            "server": c.get_server_metadata(),
            "cifar": c.get_model_metadata(CIFAR),
            "faces": c.get_model_metadata(FACES),
        }

    got = await with_triton(url, work)
    assert got["live"] is True and got["ready"] is True
    assert got["cifar_ready"] is True and got["faces_ready"] is True
    assert got["unknown_ready"] is False
    assert got["server"]["name"] == "layerbatch"
    meta = got["cifar"]
    assert meta["name"] == CIFAR and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert meta["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 10]}]
    spec = runtime.first_spec(CIFAR)
    assert meta["parameters"]["pixel_mean"] == pytest.approx(list(spec.pixel_mean))
    assert meta["parameters"]["pixel_std"] == pytest.approx(list(spec.pixel_std))
    faces = got["faces"]
    assert faces["inputs"][0]["shape"] == [-1, 3, 240, 320]
    assert faces["outputs"] == [{"name": "DETECTIONS", "datatype": "BYTES", "shape": [-1]}]


async def test_not_ready_while_draining(aiohttp_server: Any) -> None:
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    runtime.accepting = False  # what SIGTERM's drain does first
    try:
        live, ready = await with_triton(url, lambda c: (c.is_server_live(), c.is_server_ready()))
    finally:
        runtime.accepting = True
    assert (live, ready) == (True, False)


# --- inference ------------------------------------------------------------------------------------
async def test_infer_matches_the_v1_api(aiohttp_server: Any, aiohttp_client: Any) -> None:
    runtime = build()
    url, server = await start(aiohttp_server, runtime)
    frames, x = cifar_batch((0, 5))

    def work(c: Triton) -> Any:
        return c.infer(
            CIFAR,
            [input_of(x)],
            outputs=[output()],
            request_id="kserve-1",
            parameters={"deadline_ms": 30_000},
        )

    result = await with_triton(url, work)
    logits = result.as_numpy("OUTPUT")
    assert logits.shape == (2, 10) and logits.dtype == np.float32
    response = result.get_response()
    assert response["model_name"] == CIFAR and response["id"] == "kserve-1"
    # the same frames through /v1/infer: the same classes and scores
    client = await aiohttp_client(server)
    for i, frame in enumerate(frames):
        status, answer = await infer(client, infer_doc(frame))
        assert status == 200 and answer["status"] == "ok"
        best = answer["result"]["top5"][0]
        assert int(np.argmax(logits[i])) == best["class"]
        probs = torch.softmax(torch.from_numpy(logits[i]), 0)
        assert float(probs[best["class"]]) == pytest.approx(best["score"], abs=1e-3)
    # each sample is a request of its own to the scheduler; all were answered
    counted = runtime.status()["counters"]["answered"]
    assert counted == {f"{CIFAR}/ok": 4}
    assert runtime.executor.store.nbytes() == 0


async def test_infer_accepts_one_sample_without_batch_dimension(aiohttp_server: Any) -> None:
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((3,))
    result = await with_triton(url, lambda c: c.infer(CIFAR, [input_of(x[0])], outputs=[output()]))
    logits = result.as_numpy("OUTPUT")
    assert logits.shape == (1, 10)


async def test_detector_answers_json_boxes(aiohttp_server: Any) -> None:
    rgb = shared_rgb("skimage_astronaut.png")
    runtime = build([FACES])
    url, _ = await start(aiohttp_server, runtime)
    x = rgb_tensor(rgb, runtime.first_spec(FACES)).unsqueeze(0).numpy()
    result = await with_triton(
        url, lambda c: c.infer(FACES, [input_of(x)], outputs=[output("DETECTIONS")])
    )
    texts = result.as_numpy("DETECTIONS")
    assert texts.shape == (1,)
    raw = texts[0]
    found = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    assert len(found["boxes"]) == 1 and found["boxes"][0]["score"] > 0.9


# --- deadlines ----------------------------------------------------------------------------------
async def test_deadline_parameter_is_honoured(aiohttp_server: Any, aiohttp_client: Any) -> None:
    runtime = build()
    url, server = await start(aiohttp_server, runtime)
    _, x = cifar_batch((1, 2))
    # a deadline no plan can meet: dp-tardy drops both samples at once
    exc = await with_triton(
        url,
        lambda c: refusal(
            lambda: c.infer(CIFAR, [input_of(x)], outputs=[output()], parameters={"deadline_ms": 1})
        ),
    )
    assert exc.status() == "503"
    assert "2 of 2 samples were not served" in exc.message()
    # a deadline that passes while the samples wait behind held work: dropped at the deadline
    client = await aiohttp_client(server)
    with StageGate(runtime, CIFAR, 1) as gate:
        gate.close()
        held = asyncio.create_task(infer(client, infer_doc(small_jpeg(), request_id="held")))
        await gate.held()
        exc = await with_triton(
            url,
            lambda c: refusal(
                lambda: c.infer(
                    CIFAR, [input_of(x)], outputs=[output()], parameters={"deadline_ms": 250}
                )
            ),
        )
        assert gate.closed  # answered while the executor was still held
        gate.open()
        status, answer = await held
    assert exc.status() == "503" and "not served" in exc.message()
    assert status == 200 and answer["status"] == "ok"
    # a generous one is served
    result = await with_triton(
        url,
        lambda c: c.infer(
            CIFAR, [input_of(x)], outputs=[output()], parameters={"deadline_ms": 20_000}
        ),
    )
    assert result.as_numpy("OUTPUT").shape == (2, 10)
    assert runtime.pending == {} and runtime.executor.store.nbytes() == 0


# --- refusals -------------------------------------------------------------------------------------
async def test_refusals_have_the_right_status(aiohttp_server: Any) -> None:
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((0, 1))
    small = np.zeros((2, 3, 16, 16), dtype=np.float32)

    def work(c: Triton) -> dict[str, InferenceServerException]:
        return {
            "shape": refusal(lambda: c.infer(CIFAR, [input_of(small)], outputs=[output()])),
            "flat": refusal(lambda: c.infer(CIFAR, [input_of(x.reshape(2, -1))])),
            "model": refusal(lambda: c.infer("nope", [input_of(x)], outputs=[output()])),
            "metadata": refusal(lambda: c.get_model_metadata("nope")),
            "deadline": refusal(
                lambda: c.infer(CIFAR, [input_of(x)], parameters={"deadline_ms": -1})
            ),
            "nan": refusal(
                lambda: c.infer(CIFAR, [input_of(np.full_like(x, np.nan))], outputs=[output()])
            ),
        }

    got = await with_triton(url, work)
    assert {k: e.status() for k, e in got.items()} == {
        "shape": "422",
        "flat": "422",
        "model": "404",
        "metadata": "404",
        "deadline": "422",
        "nan": "422",
    }
    # a GET has no body: its refusal is JSON and tritonclient shows the sentence
    assert got["metadata"].message() == f"model: unknown model 'nope'; served models: {CIFAR}"
    # none of them reached the scheduler, and the server still serves
    assert runtime.status()["counters"]["answered"] == {}
    result = await with_triton(url, lambda c: c.infer(CIFAR, [input_of(x)]))
    assert result.as_numpy("OUTPUT").shape == (2, 10)


async def test_refusals_are_json_for_json_requests(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    """The same refusals over plain HTTP with a JSON Content-Type: one JSON sentence each."""
    runtime = build()
    _, server = await start(aiohttp_server, runtime)
    client = await aiohttp_client(server)
    ok_input = {"name": "INPUT", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}
    cases = [
        (f"/v2/models/{CIFAR}/infer", {"inputs": [ok_input]}, {"Inference-Header-Content-Length": "99999999"}, 400,
         "Inference-Header-Content-Length: expected the JSON header's length in bytes"),
        (f"/v2/models/{CIFAR}/infer", {"inputs": [ok_input], "outputs": [{"name": "LOGITS"}]}, {}, 400,
         "outputs[0].name: expected 'OUTPUT', got 'LOGITS'"),
        (f"/v2/models/{CIFAR}/versions/2/infer", {"inputs": [ok_input]}, {}, 404,
         f"model '{CIFAR}': unknown version '2'"),
        (f"/v2/models/{CIFAR}/infer", {"inputs": [{**ok_input, "shape": [1, 3, 16, 16]}]}, {}, 422,
         "inputs[0].shape: expected [N, 3, 32, 32], got [1, 3, 16, 16]"),
        (f"/v2/models/{CIFAR}/infer", {"inputs": [{**ok_input, "data": [0.0] * 10}]}, {}, 400,
         "inputs[0].data: expected 3072 numbers"),
        (f"/v2/models/{CIFAR}/infer", {"inputs": [{**ok_input, "datatype": "INT8"}]}, {}, 400,
         "inputs[0].datatype: expected FP32"),
        (f"/v2/models/{CIFAR}/infer", {"inputs": []}, {}, 400, "inputs: expected a list"),
        ("/v2/models/nope/infer", {"inputs": [ok_input]}, {}, 404, "model: unknown model 'nope'"),
    ]  # fmt: skip
    for path, doc, headers, status, message in cases:
        async with client.post(
            path, data=json.dumps(doc), headers={"Content-Type": "application/json", **headers}
        ) as resp:
            assert resp.status == status, (path, await resp.text())
            assert resp.content_type == "application/json"
            body = await resp.json()
            assert message in body["error"], body
    async with client.post(
        f"/v2/models/{CIFAR}/infer", data=b"{nope", headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 400 and (await resp.json())["error"].startswith("body:")
    assert runtime.status()["counters"]["answered"] == {}


@pytest.mark.parametrize("case", ["output", "shape", "model"])
async def test_refusal_messages_are_readable_by_tritonclient(
    aiohttp_server: Any, case: str
) -> None:
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((0, 1))

    def work(c: Triton) -> InferenceServerException:
        if case == "output":
            named = [triton.InferRequestedOutput("LOGITS")]
            return refusal(lambda: c.infer(CIFAR, [input_of(x, binary=True)], outputs=named))
        if case == "shape":
            small = np.zeros((2, 3, 16, 16), dtype=np.float32)
            return refusal(lambda: c.infer(CIFAR, [input_of(small)]))
        return refusal(lambda: c.infer("nope", [input_of(x)]))

    exc = await with_triton(url, work)
    expected = {
        "output": "outputs[0].name: expected 'OUTPUT', got 'LOGITS'",
        "shape": "inputs[0].shape: expected [N, 3, 32, 32], got [2, 3, 16, 16]",
        "model": f"model: unknown model 'nope'; served models: {CIFAR}",
    }[case]
    assert exc.message() == expected

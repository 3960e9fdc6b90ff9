"""KServe v2 binary tensor data (Triton's `binary_tensor_data` extension, tritonclient's default)
and versioned model paths, driven by `tritonclient.http` and by raw HTTP on a real port."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import deserialize_bytes_tensor

from server.inputs import rgb_tensor
from server.kserve_tensors import Output
from tests.server_cases import (
    CIFAR,
    FACES,
    build,
    restore_process_globals,  # noqa: F401 (a fixture)
    shared_rgb,
)
from tests.test_server_kserve import Triton, cifar_batch, input_of, output, start, with_triton

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("restore_process_globals")]

HEADER = "Inference-Header-Content-Length"


def binary_body(doc: dict[str, Any], blob: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(doc).encode()
    return header + blob, {HEADER: str(len(header)), "Content-Type": "application/octet-stream"}


async def test_binary_tensors_carry_the_same_numbers_as_json(aiohttp_server: Any) -> None:
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((0, 5, 7))

    def work(c: Triton) -> dict[str, Any]:
        deadline = {"deadline_ms": 30_000}
        binary_out = [triton.InferRequestedOutput("OUTPUT", binary_data=True)]
        return {
            "json": c.infer(CIFAR, [input_of(x)], outputs=[output()], parameters=deadline),
            "binary in": c.infer(
                CIFAR, [input_of(x, binary=True)], outputs=[output()], parameters=deadline
            ),
            "binary both": c.infer(
                CIFAR, [input_of(x, binary=True)], outputs=binary_out, parameters=deadline
            ),
            # tritonclient's defaults: binary inputs, and every output as binary data
            "defaults": c.infer(CIFAR, [input_of(x, binary=True)], parameters=deadline),
            # compressed as tritonclient offers (aiohttp inflates the body before the handler)
            "gzip": c.infer(
                CIFAR,
                [input_of(x, binary=True)],
                parameters=deadline,
                request_compression_algorithm="gzip",
            ),
            "server": c.get_server_metadata(),
        }

    got = await with_triton(url, work)
    reference = got["json"].as_numpy("OUTPUT")
    assert reference.shape == (3, 10)
    # the same numbers in, the same logits out (to float32 rounding: the batches the samples
    # joined may differ, and a batch's size changes the kernels' order of additions)
    for name in ("binary in", "binary both", "defaults", "gzip"):
        got_logits = got[name].as_numpy("OUTPUT")
        np.testing.assert_allclose(got_logits, reference, rtol=1e-4, atol=1e-4, err_msg=name)
    # JSON outputs hold data; binary ones say their size instead
    assert "data" in got["binary in"].get_output("OUTPUT")
    for name in ("binary both", "defaults"):
        entry = got[name].get_output("OUTPUT")
        assert "data" not in entry and entry["parameters"] == {"binary_data_size": 3 * 10 * 4}
    assert "binary_tensor_data" in got["server"]["extensions"]
    assert runtime.status()["counters"]["answered"] == {f"{CIFAR}/ok": 15}


async def test_binary_reply_over_raw_http(aiohttp_server: Any, aiohttp_client: Any) -> None:
    """The reply's framing as any client sees it: the JSON header's length, then the floats."""
    runtime = build()
    _, server = await start(aiohttp_server, runtime)
    client = await aiohttp_client(server)
    _, x = cifar_batch((2,))
    doc: dict[str, Any] = {
        "id": "raw-1",
        "inputs": [
            {
                "name": "INPUT",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True, "deadline_ms": 30_000},
    }
    body, headers = binary_body(doc, x.astype("<f4").tobytes())
    async with client.post(f"/v2/models/{CIFAR}/infer", data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/octet-stream"
        raw = await resp.read()
        length = int(resp.headers[HEADER])
    reply = json.loads(raw[:length])
    assert reply["id"] == "raw-1" and reply["outputs"][0]["shape"] == [1, 10]
    logits = np.frombuffer(raw[length:], dtype="<f4")
    assert logits.shape == (10,) and np.isfinite(logits).all()
    # the same input as JSON numbers, the same answer
    doc["inputs"][0] = {"name": "INPUT", "datatype": "FP32", "shape": [1, 3, 32, 32]}
    doc["inputs"][0]["data"] = x.flatten().tolist()
    doc["parameters"] = {"deadline_ms": 30_000}
    async with client.post(f"/v2/models/{CIFAR}/infer", json=doc) as resp:
        assert resp.status == 200 and resp.content_type == "application/json"
        again = (await resp.json())["outputs"][0]["data"]
    np.testing.assert_allclose(np.asarray(again, dtype=np.float32), logits, rtol=1e-4, atol=1e-4)


async def test_detector_strings_as_binary_data(aiohttp_server: Any) -> None:
    runtime = build([FACES])
    url, _ = await start(aiohttp_server, runtime)
    rgb = shared_rgb("skimage_astronaut.png")
    x = rgb_tensor(rgb, runtime.first_spec(FACES)).unsqueeze(0).numpy()

    def work(c: Triton) -> tuple[Any, Any]:
        as_json = c.infer(FACES, [input_of(x)], outputs=[output("DETECTIONS")])
        as_binary = c.infer(FACES, [input_of(x, binary=True)])
        return as_json.as_numpy("DETECTIONS"), as_binary.as_numpy("DETECTIONS")

    texts, blobs = await with_triton(url, work)
    assert blobs.shape == (1,) and isinstance(blobs[0], bytes)
    found = json.loads(blobs[0])
    assert len(found["boxes"]) == 1 and found["boxes"][0]["score"] > 0.9
    first = texts[0].decode() if isinstance(texts[0], bytes) else texts[0]
    assert json.loads(first) == found


async def test_versioned_paths(aiohttp_server: Any) -> None:
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((1,))

    def work(c: Triton) -> dict[str, Any]:
        try:
            c.infer(CIFAR, [input_of(x)], model_version="2")
        except triton.InferenceServerException as exc:
            refused: Any = (exc.status(), exc.message())
        return {
            "ready 1": c.is_model_ready(CIFAR, model_version="1"),
            "ready 2": c.is_model_ready(CIFAR, model_version="2"),
            "metadata": c.get_model_metadata(CIFAR, model_version="1"),
            "infer": c.infer(CIFAR, [input_of(x, binary=True)], model_version="1"),
            "refused": refused,
        }

    got = await with_triton(url, work)
    assert got["ready 1"] is True and got["ready 2"] is False
    assert got["metadata"]["name"] == CIFAR
    assert got["infer"].as_numpy("OUTPUT").shape == (1, 10)
    assert got["refused"] == ("404", f"model '{CIFAR}': unknown version '2'; it has version '1'")


def _input(x: np.ndarray, **params: Any) -> dict[str, Any]:
    return {"name": "INPUT", "datatype": "FP32", "shape": list(x.shape), "parameters": params}


async def test_binary_refusals(aiohttp_server: Any, aiohttp_client: Any) -> None:
    runtime = build()
    _, server = await start(aiohttp_server, runtime)
    client = await aiohttp_client(server)
    _, x = cifar_batch((0, 1))
    blob = x.astype("<f4").tobytes()
    size = len(blob)
    cases = [
        ({"inputs": [_input(x, binary_data_size=size - 4)]}, blob,
         f"inputs[0].parameters.binary_data_size: expected {size} (FP32 [2, 3, 32, 32]), got {size - 4}"),
        ({"inputs": [_input(x, binary_data_size=size)]}, blob[:-8],
         f"body: expected {size} bytes of binary data after the JSON header, got {size - 8}"),
        ({"inputs": [{**_input(x, binary_data_size=size), "data": [0.0]}]}, blob,
         "inputs[0]: expected either data or parameters.binary_data_size, not both"),
        ({"inputs": [{**_input(x), "data": x.flatten().tolist()}]}, b"\0" * 8,
         "body: 8 bytes of binary data follow the JSON header, but no input declares "
         "parameters.binary_data_size"),
        ({"inputs": [_input(x, binary_data_size=size)],
          "outputs": [{"name": "OUTPUT", "parameters": {"classification": 3}}]}, blob,
         "outputs[0].parameters.classification: not supported"),
        ({"inputs": [_input(x, binary_data_size=size)], "outputs": []}, blob,
         "outputs: expected a list naming 'OUTPUT', or no outputs"),
    ]  # fmt: skip
    for doc, tail, message in cases:
        body, headers = binary_body(doc, tail)
        async with client.post(f"/v2/models/{CIFAR}/infer", data=body, headers=headers) as resp:
            assert resp.status == 400, (message, await resp.text())
            assert resp.content_type == "application/json"
            assert (await resp.json())["error"].startswith(message)
    nan = np.full_like(x, np.nan).astype("<f4").tobytes()
    body, headers = binary_body({"inputs": [_input(x, binary_data_size=size)]}, nan)
    async with client.post(f"/v2/models/{CIFAR}/infer", data=body, headers=headers) as resp:
        assert resp.status == 422 and "finite numbers" in (await resp.json())["error"]
    # none reached the scheduler, and a good binary request is still served
    assert runtime.status()["counters"]["answered"] == {}
    body, headers = binary_body({"inputs": [_input(x, binary_data_size=size)]}, blob)
    async with client.post(f"/v2/models/{CIFAR}/infer", data=body, headers=headers) as resp:
        assert resp.status == 200
        assert (await resp.json())["outputs"][0]["shape"] == [2, 10]


async def test_bytes_framing_is_tritons() -> None:
    """BYTES elements as tritonclient reads them: a 4-byte little-endian length, then the bytes."""
    texts = ['{"boxes": []}', "é", ""]
    entry, blob = Output("DETECTIONS", "BYTES", [3], texts).encode(binary=True)
    assert entry["parameters"] == {"binary_data_size": len(blob)}
    assert blob[:4] == struct.pack("<I", len(texts[0]))
    assert [b.decode() for b in deserialize_bytes_tensor(blob)] == texts

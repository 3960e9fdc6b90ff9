"""KServe v2 binary tensor data (Triton's `binary_tensor_data` extension, tritonclient's default),
Triton's classification and model configuration extensions, and versioned model paths, driven
by `tritonclient.http` and by raw HTTP on a real port."""

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
          "outputs": [{"name": "OUTPUT", "parameters": {"classification": -1}}]}, blob,
         "outputs[0].parameters.classification: expected a number of classes (0 for the tensor "
         "itself), got -1"),
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


async def test_classification_ranks_the_logits(aiohttp_server: Any) -> None:
    """Triton's classification extension, as its image_client example asks for it: each
    sample's best classes as "value:index:label", best first."""
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((0, 5))
    labels = runtime.first_spec(CIFAR).labels
    assert len(labels) == 10

    def work(c: Triton) -> dict[str, Any]:
        deadline = {"deadline_ms": 30_000}

        def ranked(binary: bool, k: int) -> Any:
            asked = [triton.InferRequestedOutput("OUTPUT", binary_data=binary, class_count=k)]
            return c.infer(
                CIFAR, [input_of(x, binary=True)], outputs=asked, parameters=deadline
            ).as_numpy("OUTPUT")

        return {
            "logits": c.infer(CIFAR, [input_of(x)], parameters=deadline).as_numpy("OUTPUT"),
            "top3 binary": ranked(True, 3),
            "top3 json": ranked(False, 3),
            "all of 99": ranked(True, 99),
        }

    got = await with_triton(url, work)
    logits = got["logits"]
    for name, k in (("top3 binary", 3), ("top3 json", 3), ("all of 99", 10)):
        ranked = got[name]
        assert ranked.shape == (2, k), name
        for n in range(2):
            rows = [(t.decode() if isinstance(t, bytes) else t).split(":") for t in ranked[n]]
            indices = [int(r[1]) for r in rows]
            assert indices == list(np.argsort(-logits[n], kind="stable")[:k]), name
            assert [r[2] for r in rows] == [labels[i] for i in indices]
            values = [float(r[0]) for r in rows]
            assert values == sorted(values, reverse=True)
            np.testing.assert_allclose(values, logits[n][indices], atol=1e-4)


async def test_classification_of_a_detector_is_refused(aiohttp_server: Any) -> None:
    runtime = build([FACES])
    url, _ = await start(aiohttp_server, runtime)
    x = np.zeros((1, *runtime.first_spec(FACES).input_shape), dtype=np.float32)

    def work(c: Triton) -> Any:
        asked = [triton.InferRequestedOutput("DETECTIONS", class_count=2)]
        try:
            c.infer(FACES, [input_of(x, binary=True)], outputs=asked)
        except triton.InferenceServerException as exc:
            return exc.status(), exc.message()
        return None

    assert await with_triton(url, work) == (
        "400",
        f"outputs[0].parameters.classification: expected 0, as {FACES!r} is not a classifier "
        "(face-detector): its output has no classes to rank",
    )
    assert runtime.status()["counters"]["answered"] == {}


async def test_model_configuration(aiohttp_server: Any) -> None:
    """Triton's model configuration as `get_model_config` reads it, consistent with the
    metadata: the batch a request may carry, the input's layout and dims, the output's."""
    runtime = build([CIFAR, FACES])
    url, _ = await start(aiohttp_server, runtime)

    def work(c: Triton) -> dict[str, Any]:
        return {
            "cifar": c.get_model_config(CIFAR),
            "cifar v1": c.get_model_config(CIFAR, model_version="1"),
            "faces": c.get_model_config(FACES),
            "server": c.get_server_metadata(),
        }

    got = await with_triton(url, work)
    assert got["cifar"] == got["cifar v1"]
    assert got["cifar"] == {
        "name": CIFAR,
        "platform": "layerbatch",
        "max_batch_size": runtime.max_queued,
        "input": [
            {
                "name": "INPUT",
                "data_type": "TYPE_FP32",
                "format": "FORMAT_NCHW",
                "dims": [3, 32, 32],
            }
        ],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [10]}],
    }
    faces = got["faces"]
    assert faces["input"][0]["dims"] == [3, 240, 320]
    assert faces["output"] == [
        {"name": "DETECTIONS", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}
    ]
    assert {"classification", "model_configuration"} <= set(got["server"]["extensions"])


async def test_the_requests_tritons_image_client_makes(aiohttp_server: Any) -> None:
    """What Triton's image_client example asks of a classifier over HTTP, and how it reads the
    answers: metadata and configuration agreeing on one batched NCHW FP32 input and one FP32
    vector output, then its best classes, read as "value:index:label" from raw bytes."""
    runtime = build()
    url, _ = await start(aiohttp_server, runtime)
    _, x = cifar_batch((4, 6))

    def work(c: Triton) -> tuple[dict[str, Any], dict[str, Any], Any]:
        meta, config = c.get_model_metadata(CIFAR, ""), c.get_model_config(CIFAR, "")
        asked = [triton.InferRequestedOutput(meta["outputs"][0]["name"], class_count=2)]
        sent = triton.InferInput(meta["inputs"][0]["name"], list(x.shape), "FP32")
        sent.set_data_from_numpy(x)  # binary, the default
        return meta, config, c.infer(CIFAR, [sent], outputs=asked).as_numpy("OUTPUT")

    meta, config, answers = await with_triton(url, work)
    assert len(meta["inputs"]) == len(meta["outputs"]) == len(config["input"]) == 1
    assert config["max_batch_size"] > 0 and len(meta["inputs"][0]["shape"]) == 3 + 1
    assert config["input"][0]["format"] == "FORMAT_NCHW"
    assert meta["outputs"][0]["datatype"] == "FP32"
    assert sum(d > 1 for d in meta["outputs"][0]["shape"][1:]) == 1  # a vector a sample
    assert answers.dtype.type == np.object_ and answers.shape == (2, 2)
    for row in answers:
        for result in row:
            score, index, label = "".join(chr(b) for b in result).split(":")
            assert runtime.first_spec(CIFAR).labels[int(index)] == label
            assert np.isfinite(float(score))

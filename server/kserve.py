"""The Open Inference Protocol (KServe v2) over HTTP, so that clients written for Triton's HTTP
API (`tritonclient.http` with its defaults, the HTTP requests of Triton's image_client example)
talk to layerbatch unchanged. Beside the protocol's core it serves three of Triton's extensions (`EXTENSIONS`):
tensors as binary data (`server.kserve_tensors`), classification (a classifier's best classes
as "value:index:label") and the model configuration (`GET .../config`); not statistics, the
model repository or shared memory.

An app is a v2 model. Its input is one FP32 tensor of shape [N, C, H, W] (the app's input,
already normalised as `GET /v2/models/{app}` says) or [C, H, W]; each of the N samples is a
request of its own to the scheduler, so they batch with everyone else's at every stage. The
request parameter `deadline_ms` sets their deadline. A classifier or segmenter answers its output
tensor (FP32 [N, ...]); a detector answers one JSON string per sample (BYTES [N]).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np
import torch
from aiohttp import web

from layerexec.zoo import ModelSpec
from scheduler.validate import is_number
from server.body import read_body
from server.config import RUNTIME, Served
from server.errors import BadRequest
from server.kserve_tensors import (
    HEADER_LENGTH,
    Output,
    input_tensor,
    requested,
    split_body,
    top_classes,
)
from server.results import describe
from server.wire import JSON, MAX_DEADLINE_MS, MAX_ITEMS, InferRequest, decode_body, finite

# Triton's extensions served beside the protocol's core
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration"]


def add_kserve_routes(
    app: web.Application,
    expect_handler: Callable[[web.Request], Awaitable[web.StreamResponse | None]],
) -> None:
    """The v2 routes; `expect_handler` answers a POST's `Expect` header (the v1 API's)."""
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    for model in ("/v2/models/{app}", "/v2/models/{app}/versions/{version}"):
        app.router.add_get(model, model_metadata)
        app.router.add_get(f"{model}/config", model_config)
        app.router.add_get(f"{model}/ready", model_ready)
        app.router.add_post(f"{model}/infer", model_infer, expect_handler=expect_handler)


def _runtime(request: web.Request) -> Served:
    return request.app[RUNTIME]


def _app(request: web.Request) -> str:
    """The app the path names (each has one version, "1"); BadRequest(404) for another."""
    name = request.match_info["app"]
    lengths = _runtime(request).app_lengths()
    if name not in lengths:
        raise BadRequest(
            404, f"model: unknown model {name!r}; served models: {', '.join(sorted(lengths))}"
        )
    version = request.match_info.get("version", "1")
    if version != "1":
        raise BadRequest(404, f"model {name!r}: unknown version {version!r}; it has version '1'")
    return name


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "layerbatch", "version": "0.1.0", "extensions": EXTENSIONS})


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = _runtime(request).accepting
    return web.json_response({"ready": ok}, status=200 if ok else 503)


async def model_ready(request: web.Request) -> web.Response:
    _app(request)
    return web.json_response({"ready": True})


def _output(rt: Served, name: str) -> tuple[str, str, list[int]]:
    """The app's one output: its name, datatype and shape per sample. A classifier or segmenter
    answers its FP32 tensor, a detector one JSON string a sample."""
    first = rt.first_spec(name)
    last = rt.models[rt.deployment.apps[name].models[-1]].spec
    if last.kind == "classifier":
        return "OUTPUT", "FP32", [len(last.labels)]
    if last.kind == "segmenter":
        return "OUTPUT", "FP32", [len(last.labels), *first.input_shape[1:]]
    return "DETECTIONS", "BYTES", []


async def model_metadata(request: web.Request) -> web.Response:
    name = _app(request)
    rt = _runtime(request)
    first = rt.first_spec(name)
    out, datatype, dims = _output(rt, name)
    return web.json_response(
        {
            "name": name,
            "versions": ["1"],
            "platform": "layerbatch",
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, *first.input_shape]}],
            "outputs": [{"name": out, "datatype": datatype, "shape": [-1, *dims]}],
            "parameters": {
                "pixel_mean": list(first.pixel_mean),
                "pixel_std": list(first.pixel_std),
            },
        }
    )


async def model_config(request: web.Request) -> web.Response:
    """Triton's model configuration, as its clients read it (`get_model_config`): a batch of up
    to the queue's room, NCHW FP32 images in, the output as `/v2/models/{app}` says."""
    name = _app(request)
    rt = _runtime(request)
    out, datatype, dims = _output(rt, name)
    output: dict[str, Any] = {
        "name": out,
        "data_type": "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}",
        "dims": dims or [1],
    }
    if not dims:  # one string a sample: dims [1] reshaped to a scalar, as Triton writes it
        output["reshape"] = {"shape": []}
    return web.json_response(
        {
            "name": name,
            "platform": "layerbatch",
            "max_batch_size": rt.max_queued,
            "input": [
                {
                    "name": "INPUT",
                    "data_type": "TYPE_FP32",
                    "format": "FORMAT_NCHW",
                    "dims": list(rt.first_spec(name).input_shape),
                }
            ],
            "output": [output],
        }
    )


async def model_infer(request: web.Request) -> web.Response:
    name = _app(request)
    rt = _runtime(request)
    spec = rt.first_spec(name)
    header, binary = split_body(await read_body(request), request.headers.get(HEADER_LENGTH))
    # a batch the queue has room for, as numbers, and the document around them
    numbers = rt.max_queued * math.prod(spec.input_shape)
    doc = decode_body(header, JSON, max_json_values=numbers + MAX_ITEMS)
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("inputs"), list)
        or len(doc["inputs"]) != 1
    ):
        raise BadRequest(400, "inputs: expected a list with exactly one input tensor")
    last = rt.models[rt.deployment.apps[name].models[-1]].spec
    output_name = _output(rt, name)[0]
    asked = requested(doc, output_name)
    if asked.classes and last.kind != "classifier":
        raise BadRequest(
            400,
            f"outputs[0].parameters.classification: expected 0, as {name!r} is not a "
            f"classifier ({last.kind}): its output has no classes to rank",
        )
    x = input_tensor(doc["inputs"][0], binary, spec.input_shape, rt.max_queued)
    params = doc.get("parameters") or {}
    deadline = params.get("deadline_ms", 1000.0) if isinstance(params, dict) else None
    if not (is_number(deadline) and finite(deadline) and 0 < deadline <= MAX_DEADLINE_MS):
        raise BadRequest(
            422, f"parameters.deadline_ms: expected a number in (0, {MAX_DEADLINE_MS:g}]"
        )
    answers = await _all_or_none(
        rt.submit(InferRequest(name, float(deadline), None, "kserve", tensor=x[i]), raw=True)
        for i in range(x.shape[0])
    )
    bad = [a for a in answers if a["status"] != "ok"]
    if bad:
        status = 503 if bad[0]["status"] == "dropped" else bad[0].get("code", 500)
        return web.json_response(
            {
                "error": f"{len(bad)} of {len(answers)} samples were not served: {bad[0].get('reason')}"
            },
            status=status,
        )
    out = _output_tensor(last, output_name, [a["raw_output"] for a in answers], asked.classes)
    entry, blob = out.encode(asked.binary)
    reply: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": [entry]}
    if "id" in doc:
        reply["id"] = doc["id"]
    if not asked.binary:
        return web.json_response(reply)
    text = json.dumps(reply).encode()
    return web.Response(
        body=text + blob,
        content_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(text))},
    )


def _output_tensor(last: ModelSpec, name: str, outputs: list[Any], classes: int) -> Output:
    """The samples' outputs as one tensor: a classifier's or segmenter's FP32 scores (or, with
    `classes`, its best classes), a detector's JSON strings."""
    if not isinstance(outputs[0], torch.Tensor):
        return Output(
            name, "BYTES", [len(outputs)], [json.dumps(describe(last, o)) for o in outputs]
        )
    # numpy on the loop (layerexec.torch_thread)
    y = np.stack([o.float().cpu().numpy() for o in outputs])
    if not classes:
        return Output(name, "FP32", list(y.shape), y)
    best = top_classes(y, classes, last.labels)
    return Output(name, "BYTES", [len(y), len(best) // len(y)], best)


async def _all_or_none(submits: Iterable[Awaitable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every sample's answer; should one be refused (the queue full, say), the others, already
    admitted, are withdrawn before the refusal is raised, so that no work runs for nobody."""
    tasks = [asyncio.ensure_future(s) for s in submits]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

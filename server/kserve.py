"""The Open Inference Protocol (KServe v2) over HTTP with JSON tensors, so that clients written
for Triton (tritonclient, perf_analyzer) talk to layerbatch unchanged.

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
from typing import Any

import numpy as np
import torch
from aiohttp import web

from server.config import RUNTIME, Served
from server.errors import BadRequest
from server.results import describe
from server.wire import MAX_DEADLINE_MS, InferRequest


def add_kserve_routes(app: web.Application) -> None:
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/models/{app}", model_metadata)
    app.router.add_get("/v2/models/{app}/ready", model_ready)
    app.router.add_post("/v2/models/{app}/infer", model_infer)


def _runtime(request: web.Request) -> Served:
    return request.app[RUNTIME]


def _app(request: web.Request) -> str:
    name = request.match_info["app"]
    lengths = _runtime(request).app_lengths()
    if name not in lengths:
        raise BadRequest(
            404, f"model: unknown model {name!r}; served models: {', '.join(sorted(lengths))}"
        )
    return name


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": "layerbatch", "version": "0.1.0", "extensions": []})


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    ok = _runtime(request).accepting
    return web.json_response({"ready": ok}, status=200 if ok else 503)


async def model_ready(request: web.Request) -> web.Response:
    _app(request)
    return web.json_response({"ready": True})


async def model_metadata(request: web.Request) -> web.Response:
    name = _app(request)
    rt = _runtime(request)
    first = rt.first_spec(name)
    last = rt.models[rt.deployment.apps[name].models[-1]]
    if last.spec.kind in ("classifier", "segmenter"):
        shape = (
            [-1, len(last.spec.labels)]
            if last.spec.kind == "classifier"
            else [-1, len(last.spec.labels), *first.input_shape[1:]]
        )
        output = {"name": "OUTPUT", "datatype": "FP32", "shape": shape}
    else:
        output = {"name": "DETECTIONS", "datatype": "BYTES", "shape": [-1]}
    return web.json_response(
        {
            "name": name,
            "versions": ["1"],
            "platform": "layerbatch",
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, *first.input_shape]}],
            "outputs": [output],
            "parameters": {
                "pixel_mean": list(first.pixel_mean),
                "pixel_std": list(first.pixel_std),
            },
        }
    )


async def model_infer(request: web.Request) -> web.Response:
    name = _app(request)
    rt = _runtime(request)
    if "Inference-Header-Content-Length" in request.headers:
        raise BadRequest(
            400, "binary tensor data is not supported: send JSON tensors (binary_data=False)"
        )
    try:
        doc = json.loads(await request.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, f"body: expected a JSON inference request ({exc})") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("inputs"), list)
        or len(doc["inputs"]) != 1
    ):
        raise BadRequest(400, "inputs: expected a list with exactly one input tensor")
    spec = rt.first_spec(name)
    x = _tensor(doc["inputs"][0], spec.input_shape)
    params = doc.get("parameters") or {}
    deadline = params.get("deadline_ms", 1000.0) if isinstance(params, dict) else None
    if (
        not isinstance(deadline, int | float)
        or isinstance(deadline, bool)
        or not (math.isfinite(deadline) and 0 < deadline <= MAX_DEADLINE_MS)
    ):
        raise BadRequest(
            422, f"parameters.deadline_ms: expected a number in (0, {MAX_DEADLINE_MS:g}]"
        )
    answers = await asyncio.gather(
        *(
            rt.submit(InferRequest(name, float(deadline), None, "kserve", tensor=x[i]), raw=True)
            for i in range(x.shape[0])
        )
    )
    bad = [a for a in answers if a["status"] != "ok"]
    if bad:
        status = 503 if bad[0]["status"] == "dropped" else 500
        return web.json_response(
            {
                "error": f"{len(bad)} of {len(answers)} samples were not served: {bad[0].get('reason')}"
            },
            status=status,
        )
    last = rt.models[rt.deployment.apps[name].models[-1]].spec
    outputs = [a["raw_output"] for a in answers]
    if isinstance(outputs[0], torch.Tensor):  # numpy on the loop (layerexec.torch_thread)
        y = np.stack([o.float().cpu().numpy() for o in outputs])
        out = {
            "name": "OUTPUT",
            "datatype": "FP32",
            "shape": list(y.shape),
            "data": y.flatten().tolist(),
        }
    else:
        texts = [json.dumps(describe(last, o)) for o in outputs]
        out = {"name": "DETECTIONS", "datatype": "BYTES", "shape": [len(texts)], "data": texts}
    reply: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": [out]}
    if "id" in doc:
        reply["id"] = doc["id"]
    return web.json_response(reply)


def _tensor(inp: Any, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(inp, dict) or inp.get("datatype") != "FP32":
        raise BadRequest(400, "inputs[0].datatype: expected FP32")
    declared = inp.get("shape")
    if not isinstance(declared, list) or not all(isinstance(v, int) and v > 0 for v in declared):
        raise BadRequest(400, "inputs[0].shape: expected a list of positive integers")
    if declared == list(shape):
        declared = [1, *declared]
    if declared[1:] != list(shape):
        raise BadRequest(
            422, f"inputs[0].shape: expected [N, {', '.join(map(str, shape))}], got {declared}"
        )
    try:
        arr = np.asarray(inp.get("data"), dtype=np.float32).reshape(declared)
    except (TypeError, ValueError):
        raise BadRequest(
            400, f"inputs[0].data: expected {math.prod(declared)} numbers for shape {declared}"
        ) from None
    if not np.isfinite(arr).all():
        raise BadRequest(422, "inputs[0].data: expected finite numbers")
    return torch.from_numpy(arr)

"""The aiohttp application: the v1 API, WebSocket streaming, KServe v2, metrics and health.

`make_app(config)` is an app factory; the runtime starts and stops in `cleanup_ctx`, and on
shutdown (SIGTERM) the server stops accepting and answers every accepted request before exiting.
A request whose body is still arriving is one of them: `serve` lets its body arrive for up to
`UPLOADS_ARRIVE_S` and serves it, or else refuses it 503 saying the server is shutting down; a
connection that has sent no request yet is closed.
Every refusal is one JSON/msgpack document {"status": code, "error": one sentence}; a refused or
failed request never affects another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from scheduler.policies import POLICIES
from server.body import UPLOADS, Uploads, check_declared_size, read_body
from server.config import CONFIG, RUNTIME, Served, ServerConfig
from server.errors import BadRequest
from server.kserve import add_kserve_routes
from server.runtime import Overloaded
from server.wire import decode_body, encode_body, is_json, is_msgpack, parse_infer

log = logging.getLogger(__name__)
# the open WebSocket streams, each with the tasks answering its messages
STREAMS: web.AppKey[dict[web.WebSocketResponse, set[asyncio.Task[None]]]] = web.AppKey("streams")
STREAM_ANSWERS_S = 5.0  # at shutdown, how long a stream's last answers may take to send
UPLOADS_ARRIVE_S = 5.0  # at shutdown, how long the bodies being sent may take to arrive


async def _close_streams(streams: dict[web.WebSocketResponse, set[asyncio.Task[None]]]) -> None:
    """After the drain, every accepted message has its answer: send them, then close each stream
    as going away (1001). Otherwise aiohttp waits for the open sockets past any orchestrator's
    grace period, and the clients see the connection drop with no close."""
    for ws, tasks in list(streams.items()):
        if tasks:
            await asyncio.wait(tasks, timeout=STREAM_ANSWERS_S)
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is shutting down")


def make_app(runtime: Served, config: ServerConfig | None = None) -> web.Application:
    cfg = config or ServerConfig()
    app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[_errors])
    app[RUNTIME] = runtime
    app[CONFIG] = cfg
    app[STREAMS] = {}
    app[UPLOADS] = Uploads()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await runtime.start()
        yield
        await runtime.stop()

    async def on_shutdown(app: web.Application) -> None:
        app[UPLOADS].close()  # aiohttp reads no byte more: a body not all here never will be
        await runtime.drain()
        await _close_streams(app[STREAMS])

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(on_shutdown)
    app.router.add_post("/v1/infer", infer, expect_handler=expect_continue)
    app.router.add_get("/v1/stream", stream)
    app.router.add_get("/v1/estimate", estimate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/status", status)
    app.router.add_put("/v1/policy", set_policy)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    add_kserve_routes(app, expect_continue)
    return app


def serve(app: web.Application, host: str, port: int, shutdown_timeout: float) -> None:
    """Serve `app` on host:port until SIGTERM or SIGINT, then shut down losing nothing.

    As `web.run_app`, with one step more: once the listener is closed, the bodies being sent get
    `UPLOADS_ARRIVE_S` (at most the body timeout) to arrive before aiohttp's shutdown begins,
    from which on it reads no byte more (`server.body`); the app refuses the ones still
    incomplete then (503). In that shutdown the runtime drains (`make_app`), and each
    connection's handler has `shutdown_timeout` more to finish before aiohttp cancels it."""
    asyncio.run(_serve(app, host, port, shutdown_timeout))


async def _serve(app: web.Application, host: str, port: int, shutdown_timeout: float) -> None:
    runner = web.AppRunner(  # keepalive_timeout: run_app's
        app, handler_cancellation=True, keepalive_timeout=75.0, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second one does not cut the shutdown
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await site.stop()  # no new connections
        await app[UPLOADS].settle(min(UPLOADS_ARRIVE_S, app[CONFIG].body_timeout_s))
    finally:
        await runner.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def reply(request: web.Request, doc: Any, status: int = 200) -> web.Response:
    """Answer in the request's format: msgpack if it sent msgpack or asks for it (Accept),
    else JSON (so a plain GET from a browser or curl reads as text). KServe v2 is always JSON."""
    accept = request.headers.get("Accept", "")
    sent_msgpack = request.body_exists and is_msgpack(request.content_type)
    v2 = request.path.startswith("/v2")
    json_mode = v2 or "json" in accept or not (sent_msgpack or "msgpack" in accept)
    body, ctype = encode_body(doc, json_mode)
    return web.Response(body=body, status=status, content_type=ctype)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except Overloaded as exc:
        resp = reply(request, {"status": exc.status, "error": exc.message}, exc.status)
        resp.headers["Retry-After"] = str(exc.retry_after_s)
        return resp
    except BadRequest as exc:
        return reply(request, {"status": exc.status, "error": exc.message}, exc.status)
    except web.HTTPRequestEntityTooLarge as exc:
        return _too_large(request, exc.text or "")
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"method: expected {allowed} for {request.path}, got {request.method}"
        return reply(request, {"status": exc.status, "error": message}, exc.status)
    except web.HTTPNotFound as exc:
        paths = sorted({r.canonical for r in request.app.router.resources()})
        message = f"path: expected one of {', '.join(paths)}, got {request.path}"
        return reply(request, {"status": exc.status, "error": message}, exc.status)
    except web.HTTPClientError as exc:  # aiohttp's own refusals, e.g. a WebSocket not upgraded
        message = f"{request.method} {request.path}: {' '.join((exc.text or exc.reason).split())}"
        return reply(request, {"status": exc.status, "error": message}, exc.status)


def _too_large(request: web.Request, detail: str) -> web.Response:
    limit = request.app[CONFIG].max_body_bytes
    error = f"body: expected at most {limit} bytes ({detail})"
    return reply(request, {"status": 413, "error": error}, 413)


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue` on a POST: a body declared over the limit is refused (413) before
    the client sends it; otherwise 100 Continue, as aiohttp answers (417 for another Expect)."""
    try:
        check_declared_size(request)
    except web.HTTPRequestEntityTooLarge as exc:  # before the middleware: answered here
        return _too_large(request, exc.text or "")
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        message = f"Expect: expected 100-continue or no Expect header, got {expect!r}"
        return reply(request, {"status": 417, "error": message}, 417)
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim line is not part of the response
    return None


async def _read(request: web.Request) -> Any:
    return decode_body(await read_body(request), request.content_type)


async def infer(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    doc = await _read(request)
    json_mode = is_json(request.content_type)
    req = parse_infer(
        doc, runtime.app_lengths(), json_mode, request.app[CONFIG].default_deadline_ms
    )
    answer = await runtime.submit(req)
    return reply(request, answer, answer.get("code", 500) if answer["status"] == "error" else 200)


async def stream(request: web.Request) -> web.WebSocketResponse:
    """Many infer messages per connection (binary frames: msgpack, text frames: JSON), each
    answered when it completes and matched by request_id; closing the socket forgets the rest."""
    runtime = request.app[RUNTIME]
    deadline = request.app[CONFIG].default_deadline_ms
    ws = web.WebSocketResponse(max_msg_size=request.app[CONFIG].max_body_bytes)
    await ws.prepare(request)
    tasks: set[asyncio.Task[None]] = set()
    request.app[STREAMS][ws] = tasks
    counter = 0

    async def handle(data: bytes, json_mode: bool, fallback_id: str) -> None:
        rid = fallback_id
        try:
            doc = decode_body(data, "application/json" if json_mode else "application/msgpack")
            if isinstance(doc, dict):
                given = doc.setdefault("request_id", fallback_id)
                rid = given if isinstance(given, str) else fallback_id
            answer = await runtime.submit(
                parse_infer(doc, runtime.app_lengths(), json_mode, deadline)
            )
        except BadRequest as exc:
            answer = {
                "request_id": rid,
                "status": "error",
                "code": exc.status,
                "error": exc.message,
            }
        except Exception as exc:  # a bug, not the client's: said, and the message still answered
            log.exception("answering WebSocket message %s", rid)
            answer = {"request_id": rid, "status": "error", "code": 500, "error": repr(exc)}
        body, _ = encode_body(answer, json_mode)
        if not ws.closed:
            await (ws.send_str(body.decode()) if json_mode else ws.send_bytes(body))

    try:
        async for msg in ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                counter += 1
                text = msg.type == WSMsgType.TEXT
                data = msg.data.encode() if text else msg.data
                task = asyncio.create_task(handle(data, text, f"ws{id(ws):x}-{counter}"))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        request.app[STREAMS].pop(ws, None)
        for task in tasks:
            task.cancel()  # the client left: its requests leave the queue
    return ws


async def estimate(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    app = request.query.get("app", "")
    lengths = runtime.app_lengths()
    if app not in lengths:
        raise BadRequest(
            404, f"app: unknown app {app!r}; served apps: {', '.join(sorted(lengths))}"
        )
    try:
        position = int(request.query.get("position", "0"))
    except ValueError:
        raise BadRequest(400, "position: expected an integer stage index") from None
    if not 0 <= position < lengths[app]:
        raise BadRequest(
            422, f"position: expected 0..{lengths[app] - 1} for app {app}, got {position}"
        )
    return reply(
        request,
        {"app": app, "position": position, "completion_ms": runtime.estimate_ms(app, position)},
    )


async def models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    d = runtime.deployment
    apps = {}
    for name, spec in d.apps.items():
        first = runtime.models[spec.models[0]].spec
        apps[name] = {
            "models": list(spec.models),
            "stages": d.app_length(name),
            "input_shape": list(first.input_shape),
            "kind": runtime.models[spec.models[-1]].spec.kind,
            "stage_input_shapes": [
                list(runtime.models[m].in_shapes[k])
                for m in spec.models
                for k in range(len(runtime.models[m].stages))
            ],
            "max_batch": {m: d.batch_limit(m) for m in spec.models},
        }
    return reply(request, {"apps": apps, "policy": runtime.policy_name})


async def status(request: web.Request) -> web.Response:
    return reply(request, request.app[RUNTIME].status())


async def set_policy(request: web.Request) -> web.Response:
    token = request.app[CONFIG].admin_token
    if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
        raise BadRequest(401, "Authorization: expected 'Bearer <admin token>' to change the policy")
    doc = await _read(request)
    name = doc.get("policy") if isinstance(doc, dict) else None
    if name not in POLICIES:
        raise BadRequest(400, f"policy: expected one of {', '.join(POLICIES)}")
    request.app[RUNTIME].set_policy(name)
    return reply(request, {"policy": name})


async def metrics(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    text = runtime.metrics.render(runtime.queue_by_stage())
    return web.Response(
        text=text, content_type="text/plain", charset="utf-8", headers={"X-Format": "0.0.4"}
    )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    ready = runtime.ready
    return web.json_response({"ready": ready}, status=200 if ready else 503, dumps=json.dumps)

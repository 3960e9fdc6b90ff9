"""Shared builders for the server tests (tests/test_server_*.py).

Everything goes through real sockets: `serve` starts the app with pytest-aiohttp's
`aiohttp_client` (a real TestServer on loopback, with `handler_cancellation=True` as
`layerbatch serve` runs it; aiohttp 3.14's TestServer turns it on whatever it is passed),
requests are real JPEGs (OpenCV) or real H.264 feature maps (`layerexec.features`), and the
models are the small real ones (ResNet-20 on CIFAR-10 with its real weights, UltraFace slim-320).

When a test needs the executor busy it makes it busy deterministically with a `StageGate`: a
forward pre-hook on one stage of one model that blocks the executor thread inside that stage
until the test opens the gate (a call left waiting GATE_LIMIT_S there fails the test). Nothing
in these tests depends on how fast this machine is, except generous upper bounds (seconds) that
only a hang would exceed.

Runtimes are built with `calibrate=False`: a step held at a gate for a second would otherwise
teach the runtime that this machine is a thousand times slower than its profile, and plans
(which drop requests that cannot make their deadline) would change under the test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import msgpack
import numpy as np
import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestClient

from client.frames import jpeg as encode_jpeg
from layerexec.features import encode_features
from server.app import ServerConfig, make_app
from server.build import build_runtime
from server.inputs import image_tensor
from server.runtime import Runtime

CIFAR = "resnet20_cifar10"
FACES = "ultraface_slim320"
SHARED_IMAGES = Path(__file__).resolve().parents[2] / "shared" / "data" / "images"
MSGPACK = {"Content-Type": "application/msgpack"}
SERVER_KWARGS = {"handler_cancellation": True}
LONG_DEADLINE_MS = 60_000.0  # generous: nothing in a test is meant to miss it
GATE_LIMIT_S = 30.0  # a gate never holds longer than this (a failing test must not hang)
ROOT = Path(__file__).resolve().parent.parent

Client = TestClient[web.Request, web.Application]


# --- images -----------------------------------------------------------------------------------
def shared_rgb(name: str) -> np.ndarray:
    """An RGB image from ../shared/data/images; skips the test when the folder is absent."""
    path = SHARED_IMAGES / name
    if not path.exists():
        pytest.skip(f"{path} is not available")
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert bgr is not None, f"could not read {path}"
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def synthetic_rgb(h: int = 32, w: int = 32, seed: int = 0) -> np.ndarray:
    """A deterministic RGB image: smooth colour gradients plus a little seeded texture."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack(
        [
            255 * xx / max(w - 1, 1),
            255 * yy / max(h - 1, 1),
            127 + 100 * np.sin((xx + yy + seed) / 5.0),
        ],
        axis=-1,
    )
    noise = rng.normal(0, 12, size=(h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def jpeg(rgb: np.ndarray, quality: int = 92) -> bytes:
    return encode_jpeg(rgb, quality)


def small_jpeg(seed: int = 0) -> bytes:
    """A 32 x 32 JPEG (the CIFAR model's own input size, no resize)."""
    return jpeg(synthetic_rgb(32, 32, seed))


# --- runtimes and servers ---------------------------------------------------------------------
@pytest.fixture
def restore_process_globals() -> Iterator[None]:
    """Give back what building and starting a runtime changes for the whole process (torch's
    thread count, the interpreter's switch interval), so later test modules run as before.
    Test modules use it with `pytestmark = pytest.mark.usefixtures(...)`."""
    threads, interval = torch.get_num_threads(), sys.getswitchinterval()
    yield
    torch.set_num_threads(threads)
    sys.setswitchinterval(interval)


def build(
    apps: Sequence[str] = (CIFAR,),
    policy: str = "dp-tardy",
    max_queued: int = 1000,
    decode_threads: int = 1,
    script: bool = False,
) -> Runtime:
    """A runtime over the bundled CPU profiles, one torch thread, calibration off (see above),
    one decode thread (so that a test holding the executor can still have inputs decoded, on a
    machine of any size), and 5 layer groups for every model, resnet20 too (no floor on a
    group's time, `min_group_ms=0`): the tests follow requests through continued steps. Its
    stages are eager unless `script` (TorchScript takes no hooks, and a `StageGate` is one)."""
    runtime = build_runtime(
        list(apps), policy=policy, threads=1, max_queued=max_queued,
        decode_threads=decode_threads, min_group_ms=0.0, script=script,
    )  # fmt: skip
    runtime.calibrate = False
    return runtime


async def serve(
    aiohttp_client: Callable[..., Any], runtime: Runtime, config: ServerConfig | None = None
) -> Client:
    """The app on a real loopback TestServer, cancelling handlers whose client went away."""
    client: Client = await aiohttp_client(
        make_app(runtime, config or ServerConfig()), server_kwargs=SERVER_KWARGS
    )
    return client


def json_doc(frame: bytes, **kwargs: Any) -> dict[str, Any]:
    """An infer message for JSON: the JPEG as base64 text."""
    doc = infer_doc(frame, **kwargs)
    doc["payload"] = {"jpeg": base64.b64encode(frame).decode()}
    return doc


def infer_doc(
    payload: bytes | dict[str, Any],
    app: str = CIFAR,
    deadline_ms: float | None = LONG_DEADLINE_MS,
    request_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An infer message: `payload` is JPEG bytes or a features dict."""
    doc: dict[str, Any] = {"app": app}
    if deadline_ms is not None:
        doc["deadline_ms"] = deadline_ms
    doc["payload"] = {"jpeg": payload} if isinstance(payload, bytes) else {"features": payload}
    if request_id is not None:
        doc["request_id"] = request_id
    doc.update(extra)
    return doc


def packb(doc: Any) -> bytes:
    return msgpack.packb(doc, use_bin_type=True)


async def post(
    client: Client,
    body: bytes,
    content_type: str = "application/msgpack",
    path: str = "/v1/infer",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """POST raw bytes; the answer decoded by its Content-Type (msgpack or JSON)."""
    hdrs = {"Content-Type": content_type, **(headers or {})}
    async with client.post(path, data=body, headers=hdrs) as resp:
        raw = await resp.read()
        if resp.content_type == "application/msgpack":
            doc = msgpack.unpackb(raw, raw=False)
        elif resp.content_type == "application/json":
            doc = json.loads(raw)
        else:
            doc = raw.decode(errors="replace")
        return resp.status, doc, dict(resp.headers)


async def infer(client: Client, doc: dict[str, Any]) -> tuple[int, Any]:
    """POST an infer message as msgpack; (HTTP status, decoded answer)."""
    status, answer, _ = await post(client, packb(doc))
    return status, answer


async def start_upload(port: int, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST /v1/infer with `Expect: 100-continue`; once the server has answered 100 (it holds the
    request), the first half of the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n".encode()
    )
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body[: len(body) // 2])
    await writer.drain()
    return reader, writer


async def raw_answer(reader: asyncio.StreamReader, limit_s: float = 30) -> tuple[int, Any] | None:
    """One HTTP response read off a raw socket: its status and JSON document, or None if the
    connection closed before a response began."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limit_s)
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), limit_s)
    return int(lines[0].split()[1]), json.loads(body)


async def get_json(client: Client, path: str) -> tuple[int, Any]:
    async with client.get(path) as resp:
        return resp.status, await resp.json()


async def wait_for(
    predicate: Callable[[], bool], what: str, timeout_s: float = GATE_LIMIT_S
) -> None:
    """Poll `predicate` on the loop (without blocking it) until it holds."""
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.002)


def counters(runtime: Runtime) -> dict[str, int]:
    """Answers by "app/status" so far."""
    return dict(runtime.status()["counters"]["answered"])


def assert_nothing_left(runtime: Runtime) -> None:
    """No request is pending, queued in the scheduler or holding tensors in the store."""
    assert runtime.pending == {}
    assert len(runtime.engine.state) == 0
    assert len(runtime.executor.store) == 0
    assert runtime.executor.store.nbytes() == 0


# --- holding the executor ----------------------------------------------------------------------
class StageGate:
    """Blocks the executor thread inside stage `stage` of `model` while closed.

    A forward pre-hook on the stage module: every call records its batch size in `batches`; while
    the gate is closed a call sets `entered` and waits until `open()` (or GATE_LIMIT_S). Use it as
    a context manager so that it is always opened and removed, even when the test fails.
    """

    def __init__(self, runtime: Runtime, model: str, stage: int = 0) -> None:
        self.runtime = runtime
        self.batches: list[int] = []
        self.timed_out = False
        self.entered = threading.Event()
        self._open = threading.Event()
        self._open.set()
        module = runtime.models[model].stages[stage]
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self.batches.append(int(args[0].shape[0]))
        if not self._open.is_set():
            self.entered.set()
            if not self._open.wait(GATE_LIMIT_S):
                self.timed_out = True

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self.entered.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def held(self) -> None:
        """Wait until a call is blocked at the gate."""
        await wait_for(self.entered.is_set, "the executor to reach the gate")

    def __enter__(self) -> StageGate:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.open()
        self._handle.remove()
        if exc_type is None and self.timed_out:
            raise AssertionError(
                f"a call waited {GATE_LIMIT_S} s at a closed gate: the test waited for work "
                "that could not progress"
            )


@contextlib.asynccontextmanager
async def good_request_in_flight(
    client: Client, gate: StageGate, request_id: str = "good", seed: int = 0
) -> AsyncIterator[asyncio.Task[tuple[int, Any]]]:
    """A valid request held inside the executor for the duration of the block; afterwards the
    gate opens and the request must come back 200 ok with a classification."""
    gate.close()
    task = asyncio.create_task(infer(client, infer_doc(small_jpeg(seed), request_id=request_id)))
    try:
        await gate.held()
        yield task
    finally:
        gate.open()
    status, answer = await asyncio.wait_for(task, GATE_LIMIT_S)
    assert status == 200, answer
    assert answer["status"] == "ok" and answer["request_id"] == request_id
    assert len(answer["result"]["top5"]) == 5


# --- feature maps -----------------------------------------------------------------------------
def stage_input(runtime: Runtime, app_model: str, rgb: np.ndarray, k: int) -> torch.Tensor:
    """The input of stage k for an image, computed with the model's own stages (one sample)."""
    model = runtime.models[app_model]
    x = image_tensor(jpeg(rgb), model.spec).unsqueeze(0)
    out = model.run(x, 0, k)
    assert isinstance(out, torch.Tensor)
    return out[0].contiguous()


def features_payload(x: torch.Tensor, k: int, codec: str = "h264") -> dict[str, Any]:
    """The wire form of a stage-k feature map (INT8, H.264 or raw)."""
    ef = encode_features(x, k, codec)
    return {
        "position": ef.position,
        "shape": list(ef.shape),
        "scale": ef.scale,
        "zero_point": ef.zero_point,
        "codec": ef.codec,
        "data": ef.data,
    }


# --- processes --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port

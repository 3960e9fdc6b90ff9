"""Shutdown while request bodies are still arriving: every request whose headers the server had
accepted is answered, never dropped.

Once aiohttp begins its shutdown it reads no byte more from any connection, so a body still on
its way could never complete: its handler waited until the shutdown timeout cancelled it, and the
client saw the connection close with no answer (all of them, in this file's first test, before
the fix). Now `layerbatch serve` lets the bodies being sent arrive after SIGTERM and serves them,
and the app refuses the ones still incomplete when its shutdown begins with 503 ("the server is
shutting down"). Each request sends `Expect: 100-continue` and waits for the 100: its headers are
then known to be accepted, whatever the speed of this machine.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from server.app import ServerConfig
from tests.server_cases import (
    build,
    free_port,
    json_doc,
    raw_answer,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
    small_jpeg,
    start_upload,
)
from tests.test_server_faults import _start_server, _wait_ready

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("restore_process_globals")]

SHUTTING_DOWN = "body: the server is shutting down and reads no more of it; send the request again"


async def test_sigterm_serves_bodies_still_arriving_and_refuses_stalled_ones_503(
    tmp_path: Path,
) -> None:
    """SIGTERM while 20 bodies are half sent: the 18 whose clients then send the rest are served,
    the 2 that never do are refused 503 (not left for aiohttp to cancel unanswered), and the
    server exits 0 well within its shutdown timeout."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = _start_server(port, log)
    try:
        await _wait_ready(proc, f"http://127.0.0.1:{port}", log)
        bodies = [
            json.dumps(json_doc(small_jpeg(i), request_id=f"u{i}", deadline_ms=2500.0)).encode()
            for i in range(20)
        ]
        uploads = [await start_upload(port, body) for body in bodies]
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while True:  # until the listener has closed: the shutdown has begun
            try:
                _, probe = await asyncio.open_connection("127.0.0.1", port)
            except (ConnectionRefusedError, ConnectionResetError):  # reset: queued as it closed
                break
            probe.close()
            assert time.monotonic() - signalled < 10, "still listening 10 s after SIGTERM"
            await asyncio.sleep(0.01)
        for (_, writer), body in zip(uploads[2:], bodies[2:], strict=True):
            writer.write(body[len(body) // 2 :])
            await writer.drain()
        answers = await asyncio.gather(*(raw_answer(reader, 60) for reader, _ in uploads))
        for _, writer in uploads:
            writer.close()
        assert answers[:2] == [(503, {"status": 503, "error": SHUTTING_DOWN})] * 2, answers
        for got in answers[2:]:
            assert got is not None, answers
            assert got[0] == 200 and got[1]["status"] in ("ok", "dropped"), got
        assert proc.wait(timeout=25) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_body_still_arriving_when_the_app_shuts_down_is_refused_503(
    aiohttp_client: Any,
) -> None:
    """However the app is run: from the start of its shutdown no byte more is read, so a body
    not all arrived is refused 503 at once, not after aiohttp's shutdown timeout (60 s here)."""
    client = await serve(aiohttp_client, build(), ServerConfig())
    body = json.dumps(json_doc(small_jpeg(0))).encode()
    assert client.port is not None
    reader, writer = await start_upload(client.port, body)
    closing = asyncio.create_task(client.close())
    got = await raw_answer(reader)
    writer.close()
    await asyncio.wait_for(closing, 30)
    assert got == (503, {"status": 503, "error": SHUTTING_DOWN})

"""A request's body, read within the server's time for it (`ServerConfig.body_timeout_s`).

aiohttp waits for a declared body as long as its client keeps the connection open: a client that
sends one byte of 100 kB and stops held a handler (and, at shutdown, the server's exit) for as
long as it liked. The body must now arrive within the limit; otherwise 408 names it.

At shutdown, once aiohttp begins closing the connections (`Server.pre_shutdown`), it reads no
byte more from any of them (`RequestHandler.data_received` drops them), so a body still arriving
then can never complete: its handler used to wait until aiohttp's shutdown timeout cancelled it
and the client saw the connection close with no answer. `Uploads` keeps the bodies being read:
`server.app.serve` lets them arrive before that point (`Uploads.settle`), and the app's shutdown
refuses the ones still incomplete with 503 at once (`Uploads.close`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from aiohttp import web

from server.config import CONFIG
from server.errors import BadRequest


class Uploads:
    """The request bodies being read, so that a shutdown can wait for them, then refuse the rest."""

    def __init__(self) -> None:
        self.closed = False  # no byte more arrives: a body not all here is refused (503)
        self._reading: dict[asyncio.Timeout, web.Request] = {}
        self._none = asyncio.Event()
        self._none.set()

    @contextlib.contextmanager
    def reading(self, timer: asyncio.Timeout, request: web.Request) -> Iterator[None]:
        self._reading[timer] = request
        self._none.clear()
        try:
            yield
        finally:
            del self._reading[timer]
            if not self._reading:
                self._none.set()

    async def settle(self, limit_s: float) -> None:
        """Return once no body is being read (arrived, or refused 408), or after `limit_s`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit_s):
                await self._none.wait()

    def close(self) -> None:
        """Once aiohttp reads no more from the connections: every body not all arrived is
        refused (503) at once, now and when a handler comes to read one later."""
        self.closed = True
        now = asyncio.get_running_loop().time()
        for timer, request in self._reading.items():
            if not request.content.is_eof() and not timer.expired():
                timer.reschedule(now)  # its read ends in TimeoutError, answered 503 below


UPLOADS = web.AppKey("uploads", Uploads)


def _shutting_down() -> BadRequest:
    return BadRequest(
        503, "body: the server is shutting down and reads no more of it; send the request again"
    )


def check_declared_size(request: web.Request) -> None:
    """HTTPRequestEntityTooLarge when the request's Content-Length is over the server's limit,
    before a byte of the body is read."""
    declared, max_bytes = request.content_length, request.app[CONFIG].max_body_bytes
    if declared is not None and declared > max_bytes:
        raise web.HTTPRequestEntityTooLarge(
            max_size=max_bytes, actual_size=declared, text=f"Content-Length declares {declared}"
        )


async def read_body(request: web.Request) -> bytes:
    """The whole body; HTTPRequestEntityTooLarge at once when its Content-Length is over the
    server's limit (nothing is read), BadRequest(408) if it has not all arrived in time, and
    BadRequest(503) if the server began shutting down before it all arrived."""
    check_declared_size(request)
    uploads = request.app[UPLOADS]
    if uploads.closed and not request.content.is_eof():
        raise _shutting_down()
    limit_s = request.app[CONFIG].body_timeout_s
    try:
        async with asyncio.timeout(limit_s) as timer:
            with uploads.reading(timer, request):
                return await request.read()
    except TimeoutError:
        if uploads.closed:
            raise _shutting_down() from None
        raise BadRequest(
            408, f"body: expected all {request.content_length} bytes within {limit_s:g} s"
        ) from None

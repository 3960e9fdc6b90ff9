"""A request's body, read within the server's time for it (`ServerConfig.body_timeout_s`).

aiohttp waits for a declared body as long as its client keeps the connection open: a client that
sends one byte of 100 kB and stops held a handler (and, at shutdown, the server's exit) for as
long as it liked. The body must now arrive within the limit; otherwise 408 names it.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from server.config import CONFIG
from server.errors import BadRequest


async def read_body(request: web.Request) -> bytes:
    """The whole body, or BadRequest(408) if it has not all arrived within the limit."""
    limit_s = request.app[CONFIG].body_timeout_s
    try:
        async with asyncio.timeout(limit_s):
            return await request.read()
    except TimeoutError:
        raise BadRequest(
            408, f"body: expected all {request.content_length} bytes within {limit_s:g} s"
        ) from None

"""The trace-paced TCP proxy (client/linkshell.py) on real sockets: bytes arrive intact and no
sooner than the trace allows; an unreachable upstream costs one connection, not the proxy.

Times are only bounded from below (what the trace allows); the upper bounds are hang guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from client.link_pacing import send_paced
from client.linkshell import parse_hostport, serve_linkshell
from traces.network import Link, LinkTrace, load_trace

HANG_GUARD_S = 30.0
# one opportunity every 10 ms: 1.2 Mbit/s; n packets take at least (n - 1) * 10 ms
SLOW = LinkTrace("slow", np.array([10]), 10)
FAST = LinkTrace("fast", np.array([1] * 8), 1)  # 8 packets per ms: 96 Mbit/s


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def running(server: asyncio.Server) -> AsyncIterator[tuple[str, int]]:
    async with server:
        host, port = server.sockets[0].getsockname()[:2]
        yield host, port


async def round_trip(proxy: tuple[str, int], payload: bytes) -> tuple[bytes, float]:
    """Send `payload` through the proxy to the echo server, half-close, read all back."""
    start_s = time.monotonic()
    reader, writer = await asyncio.open_connection(*proxy)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()
    data = await reader.read()
    elapsed_s = time.monotonic() - start_s
    writer.close()
    await writer.wait_closed()
    return data, elapsed_s


@pytest.mark.parametrize(
    ("uplink", "downlink"), [(SLOW, FAST), (FAST, SLOW)], ids=["slow-uplink", "slow-downlink"]
)
@pytest.mark.asyncio
async def test_bytes_arrive_intact_and_no_sooner_than_the_trace(
    uplink: LinkTrace, downlink: LinkTrace
) -> None:
    payload = os.urandom(30_000)  # 20 packets over the slow direction: at least 190 ms
    upstream_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with running(upstream_server) as upstream:
        proxy_server = await serve_linkshell(uplink, downlink, ("127.0.0.1", 0), upstream)
        async with running(proxy_server) as proxy:
            data, elapsed_s = await asyncio.wait_for(round_trip(proxy, payload), HANG_GUARD_S)
    assert data == payload
    assert elapsed_s >= 0.190


@pytest.mark.asyncio
async def test_connections_share_one_link_per_direction(tmp_path: Path) -> None:
    path = tmp_path / "slow.up"
    path.write_text("10\n")  # the same 1.2 Mbit/s link, from a Mahimahi file
    slow = load_trace(path)
    payloads = [os.urandom(15_000), os.urandom(15_000)]  # 10 packets each, 20 on one link
    upstream_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with running(upstream_server) as upstream:
        proxy_server = await serve_linkshell(slow, FAST, ("127.0.0.1", 0), upstream)
        async with running(proxy_server) as proxy:
            results = await asyncio.wait_for(
                asyncio.gather(*(round_trip(proxy, p) for p in payloads)), HANG_GUARD_S
            )
    assert [data for data, _ in results] == payloads
    assert max(elapsed for _, elapsed in results) >= 0.190  # not 0.09 each: the link is shared


@pytest.mark.asyncio
async def test_unreachable_upstream_closes_the_client_and_the_proxy_lives_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a bound socket that does not listen refuses connections and keeps its port for later
    reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserved.bind(("127.0.0.1", 0))
    upstream = reserved.getsockname()[:2]
    proxy_server = await serve_linkshell(FAST, FAST, ("127.0.0.1", 0), upstream)
    async with running(proxy_server) as proxy:
        reader, writer = await asyncio.open_connection(*proxy)
        with caplog.at_level(logging.WARNING, logger="client.linkshell"):
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(), HANG_GUARD_S) == b""
            writer.close()
            with contextlib.suppress(ConnectionResetError):
                await writer.wait_closed()
        refused = [r.getMessage() for r in caplog.records if r.name == "client.linkshell"]
        assert len(refused) == 1
        assert f"upstream 127.0.0.1:{upstream[1]} could not be reached" in refused[0]

        upstream_server = await asyncio.start_server(echo, sock=reserved)
        async with upstream_server:
            data, _ = await asyncio.wait_for(round_trip(proxy, b"still here"), HANG_GUARD_S)
    assert data == b"still here"


@pytest.mark.asyncio
async def test_send_paced_waits_for_the_delivery_time() -> None:
    loop = asyncio.get_running_loop()

    def clock_ms() -> float:
        return loop.time() * 1000.0

    link = Link(SLOW, offset_ms=-clock_ms())
    start_ms = clock_ms()
    deliver_ms = await send_paced(link, 4 * 1500, clock_ms)  # 4 packets: at least 30 ms
    assert deliver_ms - start_ms >= 30.0
    assert clock_ms() >= deliver_ms
    assert link.busy_until_ms == deliver_ms


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9000", ("127.0.0.1", 9000)), ("localhost:1", ("localhost", 1))],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected
    assert parse_hostport("[::1]:8080") == ("::1", 8080)
    assert parse_hostport("127.0.0.1:0", any_port=True) == ("127.0.0.1", 0)


@pytest.mark.parametrize("text", ["9000", "127.0.0.1", ":9000", "host:port", "h:0", "h:70000"])
def test_parse_hostport_rejects_in_one_sentence(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_hostport(text)
    assert str(err.value) == (
        f"{text!r}: expected HOST:PORT with a port from 1 to 65535, e.g. 127.0.0.1:9000"
    )
